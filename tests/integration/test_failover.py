"""Leader failover between real ``edgeskill hub serve`` processes.

On PostgreSQL two hub processes share one store: exactly one leads, and when
it is killed with SIGKILL the other takes over. The time from the kill to the
survivor's metrics saying it leads is measured and printed (run with ``-s``).
On SQLite only one process may serve a home; it leads, and a second one exits
with status 2 and says who serves.
"""

from __future__ import annotations

import asyncio
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cloud.hub import Hub
from cloud.rollout.state import RolloutState
from cloud.service import FleetService
from edge_agent.config import AgentConfig
from edge_agent.wiring import build_agent
from tests.cloud.conftest import postgres_schema_url
from tests.fakes.fake_launcher import PROFILE, FakeLauncher
from tests.support import Fleet, async_wait_until, free_port, wait_for_port, wait_until
from tests.support.skillkit import LIBRARY, build_skill

#: The takeover must finish within this; the election retries every second.
FAILOVER_BOUND_S = 10.0
#: The loops every hub process runs, leader or not (all running).
EVERY_PROCESS = {"desired-notifier": 1, "leader-election": 1}


@dataclass(frozen=True)
class HubProc:
    """One ``hub serve`` child and the port of its metrics endpoint."""

    name: str
    metrics_port: int


def leader_gauges(port: int) -> dict[str, float] | None:
    """The leader gauge and leader-only loop state of one hub; None while it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            body = resp.read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            if sample.name == "edgeskill_hub_leader":
                found["leader"] = sample.value
            elif sample.name == "edgeskill_hub_loop_running":
                found[sample.labels["loop"]] = sample.value
    return found


def start_hubs(
    fleet: Fleet, home: Path, names: list[str], grpc_ports: list[int] | None = None
) -> list[HubProc]:
    hubs = []
    for i, name in enumerate(names):
        metrics_port = free_port()
        grpc_port = grpc_ports[i] if grpc_ports else free_port()
        args = ["hub", "serve", "--home", str(home), "--grpc-bind", f"127.0.0.1:{grpc_port}"]
        fleet.start(name, [*args, "--metrics-bind", f"127.0.0.1:{metrics_port}"])
        hubs.append(HubProc(name, metrics_port))
    return hubs


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    children = Fleet(tmp_path / "logs")
    try:
        yield children
    finally:
        children.stop_all()


@pytest.mark.postgres
@pytest.mark.slow
def test_one_of_two_pg_hubs_leads_and_the_other_takes_over_after_sigkill(
    tmp_path: Path, fleet: Fleet
) -> None:
    with postgres_schema_url() as url:
        Hub.init(tmp_path / "hub", store_url=url, insecure=True).close()  # two on one machine
        hubs = start_hubs(fleet, tmp_path / "hub", ["hub-a", "hub-b"])

        def states() -> list[dict[str, float] | None]:
            return [leader_gauges(h.metrics_port) for h in hubs]

        def one_leads() -> bool:
            seen = states()
            return (
                all(s is not None for s in seen)
                and [s["leader"] for s in seen if s is not None].count(1) == 1
            )

        wait_until(one_leads, 60.0, "both hubs to serve and exactly one to lead", 0.1)
        leader, follower = hubs if (states()[0] or {}).get("leader") == 1 else hubs[::-1]
        assert leader_gauges(leader.metrics_port) == {
            "leader": 1,
            **EVERY_PROCESS,
            "timestamp-refresh": 1,
            "rollouts": 1,
            "drift": 1,
            "metering": 1,
        }
        assert leader_gauges(follower.metrics_port) == {
            "leader": 0,
            **EVERY_PROCESS,
            "timestamp-refresh": 0,
            "rollouts": 0,
            "drift": 0,
            "metering": 0,
        }

        killed_at = time.monotonic()
        fleet.stop(leader.name, signal.SIGKILL)
        wait_until(
            lambda: (leader_gauges(follower.metrics_port) or {}).get("leader") == 1,
            FAILOVER_BOUND_S,
            "the follower to take over",
            0.02,
        )
        failover_s = time.monotonic() - killed_at
        print(f"\nleader failover after SIGKILL: {failover_s:.2f} s (bound {FAILOVER_BOUND_S} s)")
        assert leader_gauges(follower.metrics_port) == {
            "leader": 1,
            **EVERY_PROCESS,
            "timestamp-refresh": 1,
            "rollouts": 1,
            "drift": 1,
            "metering": 1,
        }
        fleet.stop_all()  # before the schema is dropped


@pytest.mark.slow
def test_on_sqlite_the_one_hub_leads_and_a_second_on_its_home_exits_2(
    tmp_path: Path, fleet: Fleet
) -> None:
    home = tmp_path / "hub"
    Hub.init(home).close()
    (first,) = start_hubs(fleet, home, ["hub-a"])
    wait_until(
        lambda: (leader_gauges(first.metrics_port) or {}).get("leader") == 1,
        60.0,
        "the SQLite hub to lead",
        0.1,
    )
    (second,) = start_hubs(fleet, home, ["hub-b"])
    status = fleet.procs["hub-b"].wait(timeout=60)
    assert status == 2
    words = " ".join((tmp_path / "logs" / "hub-b.log").read_text().split())
    pid = fleet.procs["hub-a"].pid
    assert f"error: another `hub serve` (pid {pid}) already serves {home};" in words
    assert leader_gauges(second.metrics_port) is None
    assert (leader_gauges(first.metrics_port) or {}).get("leader") == 1


#: Waves of 10 then the other 20, each held a second once its devices reported.
WAVES_PLAN = """
strategy = "waves"
wave_interval_s = 1
soak_s = 1
[waves]
base_rate_per_min = 10
increment_factor = 2.0
"""
MID_AGENTS = 30


@pytest.mark.postgres
@pytest.mark.slow
def test_a_rollout_carries_on_when_its_leader_is_killed_mid_way_and_moves_no_device_twice(
    tmp_path: Path, fleet: Fleet
) -> None:
    # hub-a leads and runs the rollout loop; the agents talk to hub-b, which only serves
    # them until hub-a is killed with SIGKILL between two waves and hub-b takes the lead.
    with postgres_schema_url() as url:
        home = tmp_path / "hub"
        hub = Hub.init(home, store_url=url, insecure=True)
        service = FleetService(hub)
        try:
            for version in ("1.0.0", "2.0.0"):
                service.skills.publish(build_skill(LIBRARY / "digits", version, [], tmp_path / "d"))
            service.groups.create("cameras", "kind=camera")
            (leader,) = start_hubs(fleet, home, ["hub-a"])
            wait_until(
                lambda: (leader_gauges(leader.metrics_port) or {}).get("leader") == 1,
                60.0,
                "hub-a to lead",
                0.1,
            )
            port = free_port()
            (follower,) = start_hubs(fleet, home, ["hub-b"], [port])
            wait_for_port(port)
            launchers, seconds = _roll_out_across_a_failover(
                tmp_path, fleet, service, hub, (leader, follower), port
            )
            dep = service.deployments.status()[-1]
            assert dep.rollout is not None and dep.rollout.phase == "completed"
            state = RolloutState.from_json(
                hub.store.rollouts_of([dep.deployment.id])[dep.deployment.id].state
            )
            assert len(state.admitted) == MID_AGENTS and state.waves_opened == 2
            for device, launcher in launchers.items():  # each moved once, straight to 2.0.0
                versions = [p.manifest.version for p in launcher.launched]
                assert versions == ["1.0.0", "2.0.0"], device
            log = [e.message for e in service.events.recent(kind="deployment", limit=100)]
            assert sum("opened" in m for m in log) == 2, log
            print(f"\n2 waves over {MID_AGENTS} devices across a leader SIGKILL in {seconds:.1f} s")
        finally:
            fleet.stop_all()  # before the schema is dropped
            service.close()


def _roll_out_across_a_failover(
    tmp_path: Path,
    fleet: Fleet,
    service: FleetService,
    hub: Hub,
    hubs: tuple[HubProc, HubProc],
    port: int,
) -> tuple[dict[str, FakeLauncher], float]:
    leader, follower = hubs
    root = tmp_path / "hub" / "trust" / "metadata" / "root.json"
    launchers = {f"cam-{i:02d}": FakeLauncher() for i in range(MID_AGENTS)}
    agents = [
        build_agent(
            AgentConfig(
                hub_url=f"grpc://127.0.0.1:{port}",
                device_id=device,
                state_dir=tmp_path / "agents" / device,
                labels={"kind": "camera"},
                trusted_root=root,
                reconcile_interval_s=2.0,
                telemetry_window_s=5.0,
                insecure=True,
            ),
            PROFILE,
            launcher=launcher,
        )
        for device, launcher in launchers.items()
    ]

    def runs(version: str) -> bool:
        return all(
            (s := a.reconciler.states.get("digits")) is not None
            and (s.version, s.state) == (version, "running")
            for a in agents
        )

    def rollout() -> RolloutState | None:
        recs = hub.store.rollouts_of([d.id for d in service.deployments.list()])
        return RolloutState.from_json(recs[max(recs)].state) if recs else None

    async def main() -> float:
        stop = asyncio.Event()
        tasks = [asyncio.create_task(a.run(stop)) for a in agents]
        try:
            await asyncio.to_thread(service.deployments.create, "digits", "1.0.0", "cameras")
            await async_wait_until(lambda: runs("1.0.0"), 60, "every agent on 1.0.0", 0.2)
            started = time.monotonic()
            await asyncio.to_thread(
                service.deployments.create, "digits", "2.0.0", "cameras", plan=WAVES_PLAN
            )

            def first_wave_only() -> bool:
                state = rollout()
                return state is not None and state.waves_opened == 1

            await async_wait_until(first_wave_only, 60, "the first wave to open", 0.05)
            await asyncio.to_thread(fleet.stop, leader.name, signal.SIGKILL)
            at_kill = rollout()  # hub-a is gone: the second wave is hub-b's to open
            assert at_kill is not None and at_kill.waves_opened == 1
            assert len(at_kill.admitted) == 10
            await async_wait_until(
                lambda: (leader_gauges(follower.metrics_port) or {}).get("leader") == 1,
                FAILOVER_BOUND_S,
                "hub-b to take the lead",
                0.05,
            )
            await async_wait_until(lambda: runs("2.0.0"), 60, "every agent on 2.0.0", 0.2)

            def completed() -> bool:
                return service.deployments.status()[-1].rollout.phase == "completed"  # type: ignore[union-attr]

            await async_wait_until(completed, 30, "the rollout to complete", 0.2)
            return time.monotonic() - started
        finally:
            stop.set()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            assert [r for r in results if r is not None] == []

    return launchers, asyncio.run(main())
