"""The control-loop host: named loops, restarts with backoff, leader-only loops."""

from __future__ import annotations

import asyncio
import itertools
import logging

import pytest

from cloud.loops import Backoff, LoopFactory, LoopHost, periodic
from tests.support import async_wait_until


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class RecordingSleep:
    """Records each backoff the host asks for, and returns at once."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay_s: float) -> None:
        self.delays.append(delay_s)
        await asyncio.sleep(0)


def state_of(host: LoopHost, name: str) -> tuple[bool, int, int, str]:
    (state,) = [s for s in host.states() if s.name == name]
    return state.running, state.failures, state.restarts, state.last_error


async def forever() -> None:
    await asyncio.Event().wait()


def test_backoff_doubles_up_to_the_cap_and_is_checked() -> None:
    backoff = Backoff(initial_s=1.0, cap_s=5.0, factor=2.0)
    delays = [1.0]
    for _ in range(4):
        delays.append(backoff.next_delay(delays[-1]))
    assert delays == [1.0, 2.0, 4.0, 5.0, 5.0]
    with pytest.raises(ValueError, match="inconsistent backoff"):
        Backoff(initial_s=2.0, cap_s=1.0)
    with pytest.raises(ValueError, match="inconsistent backoff"):
        Backoff(factor=0.5)


def test_a_failing_loop_is_restarted_with_growing_backoff_logged_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sleep = RecordingSleep()
    host = LoopHost(backoff=Backoff(initial_s=1.0, cap_s=4.0), clock=FakeClock(), sleep=sleep)
    calls = 0

    async def flaky() -> None:
        nonlocal calls
        calls += 1
        if calls <= 4:
            raise RuntimeError(f"boom {calls}")
        await forever()

    async def main() -> tuple[bool, int, int, str]:
        host.add("flaky", flaky)
        host.start()
        await async_wait_until(lambda: state_of(host, "flaky")[0], 5.0, "the fifth run")
        try:
            return state_of(host, "flaky")
        finally:
            await host.stop()

    with caplog.at_level(logging.ERROR, logger="cloud.loops"):
        running, failures, restarts, last_error = asyncio.run(main())
    assert (running, failures, restarts, last_error) == (True, 4, 4, "RuntimeError: boom 4")
    assert sleep.delays == [1.0, 2.0, 4.0, 4.0]
    failed = [r.getMessage() for r in caplog.records if r.name == "cloud.loops"]
    assert failed == [
        "loop flaky failed: RuntimeError: boom 1; restarting in 1.0 s",
        "loop flaky failed: RuntimeError: boom 2; restarting in 2.0 s",
        "loop flaky failed: RuntimeError: boom 3; restarting in 4.0 s",
        "loop flaky failed: RuntimeError: boom 4; restarting in 4.0 s",
    ]
    assert not any(s.running for s in host.states())


def test_the_backoff_resets_after_a_loop_ran_fine_for_a_while() -> None:
    sleep = RecordingSleep()
    clock = FakeClock()
    host = LoopHost(
        backoff=Backoff(initial_s=1.0, cap_s=30.0, reset_after_s=60.0), clock=clock, sleep=sleep
    )
    runs = 0

    async def fails_at_once_then_late() -> None:
        nonlocal runs
        runs += 1
        if runs == 3:
            clock.now += 61.0  # this run lasted longer than reset_after_s
        if runs <= 4:
            raise OSError("disk gone")
        await forever()

    async def main() -> None:
        host.add("refresh", fails_at_once_then_late)
        host.start()
        await async_wait_until(lambda: state_of(host, "refresh")[0], 5.0, "the fifth run")
        await host.stop()

    asyncio.run(main())
    assert sleep.delays == [1.0, 2.0, 1.0, 2.0]


def test_a_loop_that_returns_is_restarted_as_a_failure() -> None:
    sleep = RecordingSleep()
    host = LoopHost(backoff=Backoff(initial_s=0.5), sleep=sleep)
    runs = 0

    async def quits() -> None:
        nonlocal runs
        runs += 1
        if runs > 2:
            await forever()

    async def main() -> tuple[bool, int, int, str]:
        host.add("quits", quits)
        host.start()
        await async_wait_until(lambda: runs == 3, 5.0, "the third run")
        try:
            return state_of(host, "quits")
        finally:
            await host.stop()

    assert asyncio.run(main()) == (True, 2, 2, "returned (a loop must run until cancelled)")


def test_leader_only_loops_run_only_while_leading() -> None:
    host = LoopHost()
    started: list[str] = []
    cancelled: list[str] = []

    def tracked(name: str) -> LoopFactory:
        async def run() -> None:
            started.append(name)
            try:
                await forever()
            except asyncio.CancelledError:
                cancelled.append(name)
                raise

        return run

    async def main() -> list[tuple[str, bool]]:
        host.add("notifier", tracked("notifier"))
        host.add("rollout", tracked("rollout"), leader_only=True)
        host.start()
        await async_wait_until(lambda: started == ["notifier"], 5.0, "the every-process loop")
        assert not host.is_leader
        await host.set_leader(True)
        await async_wait_until(lambda: started == ["notifier", "rollout"], 5.0, "the leader loop")
        await host.set_leader(False)  # returns once the leader loop has ended
        assert cancelled == ["rollout"]
        running = [(s.name, s.running) for s in host.states()]
        await host.set_leader(True)
        await async_wait_until(lambda: started.count("rollout") == 2, 5.0, "a second term")
        await host.stop()
        return running

    running = asyncio.run(main())
    assert running == [("notifier", True), ("rollout", False)]
    assert sorted(cancelled) == ["notifier", "rollout", "rollout"]
    assert not host.is_leader


def test_a_leader_elected_before_start_runs_its_loops_at_start() -> None:
    host = LoopHost()
    ran = asyncio.Event()

    async def rollout() -> None:
        ran.set()
        await forever()

    async def main() -> None:
        host.add("rollout", rollout, leader_only=True)
        await host.set_leader(True)
        assert not ran.is_set()
        host.start()
        await asyncio.wait_for(ran.wait(), 5.0)
        await host.stop()

    asyncio.run(main())


def test_names_are_unique_and_loops_are_added_before_start() -> None:
    host = LoopHost()
    host.add("a", forever)
    with pytest.raises(ValueError, match="empty or taken"):
        host.add("a", forever)
    with pytest.raises(ValueError, match="empty or taken"):
        host.add("", forever)

    async def main() -> None:
        host.start()
        with pytest.raises(ValueError, match="has started"):
            host.add("b", forever)
        with pytest.raises(RuntimeError, match="started already"):
            host.start()
        await host.stop()

    asyncio.run(main())


def test_periodic_runs_its_step_every_interval_until_cancelled() -> None:
    stamps: list[float] = []

    async def step() -> None:
        stamps.append(asyncio.get_running_loop().time())

    async def main() -> None:
        host = LoopHost()
        host.add("tick", periodic(step, 0.05, first_now=True))
        host.start()
        await async_wait_until(lambda: len(stamps) >= 3, 5.0, "three ticks")
        await host.stop()

    asyncio.run(main())
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    assert all(gap >= 0.045 for gap in gaps)
    with pytest.raises(ValueError, match="positive interval"):
        periodic(step, 0)


def test_periodic_waits_one_interval_before_the_first_step_by_default() -> None:
    stamps: list[float] = []

    async def step() -> None:
        stamps.append(asyncio.get_running_loop().time())

    async def main() -> float:
        began = asyncio.get_running_loop().time()
        host = LoopHost()
        host.add("tick", periodic(step, 0.1))
        host.start()
        await async_wait_until(lambda: len(stamps) >= 1, 5.0, "the first tick")
        await host.stop()
        return began

    began = asyncio.run(main())
    assert stamps[0] - began >= 0.095
