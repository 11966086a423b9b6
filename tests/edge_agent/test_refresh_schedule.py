"""The agent's periodic TUF refresh counts from the chain's last verification, and its
waits (the refresh period, the reconnect backoff) are drawn short of their bound.

A download verifies the hub's metadata chain as a refresh does, so a device that
has just installed (a fleet in the middle of an upgrade) is not due a refresh
until a whole period after that download; one that has not verified for a
period refreshes at once.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import cast

from edge_agent.agent import Agent, jittered
from edge_agent.config import AgentConfig
from edge_agent.transport import AgentTransport
from edge_agent.wiring import build_agent
from skills.trust import TrustRepository
from tests.fakes.fake_launcher import PROFILE, FakeLauncher
from tests.support import async_wait_until


def _agent(tmp_path: Path, device: str, refresh_s: float = 300.0) -> Agent:
    """An agent of ``device`` trusting a repository in ``tmp_path`` (made once)."""
    root = tmp_path / "trust" / "metadata" / "root.json"
    if not root.exists():
        TrustRepository.init(tmp_path / "trust")
    settings = AgentConfig(
        "grpc://127.0.0.1:9",
        device,
        tmp_path / device,
        trusted_root=root,
        metadata_refresh_s=refresh_s,
    )
    return build_agent(settings, PROFILE, launcher=FakeLauncher())


def test_the_refresh_waits_a_period_from_the_last_verification_whoever_made_it(
    tmp_path: Path,
) -> None:
    agent = _agent(tmp_path, "cam-1", refresh_s=0.3)
    every = agent.config.metadata_refresh_s
    refreshes: list[float] = []
    asked: list[float] = []
    age: list[float | None] = [0.0]  # the chain as a download just left it

    def metadata_age() -> float | None:
        asked.append(age[0] or 0.0)
        return age[0]

    agent._refresh_metadata = lambda: refreshes.append(1.0)
    agent._metadata_age = metadata_age
    agent.link.transport = cast(AgentTransport, object())  # a session is up

    async def scenario() -> None:
        task = asyncio.create_task(agent._refresh_loop())
        try:
            # Downloads keep verifying the chain: the loop looks, and refreshes nothing.
            await async_wait_until(lambda: len(asked) >= 4, 10, "the loop to look 4 times")
            assert refreshes == []
            age[0] = every  # a whole period since the last download
            await async_wait_until(lambda: len(refreshes) >= 1, 10, "a refresh")
            age[0] = None  # never verified (a failed first refresh): due as well
            await async_wait_until(lambda: len(refreshes) >= 2, 10, "another refresh")
        finally:
            task.cancel()

    try:
        asyncio.run(scenario())
    finally:
        agent.outbox.close()


def test_waits_are_drawn_short_of_their_bound_and_differ_between_devices(
    tmp_path: Path,
) -> None:
    rng = random.Random(7)
    draws = [jittered(300.0, 0.1, rng) for _ in range(2000)]
    assert all(270.0 <= d <= 300.0 for d in draws)  # never longer than the period
    assert min(draws) < 273.0 and max(draws) > 297.0  # spread over all of the share
    backoffs = [jittered(8.0, 0.5, rng) for _ in range(2000)]
    assert all(4.0 <= b <= 8.0 for b in backoffs) and max(backoffs) - min(backoffs) > 3.5
    # Each agent draws its own: a fleet that lost its hub together comes back spread out.
    agents = [_agent(tmp_path, f"cam-{i}") for i in range(2)]
    try:
        first, second = (jittered(8.0, 0.5, a._rng) for a in agents)
        assert first != second
    finally:
        for agent in agents:
            agent.outbox.close()
