"""The split benchmark still runs: one fast scenario end to end, and the JSON it writes.

It runs ``bench_split.py`` as the Makefile does (a script, in its own process),
with a real hub process and the link emulator's process, on the 1 Gbit/s link
only, the device as fast as the machine, one timed run per cut, two middle
cuts and six photos for the compression costs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).with_name("bench_split.py")
SCENARIO_KEYS = {
    "link",
    "device_slowdown",
    "device_only_ms",
    "hub_only_ms",
    "planner_ms",
    "planner_cut",
    "best_ms",
    "best_cut",
    "cuts",
}
GOALS = {
    "planner_within_10pct_share",
    "slow_links_speedup_vs_hub_only",
    "middle_cut_speedup_vs_better_of_ends",
}


@pytest.mark.slow
def test_bench_split_writes_its_scenarios_compression_and_goals(tmp_path: Path) -> None:
    out = tmp_path / "split.json"
    argv = [sys.executable, str(BENCH), "--links", "1000", "--slowdowns", "1", "--repeats", "1"]
    argv += ["--warmup", "2", "--k", "2", "--images", "6", "--out", str(out)]

    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, check=False)

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text(encoding="utf-8"))
    assert set(result) == {"meta", "scenarios", "compression", "goals"}
    (row,) = result["scenarios"]
    assert set(row) >= SCENARIO_KEYS
    assert row["link"] == "1 Gbit/s, 1 ms" and row["device_slowdown"] == 1.0
    assert {"input", "device"} <= set(row["cuts"]) and len(row["cuts"]) == 4
    assert row["best_cut"] in row["cuts"] and row["planner_cut"] in row["cuts"]
    assert row["best_ms"] == min(row["cuts"].values()) > 0 and row["planner_ms"] > 0
    # codec auto: every cut, hub-only's input too, in the codec its measured loss allowed
    for cut in result["meta"]["cuts"]:
        assert cut["codec"] in ("int8", "fp16", "fp32") and set(cut["loss_pt"]) == {"fp16", "int8"}
        assert cut["codec"] != "int8" or cut["loss_pt"]["int8"] <= 0.5
    assert {c["model"] for c in result["compression"]} == {"efficientnet-lite0", "digits-cnn"}
    for cost in result["compression"]:
        assert {"codec", "cut", "bytes_ratio", "accuracy_loss_pt"} <= set(cost)
        assert 0 < cost["bytes_ratio"] < 1 and isinstance(cost["accuracy_loss_pt"], float | int)
    assert set(result["goals"]) == GOALS
    assert all(goal["met"] in (True, False, None) for goal in result["goals"].values())
    assert out.with_suffix(".png").stat().st_size > 0
