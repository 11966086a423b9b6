"""A stalled hub: the fetch is abandoned within the stall bound, supervision goes on.

A real in-process gRPC hub answers ``Fetch`` with one chunk and then nothing;
the agent's transport gives up within seconds. The reconciler fetches in the
background, so a skill that crashes meanwhile is restarted, the running
version keeps running, and the stalled fetch ends as a reported failure.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import textwrap
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from edge_agent.installs import InstallStore
from edge_agent.reconciler import Reconciler
from edge_agent.sandbox.launcher import make_launcher
from edge_agent.transport import FetchAborted, FetchLimits
from edge_agent.transport.grpc import GrpcAgentTransport
from protos import edgeskill_pb2_grpc as pb_grpc
from protos import make_envelope, pb
from skills.errors import FetchError
from skills.manifest import Manifest
from tests.support import async_wait_until
from tests.support.desired import desired_state

GOOD = """
from skills.sdk import Skill


class Good(Skill):
    def setup(self, ctx):
        pass

    def process(self, item):
        return {"answer": 42}
"""


class StalledHub(pb_grpc.HubServicer):
    """Sends the first chunk of every file, then nothing, forever."""

    def __init__(self) -> None:
        self.fetches = 0

    async def Connect(
        self, request_iterator: AsyncIterator[pb.Envelope], context: object
    ) -> AsyncIterator[pb.Envelope]:
        async for _env in request_iterator:
            pass
        return
        yield pb.Envelope()  # an async generator that sends nothing

    async def Fetch(
        self, request: pb.FetchRequest, context: object
    ) -> AsyncIterator[pb.FetchChunk]:
        self.fetches += 1
        yield pb.FetchChunk(offset=0, data=b"x" * 1024, total_size=10_000_000)
        await asyncio.sleep(3600)


def test_a_fetch_from_a_stalled_hub_is_abandoned_within_the_stall_bound() -> None:
    async def scenario() -> float:
        server = grpc.aio.server()
        hub = StalledHub()
        pb_grpc.add_HubServicer_to_server(hub, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        transport = GrpcAgentTransport(
            f"127.0.0.1:{port}", "cam-1", fetch_limits=FetchLimits(chunk_timeout_s=1.0)
        )
        try:
            await transport.connect(make_envelope("cam-1", heartbeat=pb.Heartbeat()))
            started = time.monotonic()
            with pytest.raises(FetchAborted, match="the hub stalled: no data for targets/x in 1 s"):
                await transport.fetch("targets/x", 10**8)
            return time.monotonic() - started
        finally:
            await transport.close()
            await server.stop(0)

    elapsed = asyncio.run(scenario())
    assert 1.0 <= elapsed < 3.0  # one stall bound, no resumes against a stalled hub


def _source(root: Path, version: str) -> Path:
    folder = root / f"good-{version}"
    (folder / "control").mkdir(parents=True)
    (folder / "control" / "good.py").write_text(textwrap.dedent(GOOD))
    manifest = Manifest(name="good", version=version, entrypoint="good:Good")
    (folder / "skill.toml").write_text(manifest.to_toml())
    return folder


def test_a_crashed_skill_is_restarted_while_a_fetch_hangs_on_a_stalled_hub(
    tmp_path: Path,
) -> None:
    sources = {"good/1.0.0": _source(tmp_path / "src", "1.0.0")}
    release = threading.Event()
    stall_s = 4.0

    def fetch_target(target: str) -> Path:
        if target in sources:
            return sources[target]
        release.wait(stall_s)  # what the transport does to a stalled hub: give up at the bound
        raise FetchError(f"fetch of targets/{target} failed: the hub stalled")

    events: list[tuple[str, str, str, str]] = []
    rec = Reconciler(
        InstallStore(tmp_path / "agent" / "installs", shutil.copytree),
        fetch_target,
        make_launcher(["onnx-cpu"], (), tmp_path / "agent" / "logs"),
        lambda: None,
        on_event=lambda *e: events.append(e),
        supervise_s=0.2,
    )

    async def scenario() -> None:
        async def first_started() -> bool:  # its fetch may take more than one pass's wait
            await rec.reconcile(desired_state("good", 1, "1.0.0"))
            return "good" in rec.running()

        await async_wait_until(first_started, 30, "1.0.0 to start")
        first = rec.running()["good"]
        await rec.reconcile(desired_state("good", 2, "2.0.0"))  # the fetch of 2.0.0 now hangs
        assert rec.states["good"].state == "installing"
        os.kill(first.pid, 9)  # the skill crashes while the hub stalls
        await async_wait_until(lambda: not first.alive, 5, "the skill to die")
        started = time.monotonic()
        await rec.reconcile(desired_state("good", 2, "2.0.0"))
        second = rec.running()["good"]
        assert second is not first and second.process({})[0] == {"answer": 42}
        assert time.monotonic() - started < stall_s / 2  # not held up by the fetch
        assert events[0][:2] == ("sandbox", "crashed")

        async def fetch_failed() -> bool:
            await rec.reconcile(desired_state("good", 2, "2.0.0"))
            return rec.states["good"].state == "failed"

        await async_wait_until(fetch_failed, 3 * stall_s, "the stalled fetch to fail")
        state = rec.states["good"]
        assert (state.version, state.desired_version) == ("1.0.0", "2.0.0")
        assert "the hub stalled" in state.error
        assert rec.running()["good"] is second and second.alive
        await rec.shutdown()

    asyncio.run(scenario())
