"""Staged rollouts end to end: a real hub process, its leader's rollout loop, 50 real agents.

The agents are real :class:`edge_agent.agent.Agent` objects (real outbox,
installs, TUF client and gRPC transport) sharing this process's event loop;
only the skill launcher is a fake, told which devices fail to start 2.0.0
(as a bad build fails on some hardware). The deployment is made through the
fleet service, as ``edgeskill deploy create`` makes it, and moved along by the
hub's leader.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from cloud.hub import Hub
from cloud.rollout.state import RolloutState
from cloud.service import FleetService
from edge_agent.agent import Agent
from edge_agent.config import AgentConfig
from edge_agent.wiring import build_agent
from tests.fakes.fake_launcher import PROFILE, FakeLauncher
from tests.support import Fleet, async_wait_until, free_port, wait_for_port
from tests.support.skillkit import LIBRARY, build_skill

AGENTS = 50
TIMEOUT_S = 60.0
#: Canary of 20% (10 devices), then everyone; gates need 10 samples, no soak, no wait.
PLAN = """
strategy = "canary"
canary = "20%"
wave_interval_s = 0
[gates]
install_failure = "10%"
health = "10%"
"""


@dataclass
class Rig:
    """The hub (its home opened here), its fleet service and the agents with their launchers."""

    hub: Hub
    fleet: FleetService
    agents: list[tuple[Agent, FakeLauncher]]


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    port = free_port()
    hub = Hub.init(tmp_path / "hub", grpc_bind=f"127.0.0.1:{port}", insecure=True)
    fleet = FleetService(hub)
    for version in ("1.0.0", "2.0.0"):  # no model files: the fake launcher loads none
        fleet.skills.publish(build_skill(LIBRARY / "digits", version, [], tmp_path / "dist"))
    fleet.groups.create("cameras", "kind=camera")
    procs = Fleet(tmp_path / "logs")
    procs.start("hub", ["hub", "serve", "--home", str(tmp_path / "hub"), "--heartbeat", "2"])
    root = tmp_path / "hub" / "trust" / "metadata" / "root.json"
    agents = []
    for i in range(AGENTS):
        device = f"sim-{i:04d}"
        config = AgentConfig(
            hub_url=f"grpc://127.0.0.1:{port}",
            device_id=device,
            state_dir=tmp_path / "agents" / device,
            labels={"kind": "camera"},
            trusted_root=root,
            reconcile_interval_s=5.0,
            telemetry_window_s=5.0,
            insecure=True,
        )
        launcher = FakeLauncher()
        agents.append((build_agent(config, PROFILE, launcher=launcher), launcher))
    try:
        wait_for_port(port)
        yield Rig(hub, fleet, agents)
    finally:
        procs.stop_all()
        hub.close()


def _runs(agent: Agent, version: str) -> bool:
    state = agent.reconciler.states.get("digits")
    return state is not None and (state.version, state.state) == (version, "running")


def _back_on(agent: Agent, version: str) -> bool:
    """Runs ``version``, or rolled back to it on its own after the newer one failed."""
    state = agent.reconciler.states.get("digits")
    return state is not None and state.version == version and state.state != "failed"


def _rollout(rig: Rig, dep_id: int) -> tuple[str, RolloutState]:
    rec = rig.hub.store.rollouts_of([dep_id])[dep_id]
    return rec.phase, RolloutState.from_json(rec.state)


async def _wait(check: Callable[[], bool], what: str) -> None:
    await async_wait_until(check, TIMEOUT_S, what, interval_s=0.2)


def _drive(rig: Rig, failing: set[str], scenario: Callable[[], object]) -> float:
    """Run the agents, converge them on 1.0.0, then run ``scenario``; its seconds."""
    for agent, launcher in rig.agents:
        if agent.config.device_id in failing:
            launcher.fail_versions = frozenset({"2.0.0"})
    agents = [agent for agent, _ in rig.agents]

    async def main() -> float:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=32))
        stop = asyncio.Event()
        runs = [asyncio.create_task(a.run(stop)) for a in agents]
        try:
            await asyncio.to_thread(rig.fleet.deployments.create, "digits", "1.0.0", "cameras")
            await _wait(lambda: all(_runs(a, "1.0.0") for a in agents), "all agents on 1.0.0")
            started = time.monotonic()
            await scenario()  # type: ignore[misc]
            return time.monotonic() - started
        finally:
            stop.set()
            results = await asyncio.gather(*runs, return_exceptions=True)
            assert [r for r in results if r is not None] == []

    return asyncio.run(main())


def _launched(launcher: FakeLauncher) -> list[str]:
    return [p.manifest.version for p in launcher.launched]


@pytest.mark.slow
def test_a_canary_with_a_fifth_of_installs_failing_stops_at_its_gate_and_rolls_back(
    rig: Rig,
) -> None:
    failing = {f"sim-{i:04d}" for i in range(0, AGENTS, 5)}  # 20% of the fleet
    agents = [agent for agent, _ in rig.agents]
    found: dict[str, object] = {}

    async def scenario() -> None:
        dep = await asyncio.to_thread(
            rig.fleet.deployments.create, "digits", "2.0.0", "cameras", plan=PLAN
        )
        found["id"] = dep.id
        await _wait(lambda: _rollout(rig, dep.id)[0] == "rolled_back", "the rollout to roll back")
        await _wait(lambda: all(_back_on(a, "1.0.0") for a in agents), "every agent on 1.0.0")

    seconds = _drive(rig, failing, scenario)
    dep_id = int(found["id"])  # type: ignore[call-overload]
    state = _rollout(rig, dep_id)[1]
    moved = set(state.reverted)
    assert len(moved) == 10 and state.waves_opened == 1  # stopped at the canary
    assert state.reason.startswith("gate failed: install failures")
    assert len(moved & failing) * 10 > len(moved)  # over the 10% limit, so the gate had to fail
    for agent, launcher in rig.agents:
        device, versions = agent.config.device_id, _launched(launcher)
        if device not in moved:
            assert versions == ["1.0.0"], device  # never reached by the rollout
        elif device not in failing:
            assert versions == ["1.0.0", "2.0.0", "1.0.0"], device  # moved, and moved back
    status = rig.fleet.deployments.status(dep_id)[0]
    assert status.state == "aborted"
    assert status.rollout is not None and status.rollout.phase == "rolled_back"
    assert rig.fleet.deployments.rollout(dep_id).phase == "rolled_back"  # type: ignore[union-attr]
    assert rig.fleet.deployments.rollout(dep_id - 1) is None  # all at once
    old = rig.fleet.deployments.get(dep_id - 1)
    assert old.state == "active"
    log = [e.message for e in rig.fleet.events.recent(kind="deployment", limit=100)]
    assert any("canary opened: 10 -> 2.0.0 (of 50 devices)" in m for m in log), log
    assert any("rollout rolled back: gate failed: install failures" in m for m in log), log
    print(f"\ncanary of 10 in 50 rolled back in {seconds:.1f} s")


@pytest.mark.slow
def test_a_paused_rollout_holds_its_waves_then_completes_and_supersedes(rig: Rig) -> None:
    failing = {"sim-0049"}  # 2% of the fleet: under the 10% limit
    agents = [agent for agent, _ in rig.agents]
    found: dict[str, object] = {}

    async def scenario() -> None:
        dep = await asyncio.to_thread(
            rig.fleet.deployments.create, "digits", "2.0.0", "cameras", plan=PLAN
        )
        found["id"] = dep.id
        await _wait(lambda: _rollout(rig, dep.id)[1].waves_opened == 1, "the canary to open")
        await asyncio.to_thread(rig.fleet.deployments.pause, dep.id)
        canary = set(_rollout(rig, dep.id)[1].admitted)

        def reported() -> bool:  # the leader has read every canary device's outcome
            phase, state = _rollout(rig, dep.id)
            done = {d for d in canary if d in state.outcomes and state.outcomes[d][1] == "2.0.0"}
            return phase == "paused" and done | (canary & failing) == canary

        await _wait(reported, "the paused rollout to see its canary report")
        phase, state = _rollout(rig, dep.id)
        assert (phase, len(state.admitted), state.waves_opened) == ("paused", 10, 1)
        found["held"] = sum(_runs(a, "2.0.0") for a in agents)
        await asyncio.to_thread(rig.fleet.deployments.resume, dep.id)
        await _wait(lambda: _rollout(rig, dep.id)[0] == "completed", "the rollout to complete")
        rest = [a for a in agents if a.config.device_id not in failing]
        await _wait(lambda: all(_runs(a, "2.0.0") for a in rest), "the fleet on 2.0.0")

    seconds = _drive(rig, failing, scenario)
    dep_id = int(found["id"])  # type: ignore[call-overload]
    assert int(found["held"]) <= 10  # type: ignore[call-overload]
    assert rig.fleet.deployments.get(dep_id - 1).state == "superseded"
    status = rig.fleet.deployments.status(dep_id)[0]
    assert status.rollout is not None and status.rollout.phase == "completed"
    assert status.count("succeeded") == AGENTS - len(failing)
    for agent, launcher in rig.agents:  # every good device moved once, straight to 2.0.0
        if agent.config.device_id not in failing:
            assert _launched(launcher) == ["1.0.0", "2.0.0"], agent.config.device_id
    log = [e.message for e in rig.fleet.events.recent(kind="deployment", limit=100)]
    assert any("rollout paused: paused by operator" in m for m in log), log
    assert any("rollout resumed" in m for m in log), log
    assert any("rollout completed: 50 devices moved" in m for m in log), log
    print(f"\ncanary, pause, resume and completion on 50 devices in {seconds:.1f} s")
