"""Worker-thread hops of an install, and the error paths of the steps that share one.

A simulator worker runs thousands of agents on one event loop, where each hop
to a worker thread costs more than the small blocking step it carries. These
tests count the hops of an upgrade through the loop's default executor, and
check that the steps run together on one thread still fail, report and stop
processes as they did one hop each.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from edge_agent import reconciler as reconciler_module
from edge_agent.errors import HealthCheckError, InstallError
from edge_agent.installs import InstallStore
from edge_agent.reconciler import Reconciler
from skills.errors import FetchError
from tests.support import async_wait_until
from tests.support.desired import desired_state


class CountingExecutor(ThreadPoolExecutor):
    """The loop's default executor, counting what is handed to it."""

    def __init__(self) -> None:
        super().__init__(max_workers=2)
        self.submitted = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.submitted += 1
        return super().submit(fn, *args, **kwargs)


@dataclass
class Proc:
    """A control process that is only a flag."""

    version: str
    alive: bool = True
    models: dict[str, str] = field(default_factory=dict)

    def stop(self, timeout: float = 5.0) -> None:
        self.alive = False


class Launcher:
    """Starts a :class:`Proc` for a version folder; ``unhealthy`` versions fail."""

    def __init__(self, unhealthy: frozenset[str] = frozenset()) -> None:
        self.unhealthy = unhealthy
        self.started: list[Proc] = []

    def __call__(self, skill_dir: Path, config: Mapping[str, str]) -> Proc:
        if skill_dir.name in self.unhealthy:
            raise HealthCheckError(f"{skill_dir.name} does not answer")
        proc = Proc(skill_dir.name)
        self.started.append(proc)
        return proc


class StuckSwitch(InstallStore):
    """An install store whose ``current`` link cannot be switched to ``stuck``."""

    stuck = "2.0.0"

    def activate(self, name: str, version: str) -> None:
        if version == self.stuck:
            raise InstallError(f"cannot activate {name} {version}: read-only file system")
        super().activate(name, version)


def unpack_fake(bundle: Path, dest: Path) -> None:
    dest.mkdir()
    (dest / "skill.toml").write_text(bundle.name, encoding="utf-8")


def make(
    tmp_path: Path,
    launcher: Launcher,
    store: type[InstallStore] = InstallStore,
    fetch: Callable[[str], Path] | None = None,
) -> Reconciler:
    def fetch_bundle(target: str) -> Path:
        return tmp_path / target.replace("/", "-")

    return Reconciler(
        store(tmp_path / "installs", unpack_fake),
        fetch or fetch_bundle,
        launcher,  # type: ignore[arg-type]
        lambda: None,
        clock=lambda: 0.0,
        supervise_s=30.0,
    )


def state(rec: Reconciler) -> tuple[str, str, str]:
    s = rec.states["demo"]
    return s.version, s.state, s.desired_version


def test_an_upgrade_takes_one_thread_hop_to_fetch_and_one_to_switch(tmp_path: Path) -> None:
    launcher = Launcher()
    rec = make(tmp_path, launcher)

    async def scenario() -> int:
        executor = CountingExecutor()
        asyncio.get_running_loop().set_default_executor(executor)
        await rec.reconcile(desired_state("demo", 1, "1.0.0"))
        before = executor.submitted
        await rec.reconcile(desired_state("demo", 2, "2.0.0"))
        hops = executor.submitted - before
        assert state(rec) == ("2.0.0", "running", "2.0.0")
        assert [p.alive for p in launcher.started] == [False, True]
        await rec.shutdown()
        return hops

    # Fetch and unpack on one thread, the old process's stop, the start and the
    # switch on another; each thread scans the installs again for the next pass.
    assert asyncio.run(scenario()) == 2


def test_a_version_that_fails_its_start_rolls_back_from_the_shared_thread(
    tmp_path: Path,
) -> None:
    launcher = Launcher(unhealthy=frozenset({"2.0.0"}))
    rec = make(tmp_path, launcher)

    async def scenario() -> None:
        await rec.reconcile(desired_state("demo", 1, "1.0.0"))
        await rec.reconcile(desired_state("demo", 2, "2.0.0"))
        assert state(rec) == ("1.0.0", "rolled_back", "2.0.0")
        assert "does not answer" in rec.states["demo"].error
        assert rec.installs.current("demo").version == "1.0.0"  # type: ignore[union-attr]
        assert [p.version for p in rec.running().values()] == ["1.0.0"]
        await rec.shutdown()

    asyncio.run(scenario())


def test_a_switch_that_fails_stops_the_new_process_and_retries_later(tmp_path: Path) -> None:
    launcher = Launcher()
    rec = make(tmp_path, launcher, StuckSwitch)

    async def scenario() -> None:
        await rec.reconcile(desired_state("demo", 1, "1.0.0"))
        await rec.reconcile(desired_state("demo", 2, "2.0.0"))
        version, st, want = state(rec)
        assert (version, st, want) == ("1.0.0", "failed", "2.0.0")
        assert "read-only file system" in rec.states["demo"].error
        started_2 = [p for p in launcher.started if p.version == "2.0.0"]
        assert started_2 and not any(p.alive for p in started_2)
        assert ("demo", "2.0.0") in rec._failures  # backoff, not given up for good
        await rec.shutdown()

    asyncio.run(scenario())


def test_a_fetch_cancelled_while_it_downloads_unpacks_nothing(tmp_path: Path) -> None:
    release = threading.Event()
    entered = threading.Event()

    def slow_fetch(target: str) -> Path:
        entered.set()
        release.wait(10.0)
        return tmp_path / target.replace("/", "-")

    rec = make(tmp_path, Launcher(), fetch=slow_fetch)
    rec.supervise_s = 0.01

    async def scenario() -> None:
        await rec.reconcile(desired_state("demo", 1, "1.0.0"))
        await asyncio.to_thread(entered.wait, 10.0)
        await rec.shutdown()  # cancels the fetch while its thread still downloads
        release.set()

    asyncio.run(scenario())  # waits for the fetch's thread, which must stop after the fetch
    assert not rec.installs.is_installed("demo", "1.0.0")


class PlanCalls:
    """The planner, counting its calls (the rule itself runs unchanged)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = reconciler_module.plan

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(reconciler_module, "plan", counted)


def test_a_pass_that_would_find_what_the_last_found_plans_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    launcher = Launcher()
    rec = make(tmp_path, launcher)
    planner = PlanCalls(monkeypatch)

    async def scenario() -> None:
        wanted = desired_state("demo", 1, "1.0.0")
        await rec.reconcile(wanted)
        assert state(rec) == ("1.0.0", "running", "1.0.0")
        planned = planner.calls
        for _ in range(3):  # the agent's periodic passes of an idle device
            await rec.reconcile(wanted)
        assert planner.calls == planned
        assert len(launcher.started) == 1

        # The same wishes in a new message (a resent desired state) are looked at again.
        await rec.reconcile(desired_state("demo", 1, "1.0.0"))
        assert planner.calls == planned + 1
        await rec.shutdown()

    asyncio.run(scenario())


def test_a_death_a_new_scan_or_a_due_retry_ends_the_quiet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    launcher = Launcher()
    now = [0.0]
    fail = [True]

    def fetch(target: str) -> Path:
        if target == "demo/2.0.0" and fail[0]:
            raise FetchError("hub gone")
        return tmp_path / target.replace("/", "-")

    rec = make(tmp_path, launcher, fetch=fetch)
    rec.clock = lambda: now[0]
    planner = PlanCalls(monkeypatch)

    async def scenario() -> None:
        first = desired_state("demo", 1, "1.0.0")
        await rec.reconcile(first)
        await rec.reconcile(first)

        # The control process died: the next pass restarts it.
        launcher.started[-1].alive = False
        await rec.reconcile(first)
        assert [p.alive for p in launcher.started] == [False, True]
        planned = planner.calls
        await rec.reconcile(first)
        assert planner.calls == planned

        # The store scanned its folders again (its scan aged out, or something changed there).
        rec.installs.inventory(max_age_s=0.0)
        await rec.reconcile(first)
        assert planner.calls > planned

        # A fetch that failed waits for its retry time, which the clock alone brings.
        second = desired_state("demo", 2, "2.0.0")
        await rec.reconcile(second)
        assert state(rec) == ("1.0.0", "failed", "2.0.0")
        fail[0] = False
        await rec.reconcile(second)  # inside the backoff: still failed
        assert state(rec) == ("1.0.0", "failed", "2.0.0")
        now[0] += 3600.0
        await rec.reconcile(second)
        assert state(rec) == ("2.0.0", "running", "2.0.0")
        await rec.shutdown()

    asyncio.run(scenario())


def test_a_fetch_that_outlasts_its_pass_and_fails_is_retried_when_due(tmp_path: Path) -> None:
    release = threading.Event()
    fail = [True]
    now = [0.0]

    def fetch(target: str) -> Path:
        if target == "demo/2.0.0":
            release.wait(10.0)
            if fail[0]:
                raise FetchError("hub gone")
        return tmp_path / target.replace("/", "-")

    rec = make(tmp_path, Launcher(), fetch=fetch)
    rec.clock = lambda: now[0]

    async def scenario() -> None:
        await rec.reconcile(desired_state("demo", 1, "1.0.0"))
        second = desired_state("demo", 2, "2.0.0")
        rec.supervise_s = 0.01
        await rec.reconcile(second)  # returns with the download still running
        release.set()
        await async_wait_until(lambda: state(rec)[1] == "failed", 10, "the fetch to fail")
        fail[0] = False
        now[0] += 3600.0  # its retry is due: the same wishes must be looked at again
        rec.supervise_s = 30.0
        await rec.reconcile(second)
        assert state(rec) == ("2.0.0", "running", "2.0.0")
        await rec.shutdown()

    asyncio.run(scenario())
