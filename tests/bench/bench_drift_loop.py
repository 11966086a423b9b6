"""Drift loop benchmark: the ``edgeskill demo --drift`` scenario, timed end to end.

Run: ``python tests/bench/bench_drift_loop.py [--runs 1]`` (about two minutes a run).

Each run is one ``edgeskill demo --drift`` process: a hub and four cameras, three of
them switched to inverted digits mid-run. Measured, from the moment of the shift:
``alarm_s`` (the hub opens a drift incident) and ``recovered_s`` (fleet accuracy back
within one point of its level before the shift, after retraining, a canary and its
promotion), with the fleet accuracy before, while shifted and after. The baseline is
the fleet's own accuracy before the shift, measured in the same run. It prints a table
and writes the ``loop`` key of ``tests/bench/results/drift.json`` (``bench_drift.py``
writes the ``detectors`` key of the same file).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

RESULTS = Path(__file__).parent / "results" / "drift.json"
KEYS = ("alarm_s", "recovered_s", "accuracy_before", "accuracy_shifted", "accuracy_after")
console = Console()


def run_once(work: Path) -> dict[str, Any]:
    """One demo run; its numbers (``recovered_s`` None when the loop did not close)."""
    started = time.perf_counter()
    argv = [sys.executable, "-m", "edgeskill.cli", "demo", "--drift", "--workdir", str(work)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    numbers_file = work / "drift-loop.json"
    if not numbers_file.exists():
        console.print(done.stdout[-3000:], done.stderr[-3000:], markup=False)
        raise SystemExit(f"the drift demo wrote no numbers (exit {done.returncode})")
    numbers = json.loads(numbers_file.read_text(encoding="utf-8"))
    row = {key: numbers.get(key) for key in KEYS}
    row["events_s"] = numbers.get("events_s", {})
    row["closed"] = done.returncode == 0
    row["wall_s"] = round(time.perf_counter() - started, 1)
    return row


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each number over the runs that have it."""
    out: dict[str, Any] = {}
    for key in KEYS:
        values = [r[key] for r in rows if r[key] is not None]
        out[key] = round(statistics.median(values), 3) if values else None
    out["runs"] = len(rows)
    out["closed_runs"] = sum(r["closed"] for r in rows)
    return out


def main() -> None:
    """Run the scenario, print a table, merge the ``loop`` key into the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    rows = []
    for i in range(args.runs):
        console.log(f"drift demo run {i + 1} of {args.runs} ...")
        with tempfile.TemporaryDirectory(prefix="edgeskill-drift-bench-") as tmp:
            rows.append(run_once(Path(tmp)))
    loop = {**summary(rows), "per_run": rows}
    table = Table(title="drift loop: the demo scenario (3 of 4 cameras see inverted digits)")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for key in (*KEYS, "closed_runs"):
        table.add_row(key, "-" if loop[key] is None else str(loop[key]))
    console.print(table)
    try:
        doc = json.loads(RESULTS.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        doc = {}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({**doc, "loop": loop}, indent=2) + "\n", encoding="utf-8")
    console.print(f"wrote the loop key of {RESULTS}")
    if not loop["closed_runs"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
