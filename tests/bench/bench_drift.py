"""Drift-detector benchmark: detection delay and false alarms on a device's 0/1 error stream.

Run: ``python tests/bench/bench_drift.py [--seeds 20] [--stationary-runs 10]``

The stream is what :class:`edge_agent.drift.AccuracyMonitor` feeds its detector:
1.0 for a wrong answer, 0.0 for a right one, with a 10 % base error rate. For
each detector, in one run and on the very same streams:

* **delay**: ``PRE`` stationary samples, then the error rate steps up by 5, 10 or
  20 points (an abrupt accuracy drop); the samples from the step to the first
  alarm at or after it, median over ``--seeds`` seeds (``None`` when more than
  half the seeds see no alarm within ``HORIZON`` samples);
* **false alarms**: alarms on ``--stationary-runs`` independent streams of 100,000
  stationary samples (a fresh detector each), per 100,000 samples.

Detectors: ours (:mod:`edge_agent.drift`) at their defaults and at "fast" settings
that aim at the delay goal, and river 0.26.1's ADWIN and PageHinkley, at river's
defaults and at ours (where they must give the same numbers as ours). The issue's
goal: under 50 samples for a 10-point drop and under 1 false alarm per 100,000.
The baseline, measured in the same run, is a CUSUM told both error rates
(:class:`OracleCusum`): the optimal detector of exactly that shift, so its delay
at under one false alarm per 100,000 is a floor no real detector goes below.
It prints a table and writes ``tests/bench/results/drift.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table
from river import drift as river_drift

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from edge_agent.drift import ADWIN, DriftDetector, KSWindowDetector, PageHinkley

RESULTS = Path(__file__).parent / "results" / "drift.json"
BASE_ERROR = 0.10
SHIFTS = (0.05, 0.10, 0.20)
PRE = 2000
HORIZON = 5000
STATIONARY = 100_000
GOAL_DELAY = 50  # samples, for the 10-point drop
GOAL_FALSE_ALARMS = 1.0  # per 100,000 stationary samples
console = Console()


class River:
    """A river detector behind our ``update(x) -> bool``."""

    def __init__(self, detector: river_drift.ADWIN | river_drift.PageHinkley) -> None:
        self._detector = detector

    @property
    def drift_detected(self) -> bool:
        """Whether the last sample fired."""
        return bool(self._detector.drift_detected)

    def update(self, x: float) -> bool:
        """Feed river's detector."""
        self._detector.update(x)
        return bool(self._detector.drift_detected)

    def reset(self) -> None:
        """Not needed here."""


class OracleCusum:
    """The baseline: Page's CUSUM of the log-likelihood ratio, told both error rates.

    No detector can know the rate after a shift; this one is given it (the base rate
    and the 10-point drop's), which makes it the optimal detector of that shift at a
    given false-alarm rate (Lorden; Moustakides). Its delay at under one false alarm
    per 100,000 samples is therefore the floor for every real detector here.
    """

    def __init__(self, threshold: float = 8.0, after: float = BASE_ERROR + 0.10) -> None:
        self._up = math.log(after / BASE_ERROR)
        self._down = math.log((1 - after) / (1 - BASE_ERROR))
        self._threshold = threshold
        self._s = 0.0

    def update(self, x: float) -> bool:
        """Add one sample's evidence; True (and start again) past the threshold."""
        self._s = max(0.0, self._s + (self._up if x else self._down))
        if self._s > self._threshold:
            self._s = 0.0
            return True
        return False

    def reset(self) -> None:
        """Forget the evidence."""
        self._s = 0.0


OUR_ADWIN = {"delta": 0.05, "clock": 4}
OUR_PH = {"delta": 0.04, "threshold": 12.0, "alpha": 1.0, "mode": "up"}
DETECTORS: dict[str, tuple[str, Callable[[], DriftDetector]]] = {
    "ADWIN": ("defaults: delta=0.05, clock=4", ADWIN),
    "ADWIN fast": ("delta=0.5, clock=1", lambda: ADWIN(delta=0.5, clock=1)),
    "Page-Hinkley": ("defaults: delta=0.04, threshold=12, alpha=1, up", PageHinkley),
    "Page-Hinkley fast": ("delta=0.05, threshold=4", lambda: PageHinkley(delta=0.05, threshold=4)),
    "KSWIN-like": ("defaults: alpha=1e-5, window 1000/300, clock=10", KSWindowDetector),
    "KSWIN-like 0/1": (
        "alpha=0.1, window 1000/200, clock=10",
        lambda: KSWindowDetector(alpha=0.1, stat_size=200),
    ),
    "CUSUM, rates known (floor)": (
        "told the base and the +10-point rate; threshold 8",
        OracleCusum,  # type: ignore[dict-item]
    ),
    "river ADWIN": ("river defaults: delta=0.002, clock=32", lambda: River(river_drift.ADWIN())),
    "river ADWIN, ours": (
        "delta=0.05, clock=4",
        lambda: River(river_drift.ADWIN(**OUR_ADWIN)),  # type: ignore[arg-type]
    ),
    "river PageHinkley": (
        "river defaults: delta=0.005, threshold=50, alpha=0.9999, both",
        lambda: River(river_drift.PageHinkley()),
    ),
    "river PageHinkley, ours": (
        "delta=0.04, threshold=12, alpha=1, up",
        lambda: River(river_drift.PageHinkley(**OUR_PH)),  # type: ignore[arg-type]
    ),
}


def step_stream(seed: int, shift: float) -> list[float]:
    """``PRE`` samples at the base error rate, then ``HORIZON`` at ``+ shift``."""
    rng = np.random.default_rng([seed, round(shift * 100)])
    errors = np.concatenate(
        [rng.random(PRE) < BASE_ERROR, rng.random(HORIZON) < BASE_ERROR + shift]
    )
    return errors.astype(float).tolist()


def stationary_stream(run: int) -> list[float]:
    """``STATIONARY`` samples at the base error rate."""
    rng = np.random.default_rng([10_000, run])
    return (rng.random(STATIONARY) < BASE_ERROR).astype(float).tolist()


def first_alarm_after_step(detector: DriftDetector, stream: list[float]) -> int | None:
    """Samples from the step to the first alarm at or after it; None when there is none."""
    update = detector.update
    for i, x in enumerate(stream):
        if update(x) and i >= PRE:
            return i - PRE
    return None


def measure(name: str, seeds: int, runs: int) -> dict[str, Any]:
    """One detector's delays per shift and its false alarms (run in a worker process)."""
    make = DETECTORS[name][1]
    delays: dict[float, list[int | None]] = {
        shift: [first_alarm_after_step(make(), step_stream(seed, shift)) for seed in range(seeds)]
        for shift in SHIFTS
    }
    alarms = 0
    for run in range(runs):
        update = make().update
        alarms += sum(update(x) for x in stationary_stream(run))
    return {"delays": delays, "false_alarms_per_100k": alarms * 100_000 / (runs * STATIONARY)}


def median_delay(delays: list[int | None]) -> float | None:
    """The median, a miss counting as later than any delay; None when a miss is the median."""
    ranked = sorted(delays, key=lambda d: float("inf") if d is None else d)
    middle = ranked[(len(ranked) - 1) // 2], ranked[len(ranked) // 2]
    if None in middle:
        return None
    return statistics.mean(d for d in middle if d is not None)


def rows_for(name: str, measured: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSON rows of one detector: one per shift."""
    return [
        {
            "detector": name,
            "params": DETECTORS[name][0],
            "shift": shift,
            "delay_samples": median_delay(delays),
            "missed": sum(d is None for d in delays),
            "false_alarms_per_100k": measured["false_alarms_per_100k"],
        }
        for shift, delays in measured["delays"].items()
    ]


def print_table(rows: list[dict[str, Any]], seeds: int, runs: int) -> None:
    """One line per detector."""
    table = Table(
        title=(
            f"drift detectors on a 0/1 error stream (base error {BASE_ERROR:.0%}); "
            f"median delay over {seeds} seeds, false alarms over {runs} x 100k samples"
        )
    )
    for column in ("detector", "params", "5 pt", "10 pt", "20 pt", "FA/100k", "<50", "<1 FA"):
        table.add_column(column, justify="left" if column in ("detector", "params") else "right")
    for name in DETECTORS:
        mine = {row["shift"]: row for row in rows if row["detector"] == name}

        def cell(shift: float, mine: dict[float, dict[str, Any]] = mine) -> str:
            row = mine[shift]
            delay = row["delay_samples"]
            text = f">{HORIZON}" if delay is None else f"{delay:g}"
            return text + (f" ({row['missed']} missed)" if row["missed"] else "")

        ten = mine[0.10]["delay_samples"]
        alarms = mine[0.10]["false_alarms_per_100k"]
        table.add_row(
            name,
            DETECTORS[name][0],
            *(cell(shift) for shift in SHIFTS),
            f"{alarms:.2f}",
            "yes" if ten is not None and ten < GOAL_DELAY else "no",
            "yes" if alarms < GOAL_FALSE_ALARMS else "no",
        )
    console.print(table)


def main() -> None:
    """Run the benchmark, print its table, write its JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--stationary-runs", type=int, default=10)
    parser.add_argument("--workers", type=int, default=min(len(DETECTORS), os.cpu_count() or 1))
    args = parser.parse_args()
    started = time.perf_counter()
    # Counts, not timings, so the detectors may run side by side in worker processes.
    with ProcessPoolExecutor(args.workers) as pool:
        futures = {
            name: pool.submit(measure, name, args.seeds, args.stationary_runs) for name in DETECTORS
        }
        rows = [row for name, future in futures.items() for row in rows_for(name, future.result())]
    print_table(rows, args.seeds, args.stationary_runs)
    floor = next(
        r for r in rows if r["detector"] == "CUSUM, rates known (floor)" and r["shift"] == 0.10
    )
    console.print(
        f"floor: a CUSUM told both rates needs {floor['delay_samples']} samples for the 10-point "
        f"drop at {floor['false_alarms_per_100k']:.2f} false alarms per 100k; no detector that "
        "does not know the new rate does better, so the goal of < 50 at < 1 is out of reach here"
    )
    for row in rows:
        if row["shift"] == 0.10 and row["delay_samples"] and floor["delay_samples"]:
            row["delay_vs_floor"] = round(row["delay_samples"] / floor["delay_samples"], 2)
    meta = {
        "stream": f"0/1 errors, base rate {BASE_ERROR}, step after {PRE} samples",
        "shifts": list(SHIFTS),
        "seeds": args.seeds,
        "horizon": HORIZON,
        "stationary_samples": args.stationary_runs * STATIONARY,
        "goal": {"delay_samples_10pt_below": GOAL_DELAY, "false_alarms_per_100k_below": 1.0},
        "river": "0.26.1",
        "floor_delay_samples_10pt": floor["delay_samples"],
        "floor_false_alarms_per_100k": floor["false_alarms_per_100k"],
        "python": sys.version.split()[0],
        "seconds": round(time.perf_counter() - started, 1),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    try:  # bench_drift_loop.py writes the "loop" key: keep it
        kept = json.loads(RESULTS.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        kept = {}
    doc = {**(kept if isinstance(kept, dict) else {}), "meta": meta, "detectors": rows}
    RESULTS.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    console.print(f"wrote {RESULTS} in {meta['seconds']} s")


if __name__ == "__main__":
    main()
