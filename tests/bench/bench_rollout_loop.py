"""Rollout loop benchmark: the leader's pass over a large fleet, in one process, no network.

Run: ``python tests/bench/bench_rollout_loop.py [--devices 10000] [--windows 60]
[--strategy waves|rolling]``

A SQLite store in RAM holds ``--devices`` cameras running 1.0.0 with
``--windows`` telemetry windows each from before the deployment (60: an hour at
one a minute, the KPI lookback), then 2.0.0 is deployed in exponential waves
(100, 200, 400, ... at most 2,000 a wave, no interval). The leader's loop then
runs a pass a (simulated) second; after every other pass the devices admitted so
far report 2.0.0 running. With ``--strategy rolling`` (at most 300 in flight, as
``tests/bench/rollout_rolling.toml``) the passes come every (simulated) quarter
second and after every other pass 60 of the devices in flight report, as a rolling
upgrade's reports trickle in between its leader's passes. Between passes the
fleet's telemetry comes in too, ``--telemetry-per-s`` windows a (simulated)
second (default: one a minute from each device, each for the version it runs),
so each pass finds its KPI totals moved. Timed, as medians over the passes of
each kind:

* ``first``: the leader's first pass (it sums every KPI window once);
* ``quiet``: a pass where nothing new was reported (the steady cost a second);
* ``joined``: a pass that joins a wave's reports and opens the next wave;
* ``slowest``: the slowest pass but the first.

The baseline, measured in the same run on the same store: ``facts_read``, one
read of the rollout's facts with the KPIs summed in full (what every pass did
before the leader kept running totals), and ``ratio``, the quiet pass over it.
It prints a table and writes ``tests/bench/results/rollout_loop.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import track
from rich.table import Table

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from cloud.rollout.plan import plan_from_dict
from cloud.rollout_loop import RolloutLoop
from cloud.store import SkillStatusRecord, Store, TelemetryRecord
from cloud.store.store import open_store
from edgeskill.sim.run import ram_folder

RESULTS = Path(__file__).parent / "results" / "rollout_loop.json"
WAVES = {
    "strategy": "waves",
    "wave_interval_s": 0,
    "waves": {"base_rate_per_min": 100, "increment_factor": 2.0, "max_per_min": 2000},
}
ROLLING = {"strategy": "rolling", "rolling": {"max_in_flight": 300}}
#: Reports that come in between two rolling passes.
ROLLING_REPORTS = 60
#: Most telemetry windows the store takes in one batch.
BATCH = 10_000
console = Console()


def _report(store: Store, device: str, version: str, at_ms: int) -> None:
    status = SkillStatusRecord("face", version, "running", desired_version=version)
    store.save_report(device, store.desired_for(device).generation, [status], now_ms=at_ms)


def build_fleet(store: Store, devices: int, windows: int, now_ms: int) -> list[str]:
    """Register the cameras, deploy 1.0.0, report it running and store the windows."""
    fleet = [f"cam-{i:05d}" for i in range(devices)]
    for device in track(fleet, description="registering", console=console):
        store.register_device(device, {"kind": "camera"}, {}, now_ms=now_ms)
    store.create_group("cams", "kind=camera")
    for version in ("1.0.0", "2.0.0"):
        store.add_skill_version(
            "face", version, target_name=f"face-{version}.skill", sha256="a" * 64, size=1,
            manifest="[skill]", now_ms=1,
        )  # fmt: skip
    store.create_deployment("face", "1.0.0", "cams", now_ms=now_ms)
    for device in track(fleet, description="reporting 1.0.0", console=console):
        _report(store, device, "1.0.0", now_ms)
    rows = []
    for w in range(windows):
        end = now_ms - (windows - w) * 60_000
        for i, device in enumerate(fleet):
            rows.append((f"{device}-{w}", device, _minute("1.0.0", end, 8.0 + i % 5)))
    for start in track(range(0, len(rows), BATCH), description="telemetry", console=console):
        store.add_telemetry_many(rows[start : start + BATCH])
    return fleet


def _minute(version: str, end_ms: int, p95_ms: float) -> TelemetryRecord:
    """A minute's telemetry window of ``version``: 60 inferences, 30 labelled, 27 right."""
    return TelemetryRecord(
        "face", version, 60, 30, 27, 4.0, 11.0, end_ms - 60_000, end_ms, received_ms=end_ms,
        latency_p95_ms=p95_ms,
    )  # fmt: skip


def _arriving(
    fleet: list[str], reported: dict[str, None], first: int, count: int, now_ms: int
) -> list[tuple[str, str, TelemetryRecord]]:
    """``count`` new windows from the devices after ``first``, each for what it runs."""
    rows = []
    for k in range(first, first + count):
        device = fleet[k % len(fleet)]
        version = "2.0.0" if device in reported else "1.0.0"
        rows.append((f"{device}-live-{k}", device, _minute(version, now_ms, 8.0)))
    return rows


def measure(
    devices: int, windows: int, passes: int, strategy: str, telemetry_per_s: float
) -> dict[str, Any]:
    """Build the fleet, run the passes; the medians by kind and the baseline."""
    rolling = strategy == "rolling"
    tick_ms, reports = (250, ROLLING_REPORTS) if rolling else (1000, devices)
    per_pass = round(telemetry_per_s * tick_ms / 1000)
    now = [10_000_000_000]
    with tempfile.TemporaryDirectory(prefix="edgeskill-bench-loop-", dir=ram_folder()) as tmp:
        store = open_store(f"sqlite:///{tmp}/hub.db")
        try:
            fleet = build_fleet(store, devices, windows, now[0])
            dep = store.create_deployment(
                "face",
                "2.0.0",
                "cams",
                plan=plan_from_dict(ROLLING if rolling else WAVES),
                now_ms=now[0],
            )
            loop = RolloutLoop(store, clock=lambda: now[0])
            kinds: dict[str, list[float]] = {"first": [], "quiet": [], "joined": []}
            reported: dict[str, None] = {}  # in the order they reported
            for n in range(passes):
                now[0] += tick_ms
                if per_pass:
                    store.add_telemetry_many(
                        _arriving(fleet, reported, n * per_pass, per_pass, now[0])
                    )
                started = time.perf_counter()
                loop.pass_once()
                took = (time.perf_counter() - started) * 1000
                # Reports come in after the even passes: the odd ones join them.
                kinds["first" if n == 0 else "joined" if n % 2 else "quiet"].append(took)
                if n % 2 == 0:
                    admitted = store.rollouts_of([dep.id])[dep.id].admitted or {}
                    waiting = [d for d in admitted if d not in reported][:reports]
                    for device in waiting:
                        _report(store, device, "2.0.0", now[0])
                    reported.update(dict.fromkeys(waiting))
            rollout = store.rollouts_of([dep.id])[dep.id]
            reads = []
            for _ in range(3):
                started = time.perf_counter()
                store.rollout_facts(rollout)
                reads.append((time.perf_counter() - started) * 1000)
        finally:
            store.close()
    quiet = statistics.median(kinds["quiet"])
    facts_read = statistics.median(reads)
    return {
        "strategy": strategy,
        "devices": devices,
        "windows_per_device": windows,
        "telemetry_per_pass": per_pass,
        "passes": passes,
        "moved": len(reported),
        "first_ms": round(kinds["first"][0]),
        "quiet_ms": round(quiet),
        "joined_ms": round(statistics.median(kinds["joined"])),
        "slowest_ms": round(max(kinds["quiet"] + kinds["joined"])),
        "facts_read_ms": round(facts_read),
        "ratio": round(quiet / facts_read, 2),
    }


def main() -> None:
    """Run the benchmark, print its table and write its JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=10_000)
    parser.add_argument("--windows", type=int, default=60, help="telemetry windows a device")
    parser.add_argument("--passes", type=int, default=16)
    parser.add_argument("--strategy", choices=("waves", "rolling"), default="waves")
    parser.add_argument(
        "--telemetry-per-s", type=float, help="windows arriving a second (default: devices / 60)"
    )
    args = parser.parse_args()
    per_s = args.devices / 60 if args.telemetry_per_s is None else args.telemetry_per_s
    row = measure(args.devices, args.windows, args.passes, args.strategy, per_s)
    table = Table("measure", "value", title="the leader's rollout pass (ms)")
    for key, value in row.items():
        table.add_row(key, str(value))
    console.print(table)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"rows": [row]}, indent=2) + "\n", encoding="utf-8")
    console.print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
