"""The agent's Prometheus endpoint, scraped over real HTTP on 127.0.0.1."""

from __future__ import annotations

import asyncio
import socket
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from edge_agent.agent import Agent
from edge_agent.config import AgentConfig
from edge_agent.errors import AgentError
from edge_agent.metrics import MAX_SERIES, InferenceCounter, start_agent_metrics
from edge_agent.outbox import Outbox
from edge_agent.reconciler import SkillState
from edge_agent.wiring import build_agent
from edge_agent.workload import ReplaySource, WindowStats
from protos import make_envelope, pb
from protos.metrics_server import MetricsBindError, parse_bind
from skills.trust import TrustRepository
from tests.fakes.fake_launcher import FakeLauncher
from tests.support import async_wait_until, free_port

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    """Every sample on the endpoint, keyed by name and sorted labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def refused(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def config(tmp_path: Path, metrics_bind: str | None = None) -> AgentConfig:
    root = tmp_path / "hub-trust" / "metadata" / "root.json"
    if not root.exists():
        TrustRepository.init(tmp_path / "hub-trust")
    # Nothing listens on the hub port: the agent never connects.
    return AgentConfig(
        hub_url=f"grpc://127.0.0.1:{free_port()}",
        device_id="cam-1",
        state_dir=tmp_path / "agent",
        trusted_root=root,
        metrics_bind=metrics_bind,
    )


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    agent = build_agent(config(tmp_path))
    yield agent
    agent.outbox.close()


def heartbeat() -> pb.Envelope:
    return make_envelope("cam-1", heartbeat=pb.Heartbeat(uptime_s=1))


def test_endpoint_shows_outbox_skills_inferences_and_session(agent: Agent) -> None:
    server = start_agent_metrics(agent, "127.0.0.1:0")
    try:
        assert scrape(server.port)[("edgeskill_agent_outbox_pending", ())] == 0
        asyncio.run(agent.enqueue(heartbeat()))
        asyncio.run(agent.enqueue(heartbeat()))
        agent.reconciler.states["digits"] = SkillState("digits", "1.0.0", "running")
        agent.reconciler.states["kws"] = SkillState("kws", "", "failed", "bad bundle")
        agent.inference_counts.add("digits", "1.0.0", 7)
        samples = scrape(server.port)
    finally:
        server.stop()
    assert samples[("edgeskill_agent_outbox_pending", ())] == 2
    assert samples[("edgeskill_agent_skills", (("state", "running"),))] == 1
    assert samples[("edgeskill_agent_skills", (("state", "failed"),))] == 1
    assert samples[("edgeskill_agent_skills", (("state", "installing"),))] == 0
    key = ("edgeskill_agent_inferences_total", (("skill", "digits"), ("version", "1.0.0")))
    assert samples[key] == 7
    assert samples[("edgeskill_agent_connected", ())] == 0
    assert samples[("edgeskill_agent_outbox_dropped_total", ())] == 0
    assert refused(server.port)


def test_outbox_drops_are_counted_as_telemetry_reports_them(tmp_path: Path) -> None:
    built = build_agent(config(tmp_path))
    built.outbox.close()
    agent = Agent(
        built.config,
        profile=built.profile,
        outbox=Outbox(tmp_path / "small.db", max_entries=1),
        installs=built.installs,
        fetch_target=Path,
        launcher=FakeLauncher(),
        transport_factory=lambda: pytest.fail("the agent does not connect in this test"),
    )
    for version in ("1", "2", "3"):  # each window's telemetry pushes the one before out
        window = WindowStats("digits", version)
        window.record({"label": 1}, 1.0, 1)
        agent.windows[("digits", version)] = window
    asyncio.run(agent._flush_windows())
    server = start_agent_metrics(agent, "127.0.0.1:0")
    try:
        samples = scrape(server.port)
    finally:
        server.stop()
    # Two were dropped; the first drop was reported with the third window, the second waits.
    assert samples[("edgeskill_agent_outbox_dropped_total", ())] == 1
    assert samples[("edgeskill_agent_outbox_pending", ())] == 1


def test_run_serves_metrics_until_stopped(tmp_path: Path) -> None:
    port = free_port()
    agent = build_agent(config(tmp_path, metrics_bind=f"127.0.0.1:{port}"))

    async def main() -> Samples:
        stop = asyncio.Event()
        running = asyncio.create_task(agent.run(stop))
        await async_wait_until(lambda: not refused(port), 10, "the metrics endpoint")
        samples = await asyncio.to_thread(scrape, port)
        stop.set()
        await running
        return samples

    samples = asyncio.run(main())
    assert samples[("edgeskill_agent_connected", ())] == 0
    assert refused(port)


def test_run_refuses_a_malformed_metrics_address(tmp_path: Path) -> None:
    agent = build_agent(config(tmp_path, metrics_bind="localhost"))
    with pytest.raises(AgentError, match="bad metrics address"):
        asyncio.run(agent.run(asyncio.Event()))
    agent.outbox.close()


@pytest.mark.parametrize("bind", ["9464", "127.0.0.1:", ":9464", "127.0.0.1:70000", "h:-1"])
def test_a_malformed_address_is_refused(bind: str, tmp_path: Path) -> None:
    with pytest.raises(MetricsBindError):
        parse_bind(bind)
    agent = build_agent(config(tmp_path))
    with pytest.raises(AgentError, match="bad metrics address"):
        start_agent_metrics(agent, bind)
    agent.outbox.close()


def test_inference_series_are_capped() -> None:
    counts = InferenceCounter()
    for i in range(MAX_SERIES + 10):
        counts.add("digits", f"1.0.{i}")
    counts.add("digits", "1.0.0", 4)
    snapshot = counts.snapshot()
    assert len(snapshot) == MAX_SERIES
    assert snapshot[("digits", "1.0.0")] == 5


def test_agents_of_one_process_can_share_one_source_read_once(tmp_path: Path) -> None:
    path = tmp_path / "inputs.npz"
    np.savez(path, x=np.zeros((4, 1, 8, 8), np.float32), y=np.arange(4))
    shared = ReplaySource.load(path)
    first = build_agent(replace(config(tmp_path), source=path), source=shared)
    second = build_agent(
        replace(config(tmp_path / "b"), device_id="cam-2", source=path), source=shared
    )
    try:
        assert first._source is shared and second._source is shared  # not read again
    finally:
        first.outbox.close()
        second.outbox.close()
