"""A real hub process serving a split or joint skill over gRPC, and a device that talks to it.

The hub is ``edgeskill hub serve`` in a child process (SQLite store, plain gRPC,
its default tail serving: dynamic batching with a 2 ms wait), with the skill of
:mod:`tests.support.split_skill` published and deployed to the ``cameras`` group;
a device registered with the label ``kind=camera`` is entitled to its tails.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from cloud.hub import Hub
from edge_agent.transport.grpc import GrpcAgentTransport
from edgeskill.processes import Fleet, free_port, wait_for_port
from protos import kind_of, make_envelope, pb
from tests.support.split_skill import GROUP, SplitSkill, publish

WELCOME_S = 30.0


@dataclass(frozen=True)
class HubProcess:
    """A running hub: where its gRPC server listens, and its process id."""

    host: str
    port: int
    pid: int


@contextlib.contextmanager
def hub_serving(work: Path, skill: SplitSkill) -> Iterator[HubProcess]:
    """Make a hub home in ``work``, publish and deploy ``skill``, serve it until the end.

    Raises:
        OSError: The hub could not be started or did not listen in time.
    """
    port = free_port()
    hub = Hub.init(work / "hub", grpc_bind=f"127.0.0.1:{port}", insecure=True)
    try:
        hub.store.create_group(GROUP, "kind=camera")
        publish(hub, skill)
    finally:
        hub.close()
    fleet = Fleet(work / "logs")
    try:
        proc = fleet.start("hub", ["hub", "serve", "--home", str(work / "hub")])
        wait_for_port(port)
        yield HubProcess("127.0.0.1", port, proc.pid)
    finally:
        fleet.stop_all()


@contextlib.asynccontextmanager
async def device(target: str, device_id: str) -> AsyncIterator[GrpcAgentTransport]:
    """The agent's gRPC transport to ``target``, registered as a camera (its welcome received).

    Raises:
        TransportError: The hub could not be reached.
        TimeoutError: No welcome came in time.
    """
    transport = GrpcAgentTransport(target, device_id)
    await transport.connect(
        make_envelope(device_id, register=pb.Register(labels={"kind": "camera"}))
    )
    try:
        async with asyncio.timeout(WELCOME_S):
            while kind_of(await transport.receive()) != "welcome":
                pass
        yield transport
    finally:
        await transport.close()
