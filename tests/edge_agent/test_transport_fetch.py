"""Bulk fetches: caps, resume, deadline and minimum rate; the real gRPC transport on loopback."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from cloud.grpc_server import start_grpc_server
from cloud.hubcore import HubCore, running
from cloud.store import open_store
from edge_agent.errors import TransportError
from edge_agent.transport import FetchAborted, FetchLimits, open_transport
from protos import kind_of, make_envelope, pb
from skills.trust import TrustRepository
from tests.fakes.scripted_transport import ScriptedTransport

DATA = os.urandom(200_000)


def test_fetch_resumes_from_where_it_broke() -> None:
    t = ScriptedTransport(DATA, fail_after=50_000)
    assert asyncio.run(t.fetch("targets/x", 10**6)) == DATA
    assert t.offsets == [0, 50_176]


def test_a_busy_hub_is_asked_again_without_using_up_the_resumes() -> None:
    busy = FetchLimits().max_resumes + 2  # more "busy" answers than broken transfers allowed
    t = ScriptedTransport(DATA, busy=busy)
    assert asyncio.run(t.fetch("targets/x", 10**6)) == DATA
    assert t.offsets == [0] * (busy + 1)


def test_fetch_refuses_more_than_the_cap() -> None:
    with pytest.raises(FetchAborted, match="cap"):
        asyncio.run(ScriptedTransport(DATA).fetch("targets/x", 100_000))


def test_fetch_gives_up_on_a_slow_sender() -> None:
    slow = ScriptedTransport(DATA, chunk=100, delay_s=0.01)
    limits = FetchLimits(min_rate_bytes_per_s=50_000, grace_s=0.2)
    with pytest.raises(FetchAborted, match="slower"):
        asyncio.run(slow.fetch("targets/x", 10**6, limits))


def test_fetch_has_a_total_deadline() -> None:
    slow = ScriptedTransport(DATA, chunk=100, delay_s=0.01)
    limits = FetchLimits(deadline_s=0.3, min_rate_bytes_per_s=0)
    with pytest.raises(TransportError, match="deadline"):
        asyncio.run(slow.fetch("targets/x", 10**6, limits))


def test_missing_file_is_file_not_found() -> None:
    with pytest.raises(FileNotFoundError):
        asyncio.run(ScriptedTransport(DATA).fetch("targets/missing", 10**6))


def test_grpc_transport_registers_and_fetches_over_loopback(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'hub.db'}")
    trust = TrustRepository.init(tmp_path / "trust")
    blob = tmp_path / "big.skill"
    payload = os.urandom(5 * 1024 * 1024)
    blob.write_bytes(payload)
    ref = trust.add_target("demo/big.skill", blob)

    async def scenario() -> None:
        async with running(HubCore(store, trust)) as core:
            await serve_and_fetch(core)

    async def serve_and_fetch(core: HubCore) -> None:
        server, port = await start_grpc_server(core, "127.0.0.1:0")
        try:
            transport = open_transport(f"grpc://127.0.0.1:{port}", "cam-1")
            async with transport:
                await transport.connect(
                    make_envelope("cam-1", register=pb.Register(labels={"kind": "camera"}))
                )
                kinds = [kind_of(await asyncio.wait_for(transport.receive(), 5)) for _ in range(2)]
                assert kinds == ["welcome", "desired"]
                assert await transport.fetch(ref.path, 10 * 1024 * 1024) == payload
                with pytest.raises(FileNotFoundError):
                    await transport.fetch("metadata/77.root.json", 10**6)
                # Over the cap: refused for good, not retried.
                with pytest.raises(FetchAborted, match="RESOURCE_EXHAUSTED"):
                    await transport.fetch(ref.path, 1024)
        finally:
            await server.stop(None)

    asyncio.run(scenario())
    device = store.get_device("cam-1")
    assert device is not None and device.labels == {"kind": "camera"}


def test_unreachable_hub_is_a_transport_error() -> None:
    async def scenario() -> None:
        t = open_transport("grpc://127.0.0.1:9", "cam-1")
        t._connect_timeout_s = 0.5  # type: ignore[attr-defined]
        with pytest.raises(TransportError, match="did not answer"):
            await t.connect(make_envelope("cam-1", register=pb.Register()))

    asyncio.run(scenario())


def test_unknown_scheme_is_refused() -> None:
    with pytest.raises(TransportError, match="scheme"):
        open_transport("http://hub:80", "cam-1")
