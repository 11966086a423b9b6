"""Leader failover between real ``edgeskill hub serve`` processes.

On PostgreSQL two hub processes share one store: exactly one leads, and when
it is killed with SIGKILL the other takes over. The time from the kill to the
survivor's metrics saying it leads is measured and printed (run with ``-s``).
On SQLite only one process may serve a home; it leads, and a second one exits
with status 2 and says who serves.
"""

from __future__ import annotations

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
from tests.cloud.conftest import postgres_schema_url
from tests.support import Fleet, free_port, wait_until

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


def start_hubs(fleet: Fleet, home: Path, names: list[str]) -> list[HubProc]:
    hubs = []
    for name in names:
        metrics_port = free_port()
        args = ["hub", "serve", "--home", str(home), "--grpc-bind", f"127.0.0.1:{free_port()}"]
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
        }
        assert leader_gauges(follower.metrics_port) == {
            "leader": 0,
            **EVERY_PROCESS,
            "timestamp-refresh": 0,
            "rollouts": 0,
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
