"""The event loop agents and hubs run on: asyncio's, or uvloop when asked for."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

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
