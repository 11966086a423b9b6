"""The hub's Prometheus endpoint, scraped over real HTTP on 127.0.0.1."""

from __future__ import annotations

import asyncio
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cloud.errors import TransportError, ValidationError
from cloud.hub import Hub
from cloud.hubcore import HubCore
from cloud.loops import LoopHost
from cloud.metrics import start_hub_metrics
from cloud.session import DropReason
from cloud.store import open_store
from protos import encode_envelope, kind_of, make_envelope, pb
from protos.metrics_server import MetricsBindError, parse_bind
from skills.trust import TrustRepository
from tests.support import async_wait_until


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample on the endpoint, keyed by name and sorted labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def refused(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


@pytest.fixture
def core(tmp_path: Path) -> Iterator[HubCore]:
    store = open_store(f"sqlite:///{tmp_path / 'hub.db'}")
    yield HubCore(store, TrustRepository.init(tmp_path / "trust"))
    store.close()


async def _traffic(core: HubCore) -> None:
    reg = pb.Register(labels={"kind": "camera"}, profile=pb.HardwareProfile(arch="x86_64"))
    cam1, cam2 = core.session(), core.session()
    await cam1.open(encode_envelope(make_envelope("cam-1", register=reg)))
    await cam2.open(encode_envelope(make_envelope("cam-2", register=reg)))
    await cam2.close()
    good = pb.Telemetry(skill="digits", version="1.0.0", inferences=5)
    (ack,) = await cam1.receive(encode_envelope(make_envelope("cam-1", telemetry=good)))
    assert kind_of(ack) == "ack"
    bad = pb.Telemetry(skill="digits", version="1.0.0", inferences=1, labelled=2)
    assert await cam1.receive(encode_envelope(make_envelope("cam-1", telemetry=bad))) == []
    await core.close()


def test_endpoint_shows_message_drop_telemetry_and_fleet_counts(core: HubCore) -> None:
    server = start_hub_metrics(core, core.store, "127.0.0.1:0")
    try:
        before = scrape(server.port)
        assert before[("edgeskill_hub_devices", ())] == 0
        asyncio.run(_traffic(core))
        after = scrape(server.port)
    finally:
        server.stop()
    assert after[("edgeskill_hub_messages_total", (("kind", "register"),))] == 2
    assert after[("edgeskill_hub_messages_total", (("kind", "telemetry"),))] == 1
    assert after[("edgeskill_hub_dropped_total", (("reason", "invalid"),))] == 1
    # Two flushes of one window each: the good one, then the malformed one, refused alone.
    assert after[("edgeskill_hub_telemetry_batches_total", ())] == 2
    assert after[("edgeskill_hub_telemetry_items_total", ())] == 2
    assert after[("edgeskill_hub_devices", ())] == 2
    assert after[("edgeskill_hub_devices_online", ())] == 1
    assert refused(server.port)


def test_two_hubs_in_one_process_keep_their_own_series(tmp_path: Path, core: HubCore) -> None:
    other = HubCore(open_store(f"sqlite:///{tmp_path / 'other.db'}"), core.trust)
    first = start_hub_metrics(core, core.store, "127.0.0.1:0")
    second = start_hub_metrics(other, other.store, "127.0.0.1:0")
    try:
        core.drop(DropReason.OVERSIZED)
        assert scrape(first.port)[("edgeskill_hub_dropped_total", (("reason", "oversized"),))] == 1
        assert ("edgeskill_hub_dropped_total", (("reason", "oversized"),)) not in scrape(
            second.port
        )
    finally:
        first.stop()
        second.stop()
        other.store.close()


def test_serve_exposes_metrics_leader_and_loops_only_while_serving(tmp_path: Path) -> None:
    hub = Hub.init(tmp_path / "hub", grpc_bind="127.0.0.1:0")
    port = free_port()

    async def main() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        stop = asyncio.Event()
        serving = asyncio.create_task(hub.serve(stop, metrics_bind=f"127.0.0.1:{port}"))

        async def leading() -> bool:
            if refused(port):
                return False
            samples = await asyncio.to_thread(scrape, port)
            return samples.get(("edgeskill_hub_leader", ())) == 1

        await async_wait_until(leading, 10.0, "the SQLite hub to lead")
        samples = await asyncio.to_thread(scrape, port)
        stop.set()
        await serving
        return samples

    try:
        samples = asyncio.run(main())
    finally:
        hub.close()
    assert samples[("edgeskill_hub_devices", ())] == 0
    assert samples[("edgeskill_hub_leader", ())] == 1
    for loop in ("leader-election", "timestamp-refresh"):
        assert samples[("edgeskill_hub_loop_running", (("loop", loop),))] == 1
        assert samples[("edgeskill_hub_loop_restarts_total", (("loop", loop),))] == 0
    assert refused(port)


def test_loop_restarts_and_leadership_are_exported(core: HubCore) -> None:
    host = LoopHost()
    failed = asyncio.Event()

    async def broken() -> None:
        failed.set()
        raise RuntimeError("store away")

    async def main() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        host.add("broken", broken)
        host.start()
        await host.set_leader(True)
        await async_wait_until(
            lambda: host.states()[0].restarts >= 1, 10.0, "the broken loop's first restart"
        )
        server = start_hub_metrics(core, core.store, "127.0.0.1:0", host)
        try:
            return await asyncio.to_thread(scrape, server.port)
        finally:
            server.stop()
            await host.stop()

    samples = asyncio.run(main())
    assert samples[("edgeskill_hub_leader", ())] == 1
    assert samples[("edgeskill_hub_loop_restarts_total", (("loop", "broken"),))] >= 1


@pytest.mark.parametrize("bind", ["9464", "127.0.0.1:", ":9464", "127.0.0.1:70000", "h:x"])
def test_a_malformed_address_is_refused(bind: str) -> None:
    with pytest.raises(MetricsBindError):
        parse_bind(bind)


def test_bind_parses_ipv6_and_a_bad_or_taken_address_is_a_hub_error(core: HubCore) -> None:
    assert parse_bind("[::1]:9464") == ("::1", 9464)
    assert parse_bind("0.0.0.0:0") == ("0.0.0.0", 0)
    with pytest.raises(ValidationError, match="expected HOST:PORT"):
        start_hub_metrics(core, core.store, "127.0.0.1")
    server = start_hub_metrics(core, core.store, "127.0.0.1:0")
    try:
        with pytest.raises(TransportError, match="cannot serve metrics"):
            start_hub_metrics(core, core.store, f"127.0.0.1:{server.port}")
    finally:
        server.stop()
