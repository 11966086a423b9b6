"""The event loop agents and hubs run on: asyncio's, or uvloop when asked for."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest
import uvloop

from edge_agent import eventloop


async def kind() -> str:
    return type(asyncio.get_running_loop()).__module__.split(".")[0]


@pytest.mark.parametrize("value", ["", "asyncio", " AsyncIO "])
def test_the_standard_loop_unless_uvloop_is_asked_for(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(eventloop.ENV, value)
    assert eventloop.loop_factory() is None and eventloop.loop_name() == "asyncio"
    assert eventloop.run(kind()) == "asyncio"
    monkeypatch.delenv(eventloop.ENV)
    assert eventloop.run(kind()) == "asyncio"


def test_uvloop_when_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(eventloop.ENV, "uvloop")
    assert eventloop.loop_name() == "uvloop"
    assert eventloop.run(kind()) == "uvloop"
    factory = eventloop.loop_factory()
    assert factory is not None
    loop = factory()
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()


def test_a_loop_it_does_not_know_is_refused_before_anything_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(eventloop.ENV, "trio")
    ran: list[bool] = []

    async def main() -> None:
        ran.append(True)

    with pytest.raises(ValueError, match="EDGESKILL_EVENT_LOOP='trio': use uvloop or asyncio"):
        eventloop.run(main())
    assert ran == []


def test_asking_for_uvloop_where_it_is_not_installed_is_refused() -> None:
    # A fresh interpreter in which importing uvloop fails, as on a device without the extra.
    script = (
        "import sys\n"
        "sys.modules['uvloop'] = None\n"
        "from edge_agent import eventloop\n"
        "async def main():\n"
        "    print('ran')\n"
        "try:\n"
        "    eventloop.run(main())\n"
        "except ValueError as exc:\n"
        "    print(exc)\n"
    )
    env = {**os.environ, eventloop.ENV: "uvloop"}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, env=env
    ).stdout.splitlines()
    assert out == [
        "EDGESKILL_EVENT_LOOP=uvloop, but uvloop is not installed (pip install 'edgeskill[fast]')"
    ]


# -- Wake: a flag with a timed wait ------------------------------------------------------------

LOOPS = pytest.mark.parametrize("factory", [None, uvloop.new_event_loop], ids=["asyncio", "uvloop"])


Factory = Callable[[], asyncio.AbstractEventLoop] | None
T = TypeVar("T")


def on_loop(factory: Factory, main: Coroutine[Any, Any, T]) -> T:
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


@LOOPS
def test_a_wake_wait_ends_when_set_and_says_so(factory: Factory) -> None:
    async def main() -> tuple[bool, bool, float, int]:
        wake = eventloop.Wake()
        loop = asyncio.get_running_loop()
        waiters = [asyncio.create_task(wake.wait(30.0)) for _ in range(3)]
        await asyncio.sleep(0)  # all three are asleep on it
        started = loop.time()
        loop.call_later(0.05, wake.set)
        woken = await asyncio.gather(*waiters)
        took = loop.time() - started
        already = await wake.wait(30.0)  # set: no sleep at all
        return all(woken), already, took, len(wake._waiters)

    woken, already, took, left = on_loop(factory, main())
    assert woken and already
    assert took < 10.0  # woken by the set, not by the 30 s timer
    assert left == 0


@LOOPS
def test_a_wake_wait_times_out_false_and_leaves_nothing_behind(factory: Factory) -> None:
    async def main() -> tuple[bool, bool, int, int]:
        wake = eventloop.Wake()
        loop = asyncio.get_running_loop()
        started = loop.time()
        timed_out = await wake.wait(0.05)
        waited = loop.time() - started >= 0.04
        wake.set()
        wake.clear()  # cleared: the next wait sleeps again
        again = await wake.wait(0.01)
        return timed_out, again, waited, len(wake._waiters)

    timed_out, again, waited, left = on_loop(factory, main())
    assert timed_out is False and again is False
    assert waited
    assert left == 0


@LOOPS
def test_a_cancelled_wake_wait_is_cancelled_even_when_set_in_the_same_moment(
    factory: Factory,
) -> None:
    async def main() -> tuple[bool, bool, int]:
        wake = eventloop.Wake()
        alone = asyncio.create_task(wake.wait(30.0))
        racing = asyncio.create_task(wake.wait(30.0))
        await asyncio.sleep(0)
        alone.cancel()
        await asyncio.sleep(0)
        wake.set()  # resolves the racing waiter ...
        racing.cancel()  # ... whose task is cancelled before it resumes
        results = await asyncio.gather(alone, racing, return_exceptions=True)
        cancelled = [isinstance(r, asyncio.CancelledError) for r in results]
        return cancelled[0], cancelled[1], len(wake._waiters)

    alone, racing, left = on_loop(factory, main())
    assert alone and racing  # neither cancellation is swallowed
    assert left == 0
