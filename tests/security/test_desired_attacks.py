"""Forged desired state: a real hub with its director key, a real agent, and an attacker.

The attacker speaks for the hub on the device's channel (a rogue gRPC hub the
device was pointed at, or a retained message left on the broker) and sends desired states
that are unsigned, signed by another key, replayed, reordered, meant for another
device, expired, or carry a huge generation. Each must be refused and counted
on the agent, reported to the real hub and counted there, while the device
keeps running its last good version and still follows the next real deployment.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import grpc.aio
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from cloud.director import HubDirector
from cloud.grpc_server import start_grpc_server
from cloud.hub import Hub
from cloud.hubcore import HubCore, running
from cloud.mqtt_client import clear_retained
from cloud.mqtt_server import start_mqtt_server
from cloud.service import FleetService
from edge_agent.agent import Agent
from edge_agent.config import AgentConfig
from edge_agent.transport import open_transport
from edge_agent.wiring import build_agent
from protos import decode_envelope, make_envelope, pb
from protos.envelope import now_ms
from protos.topics import MqttEndpoint
from skills.trust.director import DirectorKey, Instruction
from tests.fakes.fake_launcher import PROFILE, FakeLauncher
from tests.support import async_wait_until
from tests.support.services import mqtt_host_port, mqtt_url
from tests.support.skillkit import build_skill

SKILL_TOML = """
[skill]
name = "guard"
version = "{version}"
entrypoint = "guard_skill:GuardSkill"
"""
SKILL_CODE = """
from skills.sdk import Skill


class GuardSkill(Skill):
    def process(self, item):
        return {"ok": True}
"""
_SERVICE = pb.DESCRIPTOR.services_by_name["Hub"].full_name


def _bundle(tmp_path: Path, version: str) -> Path:
    src = tmp_path / f"src-{version}"
    (src / "control").mkdir(parents=True)
    (src / "skill.toml").write_text(SKILL_TOML.format(version=version))
    (src / "control" / "guard_skill.py").write_text(SKILL_CODE)
    return build_skill(src, version, [], tmp_path / "dist")


def _signed(data: bytes) -> pb.Envelope:
    return make_envelope("cam-1", signed_desired=pb.SignedDesired(instruction=data))


def _sign(key: DirectorKey, device: str, counter: int, expires_ms: int) -> bytes:
    nothing = pb.DesiredState(generation=2**62).SerializeToString()  # would remove every skill
    return key.sign(Instruction(device, counter, expires_ms, nothing)).to_bytes()


@dataclass
class RogueHub:
    """A gRPC server that answers ``Connect`` like a hub, then sends forged desired states."""

    forged: list[pb.Envelope]
    received: list[pb.Envelope] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    async def connect(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        register = decode_envelope(await anext(requests))
        welcome = make_envelope(register.device_id, welcome=pb.Welcome(heartbeat_s=60))
        yield welcome.SerializeToString()
        for env in self.forged:
            yield env.SerializeToString()
        reader = asyncio.ensure_future(self._read(requests))
        await self.done.wait()
        reader.cancel()

    async def _read(self, requests: AsyncIterator[bytes]) -> None:
        async for payload in requests:  # nothing is acknowledged: the outbox keeps it
            self.received.append(decode_envelope(payload))

    async def start(self) -> tuple[grpc.aio.Server, int]:
        server = grpc.aio.server()
        handler = grpc.method_handlers_generic_handler(
            _SERVICE, {"Connect": grpc.stream_stream_rpc_method_handler(self.connect)}
        )
        server.add_generic_rpc_handlers((handler,))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server, port


def _attacks(hub: Hub, director: HubDirector, first: bytes) -> dict[str, pb.Envelope]:
    genuine_b = hub.store.instruction_for("cam-2")
    assert genuine_b is not None
    later = now_ms() + 3_600_000
    return {
        "unsigned": make_envelope("cam-1", desired=pb.DesiredState(generation=2**62)),
        "unknown-key": _signed(_sign(DirectorKey.generate(), "cam-1", 2**40, later)),
        "foreign": _signed(genuine_b.instruction),
        "reordered": _signed(first),
        "replayed": _signed(_sign(director.key, "cam-1", 2, later)),
        "expired": _signed(_sign(director.key, "cam-1", 2**40, now_ms() - 1)),
    }


def test_forged_desired_states_over_grpc_are_refused_counted_and_reported(
    tmp_path: Path,
) -> None:
    hub = Hub.init(tmp_path / "home", insecure=True)
    service = FleetService(hub)
    director = HubDirector(hub.home)
    v1, v2 = (service.skills.publish(_bundle(tmp_path, v)) for v in ("1.0.0", "2.0.0"))
    assert (v1.version.version, v2.version.version) == ("1.0.0", "2.0.0")
    launcher = FakeLauncher()

    async def scenario() -> None:
        async with running(HubCore(hub.store, hub.trust, director=director)) as core:
            server, port = await start_grpc_server(core, "127.0.0.1:0")
            rogue = RogueHub([])
            rogue_server, rogue_port = await rogue.start()
            target = {"url": f"grpc://127.0.0.1:{port}", "hub": f"grpc://127.0.0.1:{port}"}
            config = AgentConfig(
                hub_url=target["url"],
                device_id="cam-1",
                state_dir=tmp_path / "agent",
                trusted_root=service.trusted_root,
                director_key=director.public_path,
                labels={"kind": "camera"},
                reconcile_interval_s=0.5,
                max_backoff_s=0.2,
            )
            agent = build_agent(
                config,
                PROFILE,
                launcher=launcher,
                transports=lambda: open_transport(target["url"], "cam-1"),
            )
            stop = asyncio.Event()
            task = asyncio.create_task(agent.run(stop))
            try:
                await _attack(hub, service, core, director, agent, rogue, target, rogue_port)
            finally:
                stop.set()
                await task
                await rogue_server.stop(None)
                await server.stop(None)

    try:
        asyncio.run(scenario())
    finally:
        service.close()


async def _attack(
    hub: Hub,
    service: FleetService,
    core: HubCore,
    director: HubDirector,
    agent: Agent,
    rogue: RogueHub,
    target: dict[str, str],
    rogue_port: int,
) -> None:
    await async_wait_until(lambda: agent.gate.last_counter == 1, 20, "the first instruction")
    first = agent.gate._accepted  # the genuine instruction of generation 0
    hub.store.register_device("cam-2", {"kind": "camera"}, {}, now_ms=now_ms())
    hub.store.create_group("cams", "kind=camera")
    hub.store.create_deployment("guard", "1.0.0", "cams", now_ms=now_ms())
    await async_wait_until(
        lambda: agent.reconciler.version_of("guard") == "1.0.0", 30, "v1 running"
    )
    await async_wait_until(lambda: hub.store.instruction_for("cam-2") is not None, 10, "cam-2")
    attacks = _attacks(hub, director, first)
    rogue.forged[:] = attacks.values()
    # The device is pointed at the rogue hub (or a man in the middle): its session drops.
    target["url"] = f"grpc://127.0.0.1:{rogue_port}"
    await _drop_session(agent)
    expected = {("desired-refused", reason): 1 for reason in attacks}
    await async_wait_until(
        lambda: dict(agent.security.totals) == expected, 20, "every forged state refused"
    )
    assert agent.reconciler.version_of("guard") == "1.0.0"
    assert agent.reconciler.states["guard"].state == "running"
    assert agent.gate.last_counter == 2
    # Back on the real hub: the refusals reach it, and the next real deployment is followed.
    target["url"] = target["hub"]
    rogue.done.set()
    await async_wait_until(
        lambda: dict(core.security_events) == expected, 20, "the hub to count every refusal"
    )
    stored = {(e.kind, e.reason): e.count for e in hub.store.security_events("cam-1")}
    assert stored == expected
    hub.store.create_deployment("guard", "2.0.0", "cams", now_ms=now_ms())
    await async_wait_until(
        lambda: agent.reconciler.version_of("guard") == "2.0.0", 30, "v2 running"
    )
    assert dict(agent.security.totals) == expected


async def _drop_session(agent: Agent) -> None:
    transport = agent.transport
    assert transport is not None
    await transport.close()


def test_forged_desired_states_left_on_the_broker_are_refused_counted_and_reported(
    tmp_path: Path,
) -> None:
    # Over MQTT the attacker is anyone who can publish on the device's down topic of a
    # broker without the generated ACL (the README's old default): each forged state
    # is published retained, as the attack report did it.
    url = mqtt_url(f"es-test/{uuid.uuid4().hex[:12]}", session_expiry=60, keepalive=5)
    hub = Hub.init(tmp_path / "home", insecure=True)
    service = FleetService(hub)
    director = HubDirector(hub.home)
    for version in ("1.0.0", "2.0.0"):
        service.skills.publish(_bundle(tmp_path, version))

    async def scenario() -> None:
        async with running(HubCore(hub.store, hub.trust, director=director)) as core:
            server = await start_mqtt_server(core, url)
            config = AgentConfig(
                hub_url=url,
                device_id="cam-1",
                state_dir=tmp_path / "agent",
                trusted_root=service.trusted_root,
                director_key=director.public_path,
                labels={"kind": "camera"},
                reconcile_interval_s=0.5,
                max_backoff_s=0.2,
            )
            agent = build_agent(config, PROFILE, launcher=FakeLauncher())
            stop = asyncio.Event()
            task = asyncio.create_task(agent.run(stop))
            try:
                await _attack_over_mqtt(hub, core, director, agent, url)
            finally:
                stop.set()
                await task
                await server.stop()

    try:
        asyncio.run(scenario())
    finally:
        service.close()
        clear_retained(url)


async def _attack_over_mqtt(
    hub: Hub, core: HubCore, director: HubDirector, agent: Agent, url: str
) -> None:
    await async_wait_until(lambda: agent.gate.last_counter == 1, 20, "the first instruction")
    first = agent.gate._accepted
    hub.store.register_device("cam-2", {"kind": "camera"}, {}, now_ms=now_ms())
    hub.store.create_group("cams", "kind=camera")
    hub.store.create_deployment("guard", "1.0.0", "cams", now_ms=now_ms())
    await async_wait_until(
        lambda: agent.reconciler.version_of("guard") == "1.0.0", 30, "v1 running"
    )
    await async_wait_until(lambda: hub.store.instruction_for("cam-2") is not None, 10, "cam-2")
    attacks = _attacks(hub, director, first)
    endpoint = MqttEndpoint.parse(url)
    topic = endpoint.topics.down("cam-1", "desired")
    attacker = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    attacker.connect(*mqtt_host_port())
    attacker.loop_start()
    try:
        seen: dict[tuple[str, str], int] = {}
        for reason, env in attacks.items():
            attacker.publish(topic, env.SerializeToString(), qos=1, retain=True).wait_for_publish(5)
            seen[("desired-refused", reason)] = 1
            await async_wait_until(
                lambda want=dict(seen): dict(agent.security.totals) == want, 20, reason
            )
    finally:
        attacker.loop_stop()
        attacker.disconnect()
    assert agent.reconciler.version_of("guard") == "1.0.0"
    assert agent.reconciler.states["guard"].state == "running"
    assert agent.gate.last_counter == 2
    await async_wait_until(
        lambda: dict(core.security_events) == seen, 20, "the hub to count every refusal"
    )
    hub.store.create_deployment("guard", "2.0.0", "cams", now_ms=now_ms())
    await async_wait_until(
        lambda: agent.reconciler.version_of("guard") == "2.0.0", 30, "v2 running"
    )
