"""The console served by uvicorn in the caller's loop: binding rules and the live stream."""

from __future__ import annotations

import asyncio
import contextlib
import json

import httpx
import pytest

from cloud.console.server import start_console
from cloud.errors import ValidationError
from tests.console.world import World


def test_a_non_loopback_bind_without_tls_is_refused(world: World) -> None:
    with pytest.raises(ValidationError, match="without TLS"):
        asyncio.run(start_console(world.fleet, "0.0.0.0:0"))
    with pytest.raises(ValidationError, match="HOST:PORT"):
        asyncio.run(start_console(world.fleet, "nonsense"))
    with pytest.raises(ValidationError, match="both"):
        asyncio.run(start_console(world.fleet, "127.0.0.1:0", tls_cert=world.fleet.home))


async def _read_events(response: httpx.Response, wanted: int, timeout: float) -> list[str]:
    events: list[str] = []

    async def read() -> None:
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                events.append(line.removeprefix("event: "))
            if line.startswith("data: ") and events and events[-1] == "change":
                events[-1] = f"change {json.loads(line.removeprefix('data: '))['id']}"
            if len([e for e in events if e.startswith("change ")]) >= wanted:
                return

    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(read(), timeout)
    return events


def test_the_stream_sends_a_change_after_a_change_and_only_of_the_callers_project(
    world: World,
) -> None:
    async def scenario() -> tuple[list[str], list[str]]:
        server = await start_console(world.fleet, "127.0.0.1:0")
        base = f"http://127.0.0.1:{server.port}/api/v1"
        try:
            async with (
                httpx.AsyncClient(timeout=10) as client,
                client.stream(
                    "GET", f"{base}/events/stream", headers=world.auth("alpha-viewer")
                ) as alpha,
                client.stream(
                    "GET", f"{base}/events/stream", headers=world.auth("beta-viewer")
                ) as beta,
            ):
                assert alpha.headers["content-type"].startswith("text/event-stream")
                await asyncio.sleep(0.3)
                created = await client.post(
                    f"{base}/deployments",
                    json={"skill": "alpha-digits", "version": "1.1.0", "group": "alpha-cams"},
                    headers=world.auth("alpha-operator"),
                )
                assert created.status_code == 201, created.text
                return await asyncio.gather(_read_events(alpha, 1, 5.0), _read_events(beta, 1, 3.0))
        finally:
            await server.stop()

    alpha_events, beta_events = asyncio.run(scenario())
    assert alpha_events[0] == "hello"
    assert any(e.startswith("change ") for e in alpha_events), alpha_events
    assert not any(e.startswith("change") for e in beta_events), beta_events
