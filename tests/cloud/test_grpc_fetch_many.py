"""``FetchMany``: several files in one gRPC call, checked as single fetches are.

A real in-process gRPC hub on a real SQLite store and TUF repository; the
devices are raw gRPC clients that can send any batch, and the agent's own
transport, against this hub and against one too old to serve the call.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from cloud.grpc_server import HubServicer, server_options, start_grpc_server
from cloud.hubcore import HubCore, running
from cloud.store import open_store
from edge_agent.hublink import HubLink
from edge_agent.transport import open_transport
from edge_agent.transport.grpc import GrpcAgentTransport
from protos import kind_of, make_envelope, pb
from protos.fetch import MAX_FETCH_BATCH_FILES, MAX_FETCH_BATCHES
from skills.trust import TrustRepository

TIMEOUT_S = 10.0
ROOT = "metadata/1.root.json"
TIMESTAMP = "metadata/timestamp.json"
FETCH_MANY = "/edgeskill.v1.Hub/FetchMany"
FETCH = "/edgeskill.v1.Hub/Fetch"


@pytest.fixture
def core(tmp_path: Path) -> Iterator[HubCore]:
    store = open_store(f"sqlite:///{tmp_path / 'hub.db'}")
    try:
        yield HubCore(store, TrustRepository.init(tmp_path / "trust"))
    finally:
        store.close()


def batch(*paths: str, device: str = "cam-1", max_bytes: int = 1 << 20) -> bytes:
    requests = [pb.FetchRequest(path=path, max_bytes=max_bytes) for path in paths]
    return pb.FetchBatch(device_id=device, requests=requests).SerializeToString()


async def requests_of(*payloads: bytes) -> AsyncIterator[bytes]:
    for payload in payloads:
        yield payload


async def fetch_many(port: int, *payloads: bytes) -> list[pb.FetchPart]:
    """The parts the hub answers ``payloads`` with, in one call."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.stream_stream(FETCH_MANY, response_deserializer=pb.FetchPart.FromString)
        async with asyncio.timeout(TIMEOUT_S):
            return [part async for part in call(requests_of(*payloads))]


async def fetch_one(port: int, path: str) -> bytes:
    """A file as the single ``Fetch`` serves it."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_stream(FETCH, response_deserializer=pb.FetchChunk.FromString)
        req = pb.FetchRequest(device_id="cam-1", path=path, max_bytes=1 << 20)
        async with asyncio.timeout(TIMEOUT_S):
            return b"".join([chunk.data async for chunk in call(req.SerializeToString())])


async def refusal(port: int, *payloads: bytes) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await fetch_many(port, *payloads)
    return info.value.code()


def files_of(parts: list[pb.FetchPart]) -> dict[int, bytes | str]:
    """Each file's bytes (or its refusal's code), by its index in the batch."""
    files: dict[int, bytes | str] = {}
    for part in parts:
        if part.error_code:
            files[part.index] = part.error_code
        else:
            assert part.chunk.offset == len(files.get(part.index, b""))
            files[part.index] = bytes(files.get(part.index, b"")) + part.chunk.data
    return files


async def serve(core: HubCore) -> tuple[grpc.aio.Server, int]:
    server, port = await start_grpc_server(core, "127.0.0.1:0")
    await core.register(make_envelope("cam-1", register=pb.Register()))
    return server, port


def test_a_batch_answers_the_bytes_single_fetches_answer(core: HubCore) -> None:
    async def main() -> None:
        server, port = await serve(core)
        try:
            parts = await fetch_many(port, batch(ROOT, TIMESTAMP), batch(TIMESTAMP))
            singles = [await fetch_one(port, ROOT), await fetch_one(port, TIMESTAMP)]
        finally:
            await server.stop(None)
        first, second = parts[:2], parts[2:]
        assert files_of(first) == {0: singles[0], 1: singles[1]}
        assert files_of(second) == {0: singles[1]}
        assert all(p.chunk.last for p in parts) and singles[0].startswith(b"{")

    asyncio.run(main())
    assert core.dropped == {}


def test_a_path_outside_the_served_folders_is_refused_inside_a_batch(core: HubCore) -> None:
    async def main() -> None:
        server, port = await serve(core)
        try:
            asked = batch("../hub.db", TIMESTAMP, "metadata/9.root.json", "targets/../../x")
            parts = await fetch_many(port, asked)
            timestamp = await fetch_one(port, TIMESTAMP)
        finally:
            await server.stop(None)
        assert files_of(parts) == {0: "refused", 1: timestamp, 2: "not-found", 3: "refused"}

    asyncio.run(main())


def test_a_file_over_the_cap_is_refused_and_the_others_served(core: HubCore) -> None:
    async def main() -> None:
        server, port = await serve(core)
        try:
            parts = await fetch_many(port, batch(ROOT, max_bytes=10))
        finally:
            await server.stop(None)
        assert files_of(parts) == {0: "too-large"}

    asyncio.run(main())


def test_batches_over_their_caps_end_the_call(core: HubCore) -> None:
    async def main() -> None:
        server, port = await serve(core)
        try:
            too_many_files = batch(*[TIMESTAMP] * (MAX_FETCH_BATCH_FILES + 1))
            assert await refusal(port, too_many_files) == grpc.StatusCode.INVALID_ARGUMENT
            too_long = b"\n" + bytes([0xFF, 0xFF, 0x04]) + b"x" * 70_000
            assert await refusal(port, too_long) == grpc.StatusCode.INVALID_ARGUMENT
            assert await refusal(port, b"\xff\xff") == grpc.StatusCode.INVALID_ARGUMENT
            too_many_batches = [batch(TIMESTAMP)] * (MAX_FETCH_BATCHES + 1)
            code = await refusal(port, *too_many_batches)
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        finally:
            await server.stop(None)

    asyncio.run(main())
    assert core.dropped == {"oversized": 2, "malformed": 1}


def test_a_batch_of_an_unknown_or_another_device_is_refused(core: HubCore) -> None:
    async def main() -> None:
        server, port = await serve(core)
        try:
            unknown = batch(TIMESTAMP, device="ghost")
            assert await refusal(port, unknown) == grpc.StatusCode.FAILED_PRECONDITION
            other = pb.FetchBatch(
                device_id="cam-1",
                requests=[pb.FetchRequest(device_id="cam-2", path=TIMESTAMP, max_bytes=1 << 20)],
            ).SerializeToString()
            assert await refusal(port, other) == grpc.StatusCode.INVALID_ARGUMENT
        finally:
            await server.stop(None)

    asyncio.run(main())
    assert core.dropped == {"unknown-device": 1, "spoofed": 1}


def agent_answers(port: int) -> tuple[list[object], bool]:
    """The agent's answers for a root that is not there and the timestamp, and
    whether its transport still takes the hub to serve ``FetchMany``."""

    async def main() -> tuple[list[object], bool]:
        async with open_transport(f"grpc://127.0.0.1:{port}", "cam-1") as transport:
            assert isinstance(transport, GrpcAgentTransport)
            await transport.connect(make_envelope("cam-1", register=pb.Register()))
            async with asyncio.timeout(TIMEOUT_S):
                assert kind_of(await transport.receive()) == "welcome"
            link = HubLink(max_bytes=1 << 20)
            link.attach(transport)
            asks = [("metadata/2.root.json", 1 << 19), (TIMESTAMP, 1 << 14)]
            got = await asyncio.to_thread(link.fetch_many, asks)
            return list(got), transport.batches_served

    return asyncio.run(main())


def test_an_agent_fetches_from_a_hub_without_fetch_many_one_file_a_call(core: HubCore) -> None:
    timestamp = core.trust.read(TIMESTAMP, 1 << 14)

    async def old_hub() -> tuple[grpc.aio.Server, int]:
        servicer = HubServicer(core)
        handlers = {
            "Connect": grpc.stream_stream_rpc_method_handler(
                servicer.Connect, response_serializer=pb.Envelope.SerializeToString
            ),
            "Fetch": grpc.unary_stream_rpc_method_handler(
                servicer.Fetch, response_serializer=pb.FetchChunk.SerializeToString
            ),
        }
        server = grpc.aio.server(options=server_options())
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("edgeskill.v1.Hub", handlers),)
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server, port

    async def main() -> tuple[list[object], bool]:
        async with running(core):
            server, port = await old_hub()
            try:
                return await asyncio.to_thread(agent_answers, port)
            finally:
                await server.stop(None)

    # Whether the transport learnt that the hub does not serve the call is best effort:
    # the hub's refusal races the batch, and can surface as an internal error.
    assert asyncio.run(main())[0] == [None, timestamp]


def test_an_agent_fetches_a_hop_through_fetch_many(core: HubCore) -> None:
    timestamp = core.trust.read(TIMESTAMP, 1 << 14)

    async def main() -> tuple[list[object], bool]:
        async with running(core):
            server, port = await start_grpc_server(core, "127.0.0.1:0")
            try:
                return await asyncio.to_thread(agent_answers, port)
            finally:
                await server.stop(None)

    assert asyncio.run(main()) == ([None, timestamp], True)
