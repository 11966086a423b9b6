"""200 real agents in one process converge on a deployment and an upgrade, over both transports.

This is the seam a fleet simulator uses: every agent is built by
:func:`edge_agent.wiring.build_agent` - real outbox, installs, TUF client and
transport, speaking the real protocol to a real hub process (gRPC, or MQTT 5
through the test broker under a topic prefix of its own) - and
only the skill launcher is a fake, so 200 control processes are not spawned.
All agents share this process's one event loop.

``EDGESKILL_MANY_AGENTS=1000`` (``EDGESKILL_MANY_MQTT_AGENTS`` for MQTT) runs more by hand.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from cloud.hub import Hub
from cloud.mqtt_client import clear_retained
from cloud.service import FleetService
from edge_agent.agent import Agent
from edge_agent.config import AgentConfig
from edge_agent.profile import DeviceProfile
from edge_agent.wiring import build_agent
from protos.envelope import now_ms
from tests.fakes.fake_launcher import FakeLauncher
from tests.support import Fleet, async_wait_until, free_port, wait_for_port, wait_until
from tests.support.services import mqtt_url as broker_url_for
from tests.support.skillkit import LIBRARY, build_skill

AGENTS = int(os.environ.get("EDGESKILL_MANY_AGENTS", "200"))
# The MQTT transport is driven by this event loop (epoll), not by paho's select() thread,
# so descriptors numbered past 1024 are fine; set apart only to be tried by hand.
MQTT_AGENTS = int(os.environ.get("EDGESKILL_MANY_MQTT_AGENTS", "200"))
CONVERGE_S = float(os.environ.get("EDGESKILL_MANY_AGENTS_TIMEOUT", "120"))
PROFILE = DeviceProfile(
    arch="x86_64",
    accelerator="none",
    board="sim",
    targets=("onnx-cpu",),
    cpu_count=1,
    memory_bytes=1 << 30,
)


@dataclass
class HubProcess:
    """A ``hub serve`` child, its home opened here, the URL agents use and how many."""

    hub: Hub
    url: str
    agents: int


@pytest.fixture(params=["grpc", "mqtt"])
def hub(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[HubProcess]:
    port = free_port()
    mqtt_url = ""
    if request.param == "mqtt":
        prefix = f"es-test/{uuid.uuid4().hex[:12]}"
        mqtt_url = broker_url_for(prefix, session_expiry=60, keepalive=30)
    home = tmp_path / "hub"
    # The seam under test is the agent object, not identity: plain transports.
    hub = Hub.init(home, grpc_bind=f"127.0.0.1:{port}", mqtt_url=mqtt_url, insecure=True)
    dist = tmp_path / "dist"
    for version in ("1.0.0", "2.0.0"):  # no model files: the fake launcher loads none
        FleetService(hub).skills.publish(build_skill(LIBRARY / "digits", version, [], dist))
    hub.store.create_group("cameras", "kind=camera")
    fleet = Fleet(tmp_path / "logs")
    fleet.start("hub", ["hub", "serve", "--home", str(home)])
    try:
        wait_for_port(port)  # the hub subscribes on the broker before it opens this port
        if mqtt_url:
            yield HubProcess(hub, mqtt_url, MQTT_AGENTS)
        else:
            yield HubProcess(hub, f"grpc://127.0.0.1:{port}", AGENTS)
    finally:
        fleet.stop_all()
        hub.close()
        if mqtt_url:
            clear_retained(mqtt_url)


def _build(tmp_path: Path, url: str, n: int) -> list[tuple[Agent, FakeLauncher]]:
    root = tmp_path / "hub" / "trust" / "metadata" / "root.json"
    agents = []
    for i in range(n):
        config = AgentConfig(
            hub_url=url,
            device_id=f"sim-{i:04d}",
            state_dir=tmp_path / "agents" / f"sim-{i:04d}",
            labels={"kind": "camera"},
            trusted_root=root,
            reconcile_interval_s=5.0,
            telemetry_window_s=5.0,
            insecure=True,
        )
        launcher = FakeLauncher()
        agents.append((build_agent(config, PROFILE, launcher=launcher), launcher))
    return agents


def _running(agent: Agent, version: str) -> bool:
    state = agent.reconciler.states.get("digits")
    return state is not None and (state.version, state.state) == (version, "running")


def _hub_sees_all(hub: Hub, agents: list[Agent], version: str) -> bool:
    for agent in agents:
        report = hub.store.reported_for(agent.config.device_id)
        seen = {(s.name, s.version, s.state) for s in report.skills} if report else set()
        if ("digits", version, "running") not in seen:
            return False
    return True


async def _converge(hub: Hub, agents: list[Agent], version: str) -> float:
    """Deploy ``version`` and wait until every agent runs it and the hub has heard so."""
    started = time.monotonic()
    await asyncio.to_thread(
        functools.partial(
            hub.store.create_deployment, "digits", version, "cameras", now_ms=now_ms()
        )
    )
    await async_wait_until(
        lambda: all(_running(a, version) for a in agents),
        CONVERGE_S,
        f"{len(agents)} agents to run digits {version}",
        interval_s=0.2,
    )
    await asyncio.to_thread(
        wait_until,
        lambda: _hub_sees_all(hub, agents, version),
        CONVERGE_S,
        f"the hub to see {len(agents)} agents running {version}",
        0.5,
    )
    return time.monotonic() - started


@pytest.mark.slow
def test_many_agents_in_one_process_converge_on_a_deployment_and_an_upgrade(
    tmp_path: Path, hub: HubProcess
) -> None:
    built = _build(tmp_path, hub.url, hub.agents)
    agents = [agent for agent, _ in built]
    timings: dict[str, float] = {}

    async def main() -> None:
        # Each agent's TUF client waits on a worker thread while its fetch runs on this loop.
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=64))
        stop = asyncio.Event()
        runs = [asyncio.create_task(a.run(stop)) for a in agents]
        try:
            started = time.monotonic()
            await asyncio.to_thread(
                wait_until,
                lambda: len(hub.hub.store.list_devices()) == len(agents),
                CONVERGE_S,
                f"{len(agents)} devices to register",
                0.5,
            )
            timings["register"] = time.monotonic() - started
            timings["deploy"] = await _converge(hub.hub, agents, "1.0.0")
            timings["upgrade"] = await _converge(hub.hub, agents, "2.0.0")
        finally:
            stop.set()
            results = await asyncio.gather(*runs, return_exceptions=True)
        assert [r for r in results if r is not None] == []

    asyncio.run(main())
    print(f"\n{len(agents)} agents over {hub.url.split(':')[0]}: {timings}")
    for _, launcher in built:
        # One start per version: the upgrade stopped 1.0.0 and started 2.0.0, nothing more.
        assert [p.manifest.version for p in launcher.launched] == ["1.0.0", "2.0.0"]
        assert [p.stopped for p in launcher.launched] == [True, True]
