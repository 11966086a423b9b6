"""A frozen hub is noticed without a deployment: the agent refreshes its TUF metadata on a
schedule, reports a stale or replayed chain to the hub, and is quiet again once the hub
signs fresh metadata.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.serialization import load_pem_private_key
from securesystemslib.signer import CryptoSigner
from tuf.api.metadata import Metadata

from cloud.director import HubDirector
from cloud.grpc_server import start_grpc_server
from cloud.hub import Hub
from cloud.hubcore import HubCore, running
from edge_agent.config import AgentConfig
from edge_agent.wiring import build_agent
from tests.fakes.fake_launcher import PROFILE, FakeLauncher
from tests.support import async_wait_until


def _freeze(home: Path) -> None:
    """Publish a timestamp that expired a minute ago, signed with the real key (a frozen hub)."""
    meta = home / "trust" / "metadata"
    md: Metadata[Any] = Metadata.from_bytes((meta / "timestamp.json").read_bytes())
    md.signed.version += 1
    md.signed.expires = datetime.now(UTC) - timedelta(minutes=1)
    key = load_pem_private_key((home / "trust" / "keys" / "timestamp.pem").read_bytes(), None)
    md.sign(CryptoSigner(key))
    (meta / "timestamp.json").write_bytes(md.to_bytes())


def test_a_frozen_hub_is_reported_by_the_periodic_refresh(tmp_path: Path) -> None:
    hub = Hub.init(tmp_path / "home", insecure=True)
    director = HubDirector(hub.home)

    async def scenario() -> None:
        async with running(HubCore(hub.store, hub.trust, director=director)) as core:
            server, port = await start_grpc_server(core, "127.0.0.1:0")
            config = AgentConfig(
                hub_url=f"grpc://127.0.0.1:{port}",
                device_id="cam-1",
                state_dir=tmp_path / "agent",
                trusted_root=hub.home / "trust" / "metadata" / "root.json",
                director_key=director.public_path,
                metadata_refresh_s=0.2,
            )
            agent = build_agent(config, PROFILE, launcher=FakeLauncher())
            stop = asyncio.Event()
            task = asyncio.create_task(agent.run(stop))
            try:
                await async_wait_until(lambda: agent.transport is not None, 20, "a session")
                _freeze(hub.home)
                stale = ("metadata-stale", "expired")
                await async_wait_until(
                    lambda: agent.security.totals.get(stale, 0) >= 1, 20, "the agent to notice"
                )
                await async_wait_until(
                    lambda: core.security_events.get(stale, 0) >= 1, 20, "the hub to hear of it"
                )
                # The hub signs fresh metadata again: the refreshes stop reporting.
                await asyncio.to_thread(hub.trust.refresh_timestamp)
                await async_wait_until(
                    lambda: (
                        agent.security.totals.get(stale, 0) == core.security_events.get(stale, 0)
                    ),
                    20,
                    "the last report to reach the hub",
                )
                refresh = agent._refresh_metadata
                assert refresh is not None
                await asyncio.to_thread(refresh)  # the chain verifies again: no TrustError
            finally:
                stop.set()
                await task
                await server.stop(None)

    try:
        asyncio.run(scenario())
    finally:
        hub.close()
