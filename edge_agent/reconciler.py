"""Level-triggered reconcile: make installed and running skills match the desired state.

A thin executor around the pure rule in :mod:`edge_agent.planner`. Each pass
gathers what is on disk and running, asks :func:`~edge_agent.planner.plan` for
the next steps, carries them out, files what failed, and asks again until
nothing is left to do. An install is: fetch through TUF, verify, unpack into
staging, start the new version from its own folder and health-check it, and
only then switch ``current`` atomically; a version that fails the check (or
takes the agent down) never becomes ``current``, and the previous one is
started again. Old versions beyond ``keep_versions`` are pruned once the
desired one runs.

Fetches run as background tasks beside supervision: while a bundle downloads
(or a stalled hub holds it up until the transport's stall bound), each pass
still restarts crashed skills and reports. Containments (a skill killed by a
watchdog, a limit clamped, a failed health check) go to ``on_event``.

Blocking steps that follow one another (fetch and unpack; stop, start and
switch) share one worker thread (:mod:`edge_agent._install_steps`): thousands of
agents share a simulator's event loop, where a hop costs more than most of the
steps it would carry. This module is the event loop's side that books their outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edge_agent._install_steps import START_ERRORS, fetch_and_unpack, off_loop, switch
from edge_agent.errors import AgentError, InstallError
from edge_agent.installs import InstallStore
from edge_agent.planner import (
    UNKNOWN_GENERATION,
    Action,
    Activate,
    Desired,
    Failure,
    Fetch,
    Installed,
    Prune,
    Remove,
    Rollback,
    Start,
    Wanted,
    freeze_config,
    plan,
)
from edge_agent.sandbox import SkillProcess
from edge_agent.sandbox.launcher import SkillLauncher
from protos import pb
from protos.limits import MAX_ERROR_CHARS, MAX_VARIANT_CHARS
from skills.errors import BundleError, ManifestError, SkillError, TrustError

log = logging.getLogger(__name__)

FetchTarget = Callable[[str], Path]
#: ``on_event(kind, reason, detail, subject)``: a refusal or containment to count and report.
OnEvent = Callable[[str, str, str, str], None]
#: ``on_started(name, version, proc)``: a control process passed its health check and runs.
OnStarted = Callable[[str, str, SkillProcess], None]

RETRY_BASE_S = 3.0
RETRY_MAX_S = 300.0
#: Plan-and-execute rounds in one pass; a full upgrade with a rollback takes six.
MAX_ROUNDS = 8


@dataclass(frozen=True)
class SkillState:
    """What the agent says about one skill in its reports."""

    name: str
    version: str = ""
    state: str = "installing"
    error: str = ""
    desired_version: str = ""
    previous_version: str = ""
    variant: str = ""

    def to_message(self) -> pb.SkillStatus:
        """The state as a wire message."""
        return pb.SkillStatus(
            name=self.name,
            version=self.version,
            state=self.state,
            error=self.error[:MAX_ERROR_CHARS],
            desired_version=self.desired_version,
            previous_version=self.previous_version,
            variant=self.variant[:MAX_VARIANT_CHARS],
        )


def desired_from_message(desired: pb.DesiredState | None) -> Desired | None:
    """The planner's view of a desired-state message (``None`` stays unknown)."""
    if desired is None:
        return None
    skills = tuple(
        Wanted(s.name, s.version, s.target_name, freeze_config(s.config)) for s in desired.skills
    )
    return Desired(desired.generation, skills)


class Reconciler:
    """Owns the installed skills and their control processes.

    Args:
        installs: The install store of the agent's state folder.
        fetch_target: Fetches a bundle by TUF target name and returns its verified file.
        launcher: Starts an installed version and health-checks it.
        on_change: Called whenever a skill's reported state changes.
        clock: Monotonic seconds, for fetch backoff.
        keep_versions: Versions of each skill kept on disk (current and previous first).
        on_event: Told of every containment: ``("sandbox", reason, detail, "name version")``.
        supervise_s: Longest a pass waits for a background fetch before it returns.
        on_fetched: Told when a background fetch ends, done or failed, so that a fetch
            that outlasted its pass's ``supervise_s`` is acted on at once (the caller
            runs a pass) rather than at the next periodic one.
        on_started: Told of every control process that starts running (split inference
            attaches to it); ``on_stopped(name)`` of every one stopped.
        on_stopped: See ``on_started``.
    """

    def __init__(
        self,
        installs: InstallStore,
        fetch_target: FetchTarget,
        launcher: SkillLauncher,
        on_change: Callable[[], None],
        *,
        clock: Callable[[], float] = time.monotonic,
        keep_versions: int = 2,
        on_event: OnEvent | None = None,
        supervise_s: float = 1.0,
        on_started: OnStarted | None = None,
        on_stopped: Callable[[str], None] | None = None,
        on_fetched: Callable[[], None] | None = None,
    ) -> None:
        if keep_versions < 1:
            raise ValueError(f"keep_versions must be at least 1, got {keep_versions}")
        self.installs = installs
        self.fetch_target = fetch_target
        self.launcher = launcher
        self.on_change = on_change
        self.clock = clock
        self.keep_versions = keep_versions
        self.processes: dict[str, SkillProcess] = {}
        self._on_started = on_started
        self._on_stopped = on_stopped
        self._on_fetched = on_fetched
        self.states: dict[str, SkillState] = {}
        self._process_versions: dict[str, str] = {}
        self._failures: dict[tuple[str, str], Failure] = {}
        self._fetch_tries: dict[tuple[str, str], int] = {}
        self._generation = UNKNOWN_GENERATION
        self.on_event: OnEvent = on_event or (lambda _k, _r, _d, _s: None)
        self.supervise_s = supervise_s
        self._fetches: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._reported_deaths: set[int] = set()
        #: What the last pass that found nothing to do saw (see :meth:`_still_quiet`).
        self._quiet: _Quiet | None = None

    async def reconcile(self, desired: pb.DesiredState | None) -> None:
        """One pass. ``None`` means the hub's wishes are unknown: keep what is installed.

        Raises:
            InstallError: A skill that is no longer wanted cannot be removed, or the
                install folders cannot be read.
        """
        if self._still_quiet(desired):
            return
        self._quiet = None
        wanted = desired_from_message(desired)
        generation = UNKNOWN_GENERATION if wanted is None else wanted.generation
        if generation != self._generation:  # a new desired state: every version may be tried
            self._failures.clear()
            self._fetch_tries.clear()
            self._generation = generation
        for _ in range(MAX_ROUNDS):
            self._report_deaths()
            installed = await self._inventory()
            actions = [
                a
                for a in plan(
                    wanted,
                    installed.values(),
                    self._failures.values(),
                    self.clock(),
                    keep_versions=self.keep_versions,
                )
                if not self._fetching(a)
            ]
            if not actions:
                self._settle(wanted)
                if await self._await_a_fetch():
                    continue
                self._quiet = self._quiet_now(desired)
                return
            for action in actions:
                await self._execute(action, installed.get(action.name), wanted)

    def _quiet_now(self, desired: pb.DesiredState | None) -> _Quiet | None:
        """What a pass that found nothing to do saw, if the next one may rely on it.

        Not while a fetch still runs (:meth:`_await_a_fetch` gives up waiting on it
        after ``supervise_s``; a failed one is filed as it ends), nor while a failure
        waits for its retry time: the rule's answer then changes with the clock alone.
        """
        scan = self.installs.cached_inventory()
        if scan is None or self._fetches:
            return None
        if any(math.isfinite(f.retry_at) for f in self._failures.values()):
            return None
        return _Quiet(desired, scan, tuple(self.processes.items()))

    def _still_quiet(self, desired: pb.DesiredState | None) -> bool:
        """Whether this pass would find nothing to do, as the last one found.

        The rule's inputs are the desired state, the scan of the install folders,
        the control processes and the failures: the same message, the same scan
        (kept by the store while nothing changed on disk and it is fresh, see
        :meth:`InstallStore.inventory`), the same processes all alive and no retry
        due give the same empty answer. A periodic pass of an idle agent then costs
        a few identity checks, not a parse, a plan and a report check (a sixth of an
        idle simulated fleet's CPU, 2,000 agents in one process).
        """
        quiet = self._quiet
        if quiet is None or desired is not quiet.desired:
            return False
        if self.installs.cached_inventory() is not quiet.scan:
            return False
        procs = self.processes
        if len(procs) != len(quiet.processes):
            return False
        for name, kept in quiet.processes:
            if procs.get(name) is not kept or not kept.alive:
                return False
        return True

    def _settle(self, wanted: Desired | None) -> None:
        """Say ``running`` for each skill that runs the version wanted now.

        A skill whose new version was still downloading when the hub took it back
        (a rollout rolled back) needs no action, so without this it would stay
        ``installing`` a version nobody wants, and the hub would never hear that
        the device is back where it should be.
        """
        for name, proc in self.running().items():
            version = self._process_versions.get(name, "")
            state = self.states.get(name)
            want = _wanted_version(wanted, name, version)
            if state is None or not version or version != want:
                continue
            if (state.version, state.state, state.desired_version) != (version, "running", want):
                previous = state.previous_version if state.version == version else state.version
                self._set(SkillState(name, version, "running", "", want, previous, _variant(proc)))

    def _fetching(self, action: Action) -> bool:
        task = self._fetches.get((action.name, getattr(action, "version", "")))
        return isinstance(action, Fetch) and task is not None and not task.done()

    async def _await_a_fetch(self) -> bool:
        """Wait up to ``supervise_s`` for a background fetch; whether one finished."""
        for key in [k for k, t in self._fetches.items() if t.done()]:
            del self._fetches[key]
        if not self._fetches:
            return False
        done, _ = await asyncio.wait(
            self._fetches.values(), timeout=self.supervise_s, return_when=asyncio.FIRST_COMPLETED
        )
        return bool(done)

    def _report_deaths(self) -> None:
        """Report each control process that died since the last pass, with the reason."""
        for name, proc in list(self.processes.items()):
            if id(proc) in self._reported_deaths or proc.alive:
                continue
            self._reported_deaths.add(id(proc))
            reason = getattr(proc, "kill_reason", None)
            kind = _death_kind(reason)
            subject = f"{name} {self._process_versions.get(name, '')}".strip()
            log.warning("skill %s stopped: %s", subject, reason or "crashed")
            self.on_event("sandbox", kind, reason or "the control process exited", subject)

    async def _inventory(self) -> dict[str, Installed]:
        # The store reuses its last scan while nothing changed (no thread hop then).
        on_disk = self.installs.cached_inventory()
        if on_disk is None:
            on_disk = await asyncio.to_thread(self.installs.inventory)
        found: dict[str, Installed] = {}
        running = self.running()
        for skill in on_disk:
            current = skill.active
            found[skill.name] = Installed(
                skill.name,
                current.version if current else None,
                current.previous if current else None,
                skill.versions,
                current is not None
                and skill.name in running
                and self._process_versions.get(skill.name) == current.version,
            )
        return found

    async def _execute(
        self, action: Action, skill: Installed | None, wanted: Desired | None
    ) -> None:
        current = skill.current if skill is not None else None
        previous = skill.previous if skill is not None else None
        want = _wanted_version(wanted, action.name, current)
        match action:
            case Fetch():
                key = (action.name, action.version)
                task = asyncio.create_task(self._fetch(action, current or ""))
                if self._on_fetched is not None:
                    on_fetched = self._on_fetched
                    task.add_done_callback(lambda _task: on_fetched())
                self._fetches[key] = task
            case Activate():
                await self._activate(action, current or "", want)
            case Start():
                await self._start(action, want, previous or "")
            case Rollback():
                await self._roll_back(action, want)
            case Remove():
                await self._remove(action.name)
            case Prune():
                await self._prune(action)

    async def _fetch(self, action: Fetch, current: str) -> None:
        name, version = action.name, action.version
        self._set(SkillState(name, current, "installing", "", version, current))
        try:
            await off_loop(
                functools.partial(fetch_and_unpack, self.installs, self.fetch_target, action)
            )
        except (SkillError, AgentError) as exc:
            # The version that runs now keeps running; the failure is reported.
            self._retry_later(name, version)
            self._set(SkillState(name, current, "failed", str(exc), version, current))
            refused = exc if isinstance(exc, SkillError) else exc.__cause__
            if isinstance(refused, (TrustError, BundleError, ManifestError)):  # not a fault of
                reason = "trust" if isinstance(refused, TrustError) else "bundle"  # the network
                self.on_event("install-refused", reason, str(exc), f"{name} {version}")
        except Exception as exc:  # a background task: nobody else would see it
            log.exception("fetching %s %s failed unexpectedly", name, version)
            self._retry_later(name, version)
            self._set(SkillState(name, current, "failed", repr(exc), version, current))

    async def _activate(self, action: Activate, current: str, want: str) -> None:
        """Start the unpacked version from its folder; switch ``current`` only if healthy."""
        name, version = action.name, action.version
        old = self._forget(name)
        outcome = await off_loop(
            functools.partial(switch, self.installs, self.launcher, old, action)
        )
        if outcome.unhealthy is not None:
            self._activation_failed(name, version, current, want, str(outcome.unhealthy))
        elif outcome.not_switched is not None:
            self._retry_later(name, version)
            self._set(
                SkillState(name, current, "failed", str(outcome.not_switched), version, current)
            )
        elif outcome.proc is not None:
            self._started(name, version, outcome.proc, want, current)

    def _activation_failed(
        self, name: str, version: str, current: str, want: str, error: str
    ) -> None:
        """``current`` never moved: the old version is started again by the next round."""
        self._failures[(name, version)] = Failure(name, version, self._generation, math.inf)
        log.warning("skill %s %s failed its health check: %s", name, version, error[-300:])
        self.on_event("sandbox", "health_check", error[-MAX_ERROR_CHARS:], f"{name} {version}")
        if current:
            self._set(SkillState(name, current, "rolled_back", error, want, version))
        else:
            self._set(SkillState(name, "", "failed", error, want, ""))

    def _started(
        self, name: str, version: str, proc: SkillProcess, want: str, previous: str
    ) -> None:
        self.processes[name] = proc
        self._process_versions[name] = version
        if self._on_started is not None:
            self._on_started(name, version, proc)
        for note in getattr(proc, "limit_notes", ()):
            self.on_event("sandbox", "clamped", note, f"{name} {version}")
        if version == want:
            self._set(SkillState(name, version, "running", "", want, previous, _variant(proc)))

    async def _start(self, action: Start, want: str, previous: str) -> None:
        name, version = action.name, action.version
        current = await asyncio.to_thread(self.installs.current, name)
        if current is None or current.version != version:
            return  # changed under us; the next round sees it
        try:
            proc = await asyncio.to_thread(self.launcher, current.path, dict(action.config))
        except START_ERRORS as exc:
            self._health_failed(name, version, want, str(exc))
            return
        self._started(name, version, proc, want, previous)

    def _health_failed(self, name: str, version: str, want: str, error: str) -> None:
        self._failures[(name, version)] = Failure(name, version, self._generation, math.inf)
        log.warning(
            "skill %s %s failed its health check: %s", name, version, error.splitlines()[-1:]
        )
        state = self.states.get(name)
        if version == want or state is None:
            self._set(SkillState(name, "", "failed", error, want, ""))
        else:  # the version kept while the wanted one may not be tried
            self._set(
                dataclasses.replace(
                    state, error=f"{state.error}\nprevious version {version} failed too: {error}"
                )
            )

    async def _roll_back(self, action: Rollback, want: str) -> None:
        name = action.name
        state = self.states.get(name)
        error = state.error if state is not None else ""
        await self._stop(name)
        try:
            restored = await asyncio.to_thread(self.installs.rollback, name)
        except InstallError as exc:
            self._set(SkillState(name, "", "failed", f"{error}\n{exc}".strip(), want, ""))
            return
        self._set(SkillState(name, restored, "rolled_back", error, want, action.failed))

    async def _prune(self, action: Prune) -> None:
        try:
            await asyncio.to_thread(self.installs.prune, action.name, action.keep)
        except InstallError as exc:
            log.warning("cannot prune old versions of %s: %s", action.name, exc)

    def _retry_later(self, name: str, version: str) -> None:
        key = (name, version)
        tries = self._fetch_tries[key] = self._fetch_tries.get(key, 0) + 1
        delay = min(RETRY_MAX_S, RETRY_BASE_S * 2 ** (tries - 1))
        self._failures[key] = Failure(name, version, self._generation, self.clock() + delay)

    async def _stop(self, name: str) -> None:
        proc = self._forget(name)
        if proc is not None:
            await asyncio.to_thread(proc.stop)

    def _forget(self, name: str) -> SkillProcess | None:
        """Drop ``name``'s control process from the books; the caller stops it."""
        proc = self.processes.pop(name, None)
        self._process_versions.pop(name, None)
        if self._on_stopped is not None:
            self._on_stopped(name)
        return proc

    async def _remove(self, name: str) -> None:
        await self._stop(name)
        await asyncio.to_thread(self.installs.remove_skill, name)
        if self.states.pop(name, None) is not None:
            self.on_change()

    async def shutdown(self) -> None:
        """Cancel background fetches and stop every control process."""
        for task in self._fetches.values():
            task.cancel()
        for task in self._fetches.values():
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._fetches.clear()
        for name in list(self.processes):
            await self._stop(name)

    def _set(self, state: SkillState) -> None:
        if self.states.get(state.name) != state:
            self.states[state.name] = state
            self.on_change()

    def report(self, generation: int) -> pb.ReportedState:
        """The report of every skill's state for ``generation``."""
        msg = pb.ReportedState(generation=generation)
        msg.skills.extend(
            s.to_message() for s in sorted(self.states.values(), key=lambda s: s.name)
        )
        return msg

    def running(self) -> dict[str, SkillProcess]:
        """Control processes that are alive, by skill name."""
        return {n: p for n, p in self.processes.items() if p.alive}

    def version_of(self, name: str) -> str:
        """Version the agent reports as active for ``name``."""
        state = self.states.get(name)
        return state.version if state else ""


@dataclass(frozen=True)
class _Quiet:
    """A pass that found nothing to do: its desired message, inventory scan and processes."""

    desired: pb.DesiredState | None
    scan: tuple[object, ...]
    processes: tuple[tuple[str, SkillProcess], ...]


def _variant(proc: SkillProcess) -> str:
    """The model variants a running skill loaded, as its report shows them."""
    return ", ".join(f"{k}={v}" for k, v in sorted(proc.models.items()))


def _death_kind(reason: str | None) -> str:
    """The event reason for a control process that died, from the watchdog's word."""
    if reason is None:
        return "crashed"
    return "memory" if "memory" in reason else "busy_loop" if "busy" in reason else "killed"


def _wanted_version(wanted: Desired | None, name: str, current: str | None) -> str:
    """The version the hub wants for ``name``; the active one while its wishes are unknown."""
    if wanted is None:
        return current or ""
    spec = max((s for s in wanted.skills if s.name == name), default=None)  # as the planner
    return spec.version if spec is not None else ""


__all__ = ["FetchTarget", "OnEvent", "Reconciler", "SkillState", "desired_from_message"]
