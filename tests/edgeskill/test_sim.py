"""`edgeskill sim`: real agents in worker processes against a real hub, and its simulated runtime.

The end-to-end runs deploy 1.0.0 then 2.0.0 to 60 devices over two worker
processes, with 20% of 2.0.0's installs failing. Which devices fail is a
seeded draw of exactly ``round(60 * 0.2) = 12`` devices, so the summary's
counts are checked exactly: 12 failed installs of 2.0.0, those 12 back on
1.0.0, the other 48 running 2.0.0. Accuracy is checked against the chosen
value within 0.1 (a few hundred answers: three standard deviations).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from paho.mqtt import publish
from typer.testing import CliRunner

from cloud.mqtt_client import clear_retained
from cloud.service import DeviceView
from edge_agent.errors import HealthCheckError, SandboxError, TransportError
from edge_agent.sandbox import SkillItemError
from edgeskill.cli import app
from edgeskill.processes import Fleet, wait_until
from edgeskill.sim.faults import FaultCounters, FaultyTransport
from edgeskill.sim.hubside import start_hubs
from edgeskill.sim.params import (
    SimSettings,
    SimSettingsError,
    VersionSpec,
    parse_board_mix,
    parse_version_values,
    plan_devices,
    version_specs,
)
from edgeskill.sim.report import waves_of
from edgeskill.sim.run import _seen_at
from edgeskill.sim.runtime import (
    BOARD_SPEED,
    SimStats,
    SimulatedLauncher,
    SimulatedSkillProcess,
    synthetic_source,
)
from edgeskill.sim.worker import agent_threads
from protos import pb
from skills.manifest import Manifest
from tests.fakes.scripted_transport import ScriptedTransport
from tests.support.services import mqtt_host_port, mqtt_url

DEVICES = 60


def _sim(tmp_path: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edgeskill.cli", "sim", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=tmp_path,
        env={"COLUMNS": "160", "PATH": "/usr/bin:/bin"},
    )


def _rows(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["version"]: row for row in summary["versions"]}


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["grpc", "mqtt"])
def test_sim_rolls_two_versions_out_to_60_agents_and_counts_failed_installs(
    tmp_path: Path, transport: str
) -> None:
    out = tmp_path / "summary.json"
    args = ["--devices", str(DEVICES), "--procs", "2", "--deploy", "1.0.0", "--deploy", "2.0.0"]
    args += ["--fail-installs", "2.0.0=0.2", "--accuracy", "1.0.0=0.9,2.0.0=0.7"]
    args += ["--latency-ms", "2.0.0=30", "--rate", "5", "--soak", "2", "--json", str(out)]
    if transport == "mqtt":
        # The test broker is plain: agents and hub under a topic prefix of their own.
        prefix = f"es-test/sim-{uuid.uuid4().hex[:12]}"
        broker = mqtt_url(prefix, session_expiry=60, keepalive=30)
        args += ["--transport", "mqtt", "--insecure", "--mqtt-url", broker]
        # Another client's retained message under the same prefix: the run must leave it.
        host, port = mqtt_host_port()
        publish.single(
            f"{prefix}/other/config", b"keep", qos=1, retain=True, hostname=host, port=port
        )
    # Over gRPC the default: every agent enrols with a claim token and speaks mutual TLS.
    result = _sim(tmp_path, *args)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    if transport == "mqtt":
        # The devices' retained desired states and statuses are gone, the other one kept.
        line = f"retained messages cleared: desired state and status of {DEVICES} devices"
        assert line in result.stdout
        assert clear_retained(broker) == 1
    summary = json.loads(out.read_text(encoding="utf-8"))
    assert (summary["started"], summary["secure"]) == (DEVICES, transport == "grpc")
    if transport == "grpc":
        assert summary["enrol_p50_s"] is not None
    rows = _rows(summary)
    assert (rows["2.0.0"]["failed_installs"], rows["2.0.0"]["devices_running"]) == (12, 48)
    assert (rows["1.0.0"]["failed_installs"], rows["1.0.0"]["devices_running"]) == (0, 12)
    assert rows["1.0.0"]["converged"] and rows["2.0.0"]["converged"]
    assert abs(rows["1.0.0"]["accuracy"] - 0.9) < 0.1
    assert abs(rows["2.0.0"]["accuracy"] - 0.7) < 0.1
    # 30 ms against the default 10 ms, on the same mix of boards.
    assert rows["2.0.0"]["latency_p50_ms"] > 2 * rows["1.0.0"]["latency_p50_ms"]
    assert 0 < summary["hub_inferences"] <= summary["device_inferences"]
    assert summary["hub_cpu_s"] > 0 and summary["hub_peak_rss_mb"] > 50  # a Python hub process
    assert summary["agents_cpu_s"] > 0
    # Once the fleet was up, the workers froze their long-lived objects out of the GC.
    assert summary["agents_heap_frozen"] > 0
    # Every device fetched (TUF metadata and two bundles); busy answers are counted apart.
    assert summary["fetches"] >= 60 * 2 and 0 <= summary["fetch_busy"] < summary["fetches"]
    # Each deployment's share of the CPU, measured from its start to its settling.
    for version in ("1.0.0", "2.0.0"):
        assert 0 < rows[version]["hub_cpu_s"] < summary["hub_cpu_s"]
        assert 0 < rows[version]["agents_cpu_s"] < summary["agents_cpu_s"]
    # The idle fleet's cost over the soak: 60 agents fed 5 inputs a second each.
    assert 0 < summary["soak_hub_cores"] < 2 and 0 < summary["soak_agents_cores"] < 2
    assert "idle fleet (soak): hub" in result.stdout
    assert "2.0.0" in result.stdout and "failed installs" in result.stdout
    assert not (tmp_path / "edgeskill-sim").exists()


#: The gates of the 200-device run: the canary (40 devices) must all finish before the
#: install gate judges, so 1% failing (2 devices at most in it, 5%) passes and 20% (about
#: 8) fails; the KPI gates need 2,000 labelled answers a side, where a 5-point accuracy
#: drop is about 4 standard errors from the 2.5-point limit, and a good version as far.
GATED_PLAN = """
strategy = "canary"
canary = "20%"
wave_interval_s = 0
soak_s = 2
[gates]
install_failure = { max = "5%", min_samples = 40 }
health = "10%"
accuracy_drop = { max = 2.5, min_samples = 2000 }
p95_ratio = { max = 1.5, min_samples = 500 }
error_rate = { max = 5.0, min_samples = 500 }
"""


@pytest.mark.slow
def test_on_200_devices_gates_stop_bad_versions_at_the_canary_and_promote_a_good_one(
    tmp_path: Path,
) -> None:
    # One fleet, six versions against the same baseline: a bad build (20% of installs
    # fail), a model 5 points less accurate, one twice as slow, one that raises on 20% of
    # its inputs, then a good one with 1% of installs failing. Boards are all alike, so
    # latency compares like with like.
    out = tmp_path / "summary.json"
    args = ["--devices", "200", "--procs", "2", "--insecure", "--boards", "x86-cpu=1"]
    for version in ("1.0.0", "2.0.0", "3.0.0", "4.0.0", "5.0.0", "6.0.0"):
        args += ["--deploy", version]
    args += ["--fail-installs", "2.0.0=0.2,6.0.0=0.01", "--errors", "5.0.0=0.2"]
    args += ["--accuracy", "1.0.0=0.9,2.0.0=0.9,3.0.0=0.85,4.0.0=0.9,5.0.0=0.9,6.0.0=0.9"]
    # The plan alone names the strategy (canary): no --strategy beside it.
    args += ["--latency-ms", "4.0.0=20", "--rate", "10"]
    args += ["--plan", GATED_PLAN, "--json", str(out)]
    result = _sim(tmp_path, *args, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = _rows(json.loads(out.read_text(encoding="utf-8")))
    ended = {v: (rows[v]["outcome"], rows[v]["outcome_reason"]) for v in rows}
    assert ended["1.0.0"] == ("completed", "")
    bad = [("2.0.0", "install failures"), ("3.0.0", "accuracy"), ("4.0.0", "p95")]
    for version, gate in [*bad, ("5.0.0", "error rate")]:
        outcome, reason = ended[version]
        assert outcome == "rolled_back", (version, reason)
        assert gate in reason, (version, reason)
        # stopped at the canary: its 40 devices moved, and every one came back
        assert (rows[version]["moved"], rows[version]["devices_running"]) == (40, 0)
    assert rows["2.0.0"]["failed_installs"] > 2  # the gate saw the failures, no more waves
    assert rows["5.0.0"]["errors"] > 0 and rows["1.0.0"]["errors"] == 0
    assert (ended["6.0.0"][0], rows["6.0.0"]["moved"]) == ("completed", 200)
    assert (rows["6.0.0"]["devices_running"], rows["6.0.0"]["failed_installs"]) == (198, 2)
    assert rows["1.0.0"]["devices_running"] == 2  # the two whose install of 6.0.0 failed
    # A device's time to active counts from its own wave: the 160 after the canary (and
    # its 2 s soak) do not count the canary's time, so the p99 is below the rollout's end.
    assert rows["6.0.0"]["active_p99_s"] <= rows["6.0.0"]["converge_s"] - 2.0
    # Each wave on its own: the canary's 40 first, the rest after its soak.
    waves = rows["6.0.0"]["waves"]
    assert waves[0]["devices"] == 40 and sum(w["devices"] for w in waves) == 200
    assert waves[-1]["opened_s"] >= waves[0]["opened_s"] + 2.0
    assert all(w["active_p99_s"] <= rows["6.0.0"]["converge_s"] for w in waves)
    assert "3.0.0: rolled_back after moving 40 device(s): gate failed: accuracy" in result.stdout


def test_waves_are_the_devices_seen_admitted_at_the_same_look() -> None:
    opened = {"a": 1.0, "b": 1.0, "c": 1.0, "d": 5.0, "e": 5.0}
    active = {"a": 2.0, "b": 3.0, "d": 5.5, "e": 9.0}  # c never became active
    waves = waves_of(opened, active)
    assert [(w.opened_s, w.devices) for w in waves] == [(1.0, 3), (5.0, 2)]
    assert (waves[0].active_p50_s, waves[0].active_p99_s) == (1.0, 2.0)
    assert (waves[1].active_p50_s, waves[1].active_p99_s) == (0.5, 4.0)
    assert waves_of({}, {}) == []


def _processes_naming(text: str) -> list[int]:
    """Pids of the processes whose command line contains ``text``."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if text.encode() in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except (OSError, ValueError):
            continue
    return found


def test_time_to_active_is_when_the_hub_recorded_the_report() -> None:
    def view(reported_ms: int | None) -> DeviceView:
        return DeviceView("cam-1", {}, True, "x86-cpu", 0, 2, 2, reported_ms=reported_ms)

    started = 1_000.0  # wall-clock seconds at the deployment
    # Found at the look 9 s in; the hub had recorded it running 2.5 s in.
    assert _seen_at(view(1_002_500), 9.0, started) == 2.5
    assert _seen_at(view(999_000), 9.0, started) == 0.0  # clock skew: not < 0
    assert _seen_at(view(1_012_000), 9.0, started) == 9.0  # re-reported later
    assert _seen_at(view(None), 9.0, started) == 9.0


ROLLING_PLAN = """
strategy = "rolling"
min_samples = 5
[rolling]
max_in_flight = 8
"""


@pytest.mark.slow
def test_a_rolling_upgrade_keeps_eight_in_flight_and_times_each_device_from_its_admission(
    tmp_path: Path,
) -> None:
    out = tmp_path / "summary.json"
    args = ["--devices", "40", "--procs", "2", "--insecure", "--deploy", "1.0.0"]
    args += ["--deploy", "2.0.0", "--plan", ROLLING_PLAN, "--json", str(out)]
    result = _sim(tmp_path, *args)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    row = _rows(json.loads(out.read_text(encoding="utf-8")))["2.0.0"]
    assert (row["outcome"], row["moved"], row["devices_running"]) == ("completed", 40, 40)
    waves = row["waves"]  # the hub's admissions, grouped by the instant of each
    assert waves[0]["devices"] == 8 and sum(w["devices"] for w in waves) == 40
    assert len(waves) >= 3 and all(1 <= w["devices"] <= 8 for w in waves)
    opened = [w["opened_s"] for w in waves]
    assert opened == sorted(opened) and len(set(opened)) == len(opened)
    # each device counts from its own wave's opening, not from the deployment's
    assert all(w["active_p99_s"] <= row["converge_s"] - w["opened_s"] + 0.02 for w in waves)


def test_sim_stopped_with_sigterm_stops_its_hub_and_workers(tmp_path: Path) -> None:
    # A timeout or a scheduler ends the simulator with SIGTERM: its hub and worker
    # processes (all started with the work folder on their command line) must go too.
    work = tmp_path / "work"
    argv = [sys.executable, "-m", "edgeskill.cli", "sim", "--devices", "4", "--procs", "2"]
    argv += ["--insecure", "--deploy", "1.0.0", "--soak", "300", "--workdir", str(work)]
    sim = subprocess.Popen(
        argv,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={"COLUMNS": "160", "PATH": "/usr/bin:/bin"},
    )
    try:
        # running: the hub and both workers are up (their command lines name the folder,
        # as the simulator's own does)
        wait_until(
            lambda: len(set(_processes_naming(str(work))) - {sim.pid}) >= 3,
            120,
            "hub and workers up",
        )
        sim.send_signal(signal.SIGTERM)
        assert sim.wait(timeout=60) == 128 + signal.SIGTERM
        wait_until(lambda: not _processes_naming(str(work)), 30, "hub and workers gone")
    finally:
        if sim.poll() is None:
            sim.kill()
            sim.wait()


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--devices", "0"], "--devices 0"),
        (["--devices", "5", "--fail-installs", "2.0.0=1.5"], "2.0.0=1.5"),
        (["--devices", "5", "--accuracy", "2.0.0"], "VERSION=NUMBER"),
        (["--devices", "5", "--deploy", "9.0.0"], "9.0.0"),
        (["--devices", "5", "--hubs", "2"], "--store-url"),
        (["--devices", "5", "--procs", "6"], "--procs 6"),
        (["--devices", "5", "--boards", "toaster=1"], "toaster"),
        (["--devices", "5", "--transport", "mqtt", "--insecure"], "--mqtt-url"),
        (["--devices", "5", "--strategy", "yolo"], "yolo"),
        (["--devices", "5", "--heartbeat", "301"], "--heartbeat"),
        (["--devices", "5", "--metadata-refresh", "0"], "--metadata-refresh"),
        # A path where the plan's TOML text goes, and a plan the hub refuses.
        (["--devices", "5", "--plan", "tests/bench/rollout_rolling.toml"], "not valid TOML"),
        (["--devices", "5", "--plan", 'strategy = "rolling"\nmax_in_flight = 0'], "--plan"),
    ],
)
def test_sim_refuses_bad_settings_with_one_line_and_creates_nothing(
    tmp_path: Path, args: list[str], named: str
) -> None:
    work = tmp_path / "work"
    result = CliRunner().invoke(app, ["sim", *args, "--workdir", str(work)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0] and result.stdout == ""
    assert not work.exists()
    assert list(tmp_path.iterdir()) == []


def _manifest(version: str) -> Manifest:
    return Manifest.from_toml(
        (Path(__file__).resolve().parents[2] / "skills/library/digits/skill.toml")
        .read_text(encoding="utf-8")
        .replace('version = "1.0.0"', f'version = "{version}"')
    )


def _answers(proc: SimulatedSkillProcess, n: int) -> tuple[float, list[float]]:
    source = synthetic_source(items=n, seed=3)
    right, latencies = 0, []
    for i in range(n):
        item, label = source.item(i)
        result, ms = proc.process(item)
        right += int(result["label"] == label)
        latencies.append(ms)
    return right / n, latencies


def test_simulated_skill_answers_with_the_versions_accuracy_and_the_boards_latency() -> None:
    spec = VersionSpec(accuracy=0.8, latency_ms=10.0)
    stats = SimStats()
    fast = SimulatedSkillProcess(_manifest("2.0.0"), spec, 1.0, stats, random.Random(1))
    slow = SimulatedSkillProcess(
        _manifest("2.0.0"), spec, BOARD_SPEED["rpi"], stats, random.Random(2)
    )
    accuracy, fast_ms = _answers(fast, 2000)
    _, slow_ms = _answers(slow, 2000)
    assert abs(accuracy - 0.8) < 0.03  # 3.4 standard deviations of 2000 draws
    assert statistics.median(fast_ms) == pytest.approx(10.0, rel=0.05)
    assert statistics.median(slow_ms) == pytest.approx(40.0, rel=0.05)
    counted = stats.snapshot()["versions"]["2.0.0"]
    assert counted["inferences"] == 4000
    assert len(counted["latencies_ms"]) == 4000


def test_simulated_skill_raises_on_the_versions_share_of_inputs_and_serves_on() -> None:
    proc = SimulatedSkillProcess(
        _manifest("2.0.0"), VersionSpec(error_rate=0.25), 1.0, SimStats(), random.Random(3)
    )
    raised = 0
    source = synthetic_source(items=2000, seed=3)
    for i in range(2000):
        try:
            proc.process(source.item(i)[0])
        except SkillItemError:
            raised += 1
    assert abs(raised / 2000 - 0.25) < 0.04  # 4 standard deviations of 2000 draws
    assert proc.alive
    assert version_specs({}, {}, {}, {"2.0.0": 0.25})["2.0.0"].error_rate == 0.25
    assert parse_version_values(["2.0.0=0.25"], "--errors", low=0, high=1) == {"2.0.0": 0.25}


def test_simulated_skill_crashes_at_its_drawn_time_and_counts_it_once() -> None:
    now = [0.0]
    stats = SimStats()
    proc = SimulatedSkillProcess(
        _manifest("1.0.0"), VersionSpec(), 1.0, stats, random.Random(0),
        crash_rate=60.0, clock=lambda: now[0],
    )  # fmt: skip
    assert proc.alive and proc.kill_reason is None
    now[0] = 1e6
    assert not proc.alive and not proc.alive
    assert proc.kill_reason == "simulated crash"
    with pytest.raises(SandboxError, match="simulated crash"):
        proc.process(synthetic_source(1).item(0)[0])
    assert stats.crashes == 1
    stopped = SimulatedSkillProcess(_manifest("1.0.0"), VersionSpec(), 1.0, stats, random.Random())
    stopped.stop()
    assert not stopped.alive and stopped.kill_reason is None
    # An upgrade stops the old version: its last input says so, not that it crashed.
    with pytest.raises(SandboxError, match=r"1\.0\.0: stopped$"):
        stopped.process(synthetic_source(1).item(0)[0])
    assert stats.crashes == 1


def test_simulated_launcher_fails_the_health_check_of_the_versions_drawn_for_the_device(
    tmp_path: Path,
) -> None:
    stats = SimStats()
    launcher = SimulatedLauncher("sim-1", "jetson", {}, frozenset({"2.0.0"}), stats)
    for version in ("1.0.0", "2.0.0"):
        (tmp_path / version).mkdir()
        (tmp_path / version / "skill.toml").write_text(
            _manifest(version).to_toml(), encoding="utf-8"
        )
    proc = launcher(tmp_path / "1.0.0", {})
    assert proc.alive and proc.manifest.version == "1.0.0"
    with pytest.raises(HealthCheckError, match="simulated health check failure"):
        launcher(tmp_path / "2.0.0", {})
    assert (stats.starts, stats.failed_health_checks) == (1, 1)


def test_device_plan_draws_exact_failure_counts_and_a_board_mix_repeatably() -> None:
    settings = SimSettings(
        devices=200,
        versions={"2.0.0": VersionSpec(fail_rate=0.2), "1.0.0": VersionSpec(fail_rate=0.01)},
        boards=parse_board_mix("x86-cpu=3,rpi=1"),
        seed=7,
    )
    plans = plan_devices(settings)
    assert plans == plan_devices(settings)
    assert len({p.device_id for p in plans}) == 200
    assert sum("2.0.0" in p.fail_versions for p in plans) == 40
    assert sum("1.0.0" in p.fail_versions for p in plans) == 2
    assert [p.board for p in plans].count("rpi") == 50
    other = plan_devices(SimSettings(devices=200, versions=settings.versions, seed=8))
    assert {p.device_id for p in plans if p.fail_versions} != {
        p.device_id for p in other if p.fail_versions
    }


def test_version_values_are_parsed_and_bad_ones_named() -> None:
    assert parse_version_values(["1.0.0=0.9,2.0.0=0.85"], "--accuracy", low=0, high=1) == {
        "1.0.0": 0.9,
        "2.0.0": 0.85,
    }
    for bad in ("2.0.0", "2.0.0=x", "2.0.0=nan", "=0.5", "2.0.0=-1"):
        with pytest.raises(SimSettingsError, match="--accuracy"):
            parse_version_values([bad], "--accuracy", low=0, high=1)
    with pytest.raises(SimSettingsError, match="twice"):
        parse_version_values(["2.0.0=0.1", "2.0.0=0.2"], "--accuracy", low=0, high=1)


def test_faulty_transport_counts_fetch_requests_and_the_hub_s_busy_answers() -> None:
    async def main() -> tuple[FaultCounters, bytes]:
        counters = FaultCounters()
        link = FaultyTransport(ScriptedTransport(b"y" * 10, busy=2), counters, random.Random(0))
        return counters, await link.fetch("bundle", 100)

    counters, data = asyncio.run(main())
    assert data == b"y" * 10
    # Two requests told "busy", then the one served: three sent in all.
    assert (counters.fetches, counters.fetch_busy) == (3, 2)


def test_faulty_transport_cuts_the_session_at_its_drawn_rate_and_delays_messages() -> None:
    async def main() -> tuple[FaultCounters, float]:
        counters = FaultCounters()
        link = FaultyTransport(
            ScriptedTransport(b"x" * 10),
            counters,
            random.Random(0),
            disconnect_rate=600_000.0,  # a cut every 0.1 ms on average
            slow_link_ms=20.0,
        )
        loop = asyncio.get_running_loop()
        started = loop.time()
        await link.connect(pb.Envelope())
        lag = loop.time() - started
        assert counters.connected == 1
        with pytest.raises(TransportError, match="simulated disconnect"):
            await asyncio.wait_for(link.receive(), 5)
        await link.send(pb.Envelope())  # one cut per session: the rest passes through
        assert await link.fetch("bundle", 100) == b"x" * 10
        await link.close()
        await link.close()
        return counters, lag

    counters, lag = asyncio.run(main())
    assert (counters.disconnects, counters.sessions, counters.connected) == (1, 1, 0)
    assert lag >= 0.02 and not math.isinf(lag)


def test_a_worker_freezes_its_fleet_and_then_collects_the_young_less_often() -> None:
    # In its own interpreter: the collector's settings are the whole process's.
    script = (
        "import gc, json\n"
        "from edgeskill.sim.worker import YOUNG_GC_THRESHOLD, _freeze_heap\n"
        "fleet = [{'agent': i, 'state': [i]} for i in range(10_000)]\n"
        "before = gc.get_threshold()\n"
        "frozen = _freeze_heap()\n"
        "print(json.dumps([before, gc.get_threshold(), frozen, YOUNG_GC_THRESHOLD]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    before, after, frozen, young = json.loads(done.stdout)
    assert before[0] == 700 and after == [young, before[1], before[2]] and young > 700
    assert frozen > 20_000  # the fleet's dicts and lists are out of the collector's sight


def test_a_worker_keeps_few_threads_unless_slow_links_hold_them_in_fetches() -> None:
    # Few threads spare the contention for the GIL; with a slow link each install
    # waits in its fetch on a thread, and the other agents' short steps must still
    # find one: 32 installs waiting at once leave room for an outbox commit.
    assert agent_threads(0.0) <= 8 < agent_threads(50.0)
    release = threading.Event()
    with ThreadPoolExecutor(agent_threads(50.0)) as pool:
        waits = [pool.submit(release.wait, 30) for _ in range(32)]
        try:
            assert pool.submit(lambda: "committed").result(timeout=10) == "committed"
            assert not any(w.done() for w in waits)
        finally:
            release.set()
        assert all(w.result(timeout=10) for w in waits)


def test_sim_refuses_more_agents_a_worker_than_its_file_descriptors_allow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Past the limit, agents failed to start one by one and the run waited for
    # devices that never came: the simulator says so before it starts anything.
    monkeypatch.setattr("edgeskill.sim.params.worker_descriptor_limit", lambda: 1000)
    work = tmp_path / "work"
    args = ["sim", "--devices", "400", "--insecure", "--workdir", str(work)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    line = result.stderr.strip()
    assert "file descriptors" in line and "raise --procs to 3" in line, line
    assert not work.exists()
    assert SimSettings(devices=400, procs=3).procs == 3  # what it says to do is enough


def test_a_hub_that_exits_at_start_is_said_at_once_with_its_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A hub that cannot serve (a port taken meanwhile, a broken home) exits: the
    # simulator says so as soon as it does, naming the log, instead of waiting a
    # minute for a port and saying only that nothing listens there.
    fleet = Fleet(tmp_path / "logs")

    def exiting(name: str, args: list[str]) -> subprocess.Popen[bytes]:
        said = "print('starting'); print('the gRPC port is taken'); raise SystemExit(3)"
        return fleet.spawn(name, [sys.executable, "-c", said])

    monkeypatch.setattr(fleet, "start", exiting)
    home = SimpleNamespace(trusted_root=tmp_path / "root.json", home=tmp_path / "hub")
    settings = SimSettings(devices=4, insecure=True)
    started = time.monotonic()
    with pytest.raises(ChildProcessError, match=r"hub-0: .*exited \(3\).*hub-0\.log") as exc:
        start_hubs(settings, cast(Any, home), fleet, Fleet(tmp_path / "logs"), tmp_path)
    # What it said goes with the error: a benchmark deletes the work folder, log and all.
    assert str(exc.value).endswith("it ended with:\nstarting\nthe gRPC port is taken")
    assert time.monotonic() - started < 30  # not the minute a silent hub gets
