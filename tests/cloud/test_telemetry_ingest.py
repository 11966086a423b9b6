"""gRPC stream telemetry goes through the bulk ingest and keeps the session's guarantees.

An in-process gRPC server serves a real store (SQLite and PostgreSQL). The
store's telemetry write can be held at a gate, so a test can put many messages
of one stream in the ingest before anything commits, then see what was stored,
what was acknowledged and when, and what was refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, cast

import grpc.aio
import pytest

from cloud.grpc_server import HubServicer, hub_handler, server_options
from cloud.hubcore import HubCore, running
from cloud.store import Store
from cloud.store.telemetry import TelemetryWindow
from protos import encode_envelope, kind_of, make_envelope, pb
from protos.limits import MAX_ENVELOPE_BYTES
from skills.trust import TrustRepository
from tests.cloud.test_grpc_server import GrpcDevice, next_of, oversized, telemetry
from tests.support import async_wait_until

TIMEOUT_S = 10.0


class GatedStore:
    """The real store; its telemetry writes wait while the gate is closed.

    Each write's batch size is recorded, and the gate's waits happen in the
    group commit's thread, as a slow disk's would.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self.gate = threading.Event()
        self.gate.set()
        self.batches: list[int] = []

    def add_telemetry_windows(self, windows: Sequence[TelemetryWindow]) -> list[bool]:
        assert self.gate.wait(TIMEOUT_S), "the test never opened the gate"
        self.batches.append(len(windows))
        return self.store.add_telemetry_windows(windows)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


@pytest.fixture
def gated(store: Store) -> GatedStore:
    return GatedStore(store)


@pytest.fixture
def core(tmp_path: Path, gated: GatedStore) -> HubCore:
    return HubCore(cast(Any, gated), TrustRepository.init(tmp_path / "trust"))


@contextlib.asynccontextmanager
async def serving(servicer: HubServicer, *devices: str) -> AsyncIterator[list[GrpcDevice]]:
    """Serve ``servicer`` in process and yield one registered stream per device."""
    async with running(servicer.core), contextlib.AsyncExitStack() as stack:
        server = grpc.aio.server(options=server_options())
        server.add_generic_rpc_handlers((hub_handler(servicer),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        stack.push_async_callback(server.stop, None)
        streams = []
        for device in devices:
            dev = GrpcDevice(port, device)
            stack.push_async_callback(dev.close)
            register = make_envelope(device, register=pb.Register(labels={"kind": "camera"}))
            await dev.send(encode_envelope(register), "register")
            await next_of(dev, "welcome")
            streams.append(dev)
        yield streams


def windows(device: str, count: int, start: int = 0) -> list[pb.Envelope]:
    """Telemetry told apart by a counter (``dropped_messages`` is the message's number)."""
    return [telemetry(device, dropped_messages=start + i) for i in range(count)]


def stored_counters(store: Store, device: str) -> list[int]:
    return sorted(r.dropped_messages for r in store.telemetry_for(device))


async def acks_until(
    dev: GrpcDevice, ids: set[str], check: Any = None
) -> tuple[list[list[str]], set[str]]:
    """Read acks until every id in ``ids`` is acked; each ack's ids, and all ids acked.

    ``check(acked_ids)`` runs as each ack arrives (what must hold at that moment).
    """
    acks: list[list[str]] = []
    acked: set[str] = set()
    while not ids <= acked:
        ack = list((await next_of(dev, "ack")).ack.ids)
        acks.append(ack)
        acked.update(ack)
        if check is not None:
            await check(ack)
    return acks, acked


def test_a_streams_telemetry_is_stored_once_each_and_acked_only_once_committed(
    core: HubCore, gated: GatedStore
) -> None:
    servicer = HubServicer(core)
    sent = windows("cam-1", 40)
    number = {env.id: env.telemetry.dropped_messages for env in sent}

    async def committed(ack: list[str]) -> None:
        # An ack may only leave once the transaction holding its messages committed.
        on_disk = set(await asyncio.to_thread(stored_counters, gated.store, "cam-1"))
        assert {number[i] for i in ack} <= on_disk

    async def main() -> None:
        async with serving(servicer, "cam-1") as (dev,):
            gated.gate.clear()
            for env in sent:
                await dev.send(encode_envelope(env), "telemetry")
            await async_wait_until(
                lambda: servicer.telemetry.pending == len(sent), TIMEOUT_S, "all taken"
            )
            gated.gate.set()
            acks, acked = await acks_until(dev, set(number), committed)
        assert acked == set(number)
        # Held at the gate together, they are acknowledged with a few acks of many ids.
        assert len(acks) < len(sent)
        assert core.handled["telemetry"] == len(sent)
        assert core.dropped == {}

    asyncio.run(main())
    assert stored_counters(gated.store, "cam-1") == list(range(len(sent)))
    assert servicer.telemetry.pending == 0


def test_duplicates_are_acked_again_and_not_stored_twice(core: HubCore, gated: GatedStore) -> None:
    servicer = HubServicer(core)
    first, second, third = windows("cam-1", 3)

    async def main() -> None:
        async with serving(servicer, "cam-1") as (dev,):
            await dev.send(encode_envelope(first), "telemetry")
            await acks_until(dev, {first.id})
            # The agent resends ``first`` (its ack was lost) and ``second`` twice, all
            # while nothing commits: the copies inside one batch are stored once too.
            gated.gate.clear()
            for env in (first, second, second, third):
                await dev.send(encode_envelope(env), "telemetry")
            await async_wait_until(lambda: servicer.telemetry.pending == 3, TIMEOUT_S, "taken")
            gated.gate.set()
            _, acked = await acks_until(dev, {first.id, second.id, third.id})
            assert acked == {first.id, second.id, third.id}
        assert (core.handled["telemetry"], core.handled["duplicate"]) == (3, 2)
        assert core.dropped == {}

    asyncio.run(main())
    assert stored_counters(gated.store, "cam-1") == [0, 1, 2]


def own_oversized() -> bytes:
    env = telemetry("cam-1")
    env.telemetry.version = "1" * MAX_ENVELOPE_BYTES  # one field past the cap
    return env.SerializeToString()


def test_refused_messages_in_a_burst_are_counted_and_the_rest_stored(
    core: HubCore, gated: GatedStore
) -> None:
    servicer = HubServicer(core)
    good = windows("cam-1", 5)
    refused = [
        encode_envelope(telemetry("cam-2")),  # spoofed: the stream is cam-1's
        oversized(),
        own_oversized(),  # in the stream's own name: still checked for size first
        b"\x08\x96\x01 not protobuf",
        encode_envelope(telemetry("cam-1", labelled=9)),  # more labelled than inferences
    ]

    async def main() -> None:
        async with serving(servicer, "cam-1", "cam-2") as (dev, _):
            for payload in [*refused, *map(encode_envelope, good)]:
                await dev.send(payload, "telemetry")
            _, acked = await acks_until(dev, {env.id for env in good})
            assert acked == {env.id for env in good}
            await async_wait_until(lambda: sum(core.dropped.values()) == 5, TIMEOUT_S, "drops")
        assert core.dropped == {"spoofed": 1, "oversized": 2, "malformed": 1, "invalid": 1}

    asyncio.run(main())
    assert stored_counters(gated.store, "cam-1") == list(range(5))
    assert gated.store.telemetry_for("cam-2") == []


@pytest.mark.parametrize(("max_telemetry", "held"), [(6, 6), (100, 8)])
def test_the_pending_caps_hold_and_push_back_on_the_streams(
    core: HubCore, gated: GatedStore, max_telemetry: int, held: int
) -> None:
    # Two streams of 4 at most each: 8 at most, unless the ingest's cap is lower.
    servicer = HubServicer(core, max_telemetry=max_telemetry, max_stream_telemetry=4)
    a_sent, b_sent = windows("cam-a", 30), windows("cam-b", 30)

    async def main() -> None:
        async with serving(servicer, "cam-a", "cam-b") as (a, b):
            gated.gate.clear()
            for dev, sent in ((a, a_sent), (b, b_sent)):
                for env in sent:
                    await dev.send(encode_envelope(env), kind_of(env))
            await async_wait_until(lambda: servicer.telemetry.pending == held, TIMEOUT_S, "full")
            gated.gate.set()
            acked = await asyncio.gather(
                acks_until(a, {env.id for env in a_sent}),
                acks_until(b, {env.id for env in b_sent}),
            )
            assert [len(ids) for _, ids in acked] == [30, 30]
        assert core.dropped == {}  # the streams waited for room, nothing was refused

    asyncio.run(main())
    # What waited at the gate went in the next transaction: never more than the caps let in.
    assert max(gated.batches) <= held
    assert stored_counters(gated.store, "cam-a") == list(range(30))
    assert stored_counters(gated.store, "cam-b") == list(range(30))
    assert servicer.telemetry.pending == 0
