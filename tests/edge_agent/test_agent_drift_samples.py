"""Drift samples from a running skill into the agent's durable outbox, opt-in per deployment.

Real :class:`Agent` objects run on the test's event loop with a real outbox and
installs; the skill is the built-in digits bundle started by a fake launcher
whose answers are read off each frame (so the test knows which inputs were the
least sure), and the hub is a fake transport that hands over the desired state
and acknowledges only when the test says so. No real hub is needed: what the
agent owes the hub is a committed outbox row that only the hub's ack releases.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import edge_agent.agent as agent_module
from edge_agent.agent import Agent
from edge_agent.config import AgentConfig
from edge_agent.drift_samples import SampleCaps
from edge_agent.errors import TransportError
from edge_agent.installs import InstallStore
from edge_agent.outbox import Outbox
from edge_agent.transport import AgentTransport
from edge_agent.workload import ReplaySource
from protos import decode_envelope, kind_of, make_envelope, pb
from skills.tensor_codec import decode_protos
from tests.fakes.fake_launcher import PROFILE, FakeLauncher
from tests.support import async_wait_until
from tests.support.skillkit import LIBRARY, build_skill

TIMEOUT_S = 30.0
ITEMS = 300
ON = {"drift.samples": "on"}


class FakeHub(AgentTransport):
    """Gives the agent ``desired`` on connect and records what it sends; acks on request."""

    def __init__(self, desired: pb.DesiredState | None = None) -> None:
        self.desired = desired
        self.sent: list[pb.Envelope] = []
        self.inbox: asyncio.Queue[pb.Envelope] = asyncio.Queue()

    async def connect(self, register: pb.Envelope) -> None:
        await self.inbox.put(make_envelope("hub", welcome=pb.Welcome(heartbeat_s=60)))
        if self.desired is not None:
            await self.inbox.put(make_envelope("hub", desired=self.desired))

    async def send(self, env: pb.Envelope) -> None:
        self.sent.append(env)

    async def ack(self, ids: list[str]) -> None:
        await self.inbox.put(make_envelope("hub", ack=pb.Ack(ids=ids)))

    async def receive(self) -> pb.Envelope:
        return await self.inbox.get()

    async def _fetch(self, path: str, offset: int, max_bytes: int) -> AsyncIterator[bytes]:
        raise TransportError("this fake serves no files")
        yield b""  # pragma: no cover - makes this an async generator

    async def close(self) -> None:
        return None


def read_off(item: Mapping[str, Any]) -> dict[str, Any]:
    """The fake skill: class and confidence written into the frame's first pixels."""
    pixels = np.asarray(item["image"])
    return {"label": int(pixels[0, 0]), "confidence": float(pixels[0, 1])}


def frames(rng: np.random.Generator) -> tuple[ReplaySource, np.ndarray]:
    """Frames numbered in their third pixel, with the answers in the first two; confidences."""
    x = rng.random((ITEMS, 8, 8)).astype(np.float32)
    confidence = x[:, 0, 1].copy()
    x[:, 0, 0] = rng.integers(0, 10, ITEMS)
    x[:, 0, 2] = np.arange(ITEMS)
    return ReplaySource(x=x, y=(np.arange(ITEMS) % 10).astype(np.int64)), confidence


def desired(config: Mapping[str, str]) -> pb.DesiredState:
    spec = pb.SkillSpec(
        name="digits", version="1.0.0", target_name="digits/digits-1.0.0.skill", config=config
    )
    return pb.DesiredState(generation=1, skills=[spec])


def new_agent(
    tmp_path: Path,
    hub: FakeHub,
    source: ReplaySource | None,
    bundle_config: dict[str, str] | None = None,
    caps: SampleCaps | None = None,
) -> Agent:
    config = AgentConfig(
        hub_url="grpc://127.0.0.1:9",
        device_id="cam-1",
        state_dir=tmp_path / "agent",
        telemetry_window_s=60.0,  # one window for the whole stream: closed at the stop
        reconcile_interval_s=0.5,
        source_rate_hz=2000.0,
        insecure=True,
        drift_sample_caps=caps or SampleCaps(),
    )
    config.state_dir.mkdir(parents=True, exist_ok=True)
    bundle = build_skill(LIBRARY / "digits", "1.0.0", [], tmp_path / "dist", config=bundle_config)
    return Agent(
        config,
        profile=PROFILE,
        outbox=Outbox(config.state_dir / "outbox.db"),
        installs=InstallStore(config.state_dir / "installs"),
        fetch_target=lambda _name: bundle,
        launcher=FakeLauncher(answer=read_off),
        transport_factory=lambda: hub,
        source=source,
    )


def answered(agent: Agent) -> int:
    return agent.inference_counts.snapshot().get(("digits", "1.0.0"), 0)


async def run_until_answered(agent: Agent) -> None:
    """Run the agent until every frame is answered, then stop it (closing the window)."""
    stop = asyncio.Event()
    running = asyncio.create_task(agent.run(stop))
    await async_wait_until(lambda: answered(agent) == ITEMS, TIMEOUT_S, "every frame answered")
    stop.set()
    await running


def stored(state: Path, kind: str) -> list[pb.Envelope]:
    """The envelopes of one kind waiting in a stopped agent's outbox."""
    with Outbox(state / "outbox.db") as box:
        envs = [decode_envelope(e.payload) for e in box.pending(limit=1000)]
    return [env for env in envs if kind_of(env) == kind]


def test_the_least_sure_inputs_wait_in_the_outbox_until_the_hub_acks_even_across_a_restart(
    tmp_path: Path,
) -> None:
    source, confidence = frames(np.random.default_rng(0))
    config = {**ON, "drift.samples_max": "12", "drift.samples_below": "0.5"}
    first = FakeHub(desired(config))
    asyncio.run(run_until_answered(new_agent(tmp_path, first, source)))

    # Stopped before any ack: the window's samples are a committed outbox row.
    (env,) = stored(tmp_path / "agent", "drift_samples")
    assert sum(t.telemetry.inferences for t in stored(tmp_path / "agent", "telemetry")) == ITEMS
    message = env.drift_samples
    assert (message.skill, message.version) == ("digits", "1.0.0")
    lowest = np.sort(confidence[confidence < 0.5])[:12]
    assert [s.confidence for s in message.samples] == lowest.tolist()
    for sample in message.samples:  # the very frames, as the device saw them, with labels
        pixels = decode_protos([sample.input], ["image"])["image"]
        i = int(pixels[0, 2])
        np.testing.assert_array_equal(pixels, source.x[i])
        assert (sample.predicted, sample.label) == (int(source.x[i, 0, 0]), i % 10)
        assert sample.input.name == "image" and sample.seen_at_ms > 0

    # Started again on the same state folder (no new input): the row goes up, and stays
    # until the hub acknowledges it.
    second_hub = FakeHub()
    second = new_agent(tmp_path, second_hub, None)

    def sent_ids() -> set[str]:
        return {e.id for e in second_hub.sent if kind_of(e) != "heartbeat"}

    async def resend() -> None:
        stop = asyncio.Event()
        running = asyncio.create_task(second.run(stop))
        await async_wait_until(lambda: env.id in sent_ids(), TIMEOUT_S, "the samples resent")
        assert env.id in {e.msg_id for e in second.outbox.pending(limit=1000)}
        await second_hub.ack(sorted(sent_ids()))
        await async_wait_until(
            lambda: env.id not in {e.msg_id for e in second.outbox.pending(limit=1000)},
            TIMEOUT_S,
            "the ack to release the samples",
        )
        stop.set()
        await running

    asyncio.run(resend())
    (resent,) = [e for e in second_hub.sent if e.id == env.id]
    assert resent.drift_samples == message
    assert stored(tmp_path / "agent", "drift_samples") == []


@pytest.mark.parametrize(
    ("deployment", "bundle_config", "caps", "warned"),
    [
        ({}, None, None, 0),  # off by default
        ({"drift.samples": "yes"}, None, None, 1),  # a bad switch
        ({**ON, "drift.samples_max": "many"}, None, None, 1),  # a bad value
        ({}, ON, None, 0),  # the bundle's own defaults cannot opt in
        (ON, None, SampleCaps(max_count=0), 1),  # the device owner allows none
    ],
    ids=["default", "bad-switch", "bad-value", "bundle-default", "owner-none"],
)
def test_no_samples_leave_the_device_unless_its_deployment_opts_in(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    deployment: dict[str, str],
    bundle_config: dict[str, str] | None,
    caps: SampleCaps | None,
    warned: int,
) -> None:
    source, _ = frames(np.random.default_rng(1))
    hub = FakeHub(desired(deployment))
    agent = new_agent(tmp_path, hub, source, bundle_config, caps)
    with caplog.at_level(logging.WARNING, logger="edge_agent.drift_samples"):
        asyncio.run(run_until_answered(agent))
    assert stored(tmp_path / "agent", "drift_samples") == []
    assert sum(t.telemetry.inferences for t in stored(tmp_path / "agent", "telemetry")) == ITEMS
    assert not [e for e in hub.sent if kind_of(e) == "drift_samples"]
    assert caplog.text.count("uploads no drift samples") == warned


def test_samples_give_way_when_the_outbox_is_backed_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A hub that never acks, or a long outage: telemetry keeps its place in the outbox.
    monkeypatch.setattr(agent_module, "_SAMPLES_BACKLOG", 1)
    source, confidence = frames(np.random.default_rng(2))
    agent = new_agent(tmp_path, FakeHub(desired(ON)), source)
    asyncio.run(run_until_answered(agent))
    assert stored(tmp_path / "agent", "drift_samples") == []
    assert sum(t.telemetry.inferences for t in stored(tmp_path / "agent", "telemetry")) == ITEMS
    assert agent.drift_samples_skipped == min(16, int((confidence < 0.6).sum()))
