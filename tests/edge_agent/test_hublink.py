"""``HubLink.fetch_many``: several files in one hop, all in flight together.

A scripted transport answers only once every request of the batch has reached
it, so fetching them one after another would fail; the real gRPC transport is
checked the same way against a real hub on loopback.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from cloud.grpc_server import start_grpc_server
from cloud.hubcore import HubCore, running
from cloud.store import open_store
from edge_agent.config import AgentConfig
from edge_agent.errors import TransportError
from edge_agent.hublink import MAX_TRIPS, HubLink
from edge_agent.transport import AgentTransport, FetchAborted, open_transport
from edge_agent.wiring import build_agent
from protos import kind_of, make_envelope, pb
from skills.errors import FetchError
from skills.trust import TrustRepository
from tests.fakes.fake_launcher import PROFILE, FakeLauncher
from tests.fakes.hub_fetch import HubFetch
from tests.support import async_wait_until

TIMESTAMP = "metadata/timestamp.json"


class GatedTransport(AgentTransport):
    """Answers each fetch only once ``together`` fetches have reached it.

    A fetch waiting alone for ``wait_s`` is refused, as if the batch had been
    asked for one file after another.
    """

    def __init__(self, files: dict[str, bytes], together: int, wait_s: float = 5.0) -> None:
        self.files = files
        self.together = together
        self.wait_s = wait_s
        self.started: list[str] = []
        self.cancelled: list[str] = []
        self._all_in = asyncio.Event()

    async def connect(self, register: pb.Envelope) -> None:
        return None

    async def send(self, env: pb.Envelope) -> None:
        return None

    async def receive(self) -> pb.Envelope:
        raise TransportError("nothing to receive")

    async def _fetch(self, path: str, offset: int, max_bytes: int) -> AsyncIterator[bytes]:
        self.started.append(path)
        if len(self.started) >= self.together:
            self._all_in.set()
        try:
            async with asyncio.timeout(self.wait_s):
                await self._all_in.wait()
        except TimeoutError as exc:
            raise FetchAborted(f"{path} was asked for alone") from exc
        except asyncio.CancelledError:
            self.cancelled.append(path)
            raise
        if path not in self.files:
            raise FileNotFoundError(path)
        yield self.files[path]

    async def close(self) -> None:
        return None


async def _in_thread(
    link: HubLink, requests: Sequence[tuple[str, int]]
) -> list[bytes | FetchError | None]:
    async with asyncio.timeout(30):
        return await asyncio.to_thread(link.fetch_many, requests)


def test_fetch_many_has_every_request_in_flight_at_once() -> None:
    files = {TIMESTAMP: b"t" * 100, "targets/big": b"b" * 1000}

    async def scenario() -> None:
        transport = GatedTransport(files, together=4)
        link = HubLink(max_bytes=500)
        link.attach(transport)
        requests = [
            ("metadata/2.root.json", 1 << 20),
            (TIMESTAMP, 1 << 20),
            ("targets/big", 1 << 20),  # over the link's own cap of 500 bytes
            (TIMESTAMP, 50),  # over the caller's cap
        ]
        got = await _in_thread(link, requests)
        assert transport.started == [path for path, _ in requests]
        assert got[:2] == [None, b"t" * 100]
        assert isinstance(got[2], FetchError) and "500 byte cap" in str(got[2])
        assert isinstance(got[3], FetchError) and "50 byte cap" in str(got[3])

    asyncio.run(scenario())


def test_fetch_many_gives_up_after_its_timeout_and_ends_every_fetch() -> None:
    async def scenario() -> None:
        transport = GatedTransport({}, together=3, wait_s=60)
        link = HubLink(max_bytes=1 << 20, timeout_s=0.3)
        link.attach(transport)
        with pytest.raises(FetchError, match=r"fetch of a\.json, b\.json timed out"):
            await _in_thread(link, [("a.json", 100), ("b.json", 100)])
        await async_wait_until(
            lambda: sorted(transport.cancelled) == ["a.json", "b.json"], 5, "both fetches ended"
        )

    asyncio.run(scenario())


class CountingTransport(GatedTransport):
    """Answers at once, noting on which thread each fetch began."""

    def __init__(self, files: dict[str, bytes]) -> None:
        super().__init__(files, together=1)
        self.threads: set[int] = set()

    async def _fetch(self, path: str, offset: int, max_bytes: int) -> AsyncIterator[bytes]:
        self.threads.add(threading.get_ident())
        async for chunk in super()._fetch(path, offset, max_bytes):
            yield chunk


def test_fetch_many_follows_each_trip_with_the_next_on_the_event_loop() -> None:
    files = {TIMESTAMP: b"7", "metadata/7.snapshot.json": b"s" * 300, "targets/x": b"x"}
    seen: list[list[bytes | FetchError | None]] = []

    def follow(answers: Sequence[bytes | FetchError | None]) -> list[tuple[str, int]]:
        seen.append(list(answers))
        if answers == [None, b"7"]:
            return [("metadata/7.snapshot.json", 1 << 20)]  # capped by the link: 200
        if len(seen) == 2:
            return [("targets/x", 10), ("targets/missing", 10)]
        return []

    async def scenario() -> None:
        transport = CountingTransport(files)
        link = HubLink(max_bytes=200)
        link.attach(transport)
        async with asyncio.timeout(30):
            got = await asyncio.to_thread(
                link.fetch_many, [("metadata/2.root.json", 100), (TIMESTAMP, 100)], follow
            )
        assert transport.started == [
            "metadata/2.root.json", TIMESTAMP, "metadata/7.snapshot.json",
            "targets/x", "targets/missing",
        ]  # fmt: skip
        assert got[:2] == [None, b"7"]
        assert isinstance(got[2], FetchError) and "200 byte cap" in str(got[2])
        assert got[3:] == [b"x", None]
        assert len(seen) == 3  # after each trip, the last ending the batch
        assert transport.threads == {threading.get_ident()}  # every trip on the loop

    asyncio.run(scenario())


def test_fetch_many_makes_at_most_its_trips_however_long_follow_goes_on() -> None:
    asked: list[int] = []

    def forever(answers: Sequence[bytes | FetchError | None]) -> list[tuple[str, int]]:
        asked.append(len(answers))
        return [(TIMESTAMP, 100)]

    async def scenario() -> None:
        transport = CountingTransport({TIMESTAMP: b"t"})
        link = HubLink(max_bytes=100)
        link.attach(transport)
        async with asyncio.timeout(30):
            got = await asyncio.to_thread(link.fetch_many, [(TIMESTAMP, 100)], forever)
        assert got == [b"t"] * MAX_TRIPS
        assert len(transport.started) == MAX_TRIPS
        assert len(asked) == MAX_TRIPS - 1  # never asked for a trip that is not made

    asyncio.run(scenario())


def test_fetch_many_without_a_hub_session_is_a_fetch_error() -> None:
    with pytest.raises(FetchError, match="not connected"):
        HubLink(max_bytes=100).fetch_many([(TIMESTAMP, 100)])


def test_fetch_many_over_grpc_reaches_the_hub_with_both_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'hub.db'}")
    trust = TrustRepository.init(tmp_path / "trust")
    timestamp = trust.read(TIMESTAMP, 1 << 14)

    async def scenario() -> None:
        async with running(HubCore(store, trust)) as core:
            # The hub opens neither file before it has been asked for both.
            both_asked = threading.Barrier(2, timeout=5)
            open_fetch = core.open_fetch

            def open_when_both_asked(path: str, offset: int, max_bytes: int) -> object:
                both_asked.wait()
                return open_fetch(path, offset, max_bytes)

            monkeypatch.setattr(core, "open_fetch", open_when_both_asked)
            await fetch_from(core)

    async def fetch_from(core: HubCore) -> None:
        server, port = await start_grpc_server(core, "127.0.0.1:0")
        try:
            async with open_transport(f"grpc://127.0.0.1:{port}", "cam-1") as transport:
                await transport.connect(make_envelope("cam-1", register=pb.Register()))
                async with asyncio.timeout(5):
                    assert kind_of(await transport.receive()) == "welcome"
                link = HubLink(max_bytes=1 << 20)
                link.attach(transport)
                got = await _in_thread(
                    link, [("metadata/2.root.json", 1 << 19), (TIMESTAMP, 1 << 14)]
                )
                assert got == [None, timestamp]
        finally:
            await server.stop(None)

    asyncio.run(scenario())


def test_the_agent_refreshes_its_metadata_with_the_pair_in_one_hop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trust = TrustRepository.init(tmp_path / "trust")
    hub = HubFetch(trust)  # stands in for the hub session behind the link
    monkeypatch.setattr(HubLink, "fetch", lambda _link, path, cap: hub(path, cap))
    monkeypatch.setattr(
        HubLink, "fetch_many", lambda _link, requests, follow=None: hub.many(requests, follow)
    )
    root = tmp_path / "trust" / "metadata" / "root.json"
    config = AgentConfig("grpc://127.0.0.1:9", "cam-1", tmp_path / "agent", trusted_root=root)
    agent = build_agent(config, PROFILE, launcher=FakeLauncher())
    try:
        refresh = agent._refresh_metadata
        assert refresh is not None
        refresh()
        hub.trips.clear()
        refresh()
    finally:
        agent.outbox.close()
    assert hub.trips == [["metadata/2.root.json", TIMESTAMP]]
