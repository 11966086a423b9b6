"""`edgeskill demo --drift` end to end: shift, alarm, retraining, a new version, its canary.

Real processes (a hub and four agents); the hub's drift loop runs every second.
Also the demo's pure bookkeeping (shifts, the accuracy timeline).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgeskill.drift_timeline import Point, Window, recovered_at, shift_images, timeline


def test_shifts_keep_shape_and_range_and_change_the_images() -> None:
    x = np.random.default_rng(0).random((5, 1, 8, 8)).astype(np.float32)
    for kind in ("invert", "invert+noise", "rot90"):
        out = shift_images(x, kind)
        assert out.shape == x.shape and out.dtype == np.float32
        assert out.min() >= 0.0 and out.max() <= 1.0 and not np.allclose(out, x)
    with pytest.raises(ValueError, match="unknown shift"):
        shift_images(x, "blur")


def test_timeline_bins_fleet_accuracy_and_finds_the_recovery() -> None:
    windows = [
        Window("a", "1.0.0", 500, 10, 9, 0.1),
        Window("b", "1.0.0", 900, 10, 3, 2.0),
        Window("a", "1.0.1", 1500, 10, 10, 0.1),
        Window("b", "1.0.1", 1600, 10, 9, 0.2),
    ]
    points = timeline(windows, 1000, 0)
    assert points == [Point(1000, 0.6, 20), Point(2000, 0.95, 20)]
    assert recovered_at(points, 0, 0.94) == 2000
    assert recovered_at(points, 0, 0.99) is None


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_drift_demo_runs_the_loop_to_the_canarys_verdict(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "edgeskill.cli", "demo", "--drift", "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=380,
        check=False,
        env={"COLUMNS": "160", "PATH": "/usr/bin:/bin"},
    )
    out = result.stdout + result.stderr
    numbers = json.loads((tmp_path / "drift-loop.json").read_text())
    events = numbers["events_s"]
    assert numbers["accuracy_shifted"] < numbers["accuracy_before"] - 0.1, numbers
    # In order; two steps may share a tenth of a second (the times are rounded to it).
    assert 0 < events["alarm"] <= events["retraining"] <= events["built"] <= events["canary"], (
        numbers
    )
    assert "built and signed digits 1.0.1" in out
    verdicts = {"promotion", "rolled_back"} & set(events)
    assert len(verdicts) == 1, numbers  # the canary's gate decided, one way or the other
    if "promotion" in verdicts and numbers["recovered_s"] is not None:
        assert result.returncode == 0, out
        # Every window from the bin that recovered to the end, not only that bin: the fleet stays
        # back (the rollout right after the promotion, old versions included, is not counted).
        assert numbers["accuracy_after"] >= numbers["accuracy_before"] - 0.01, numbers
    else:  # the demo says the loop did not close, and fails
        assert result.returncode != 0 and "the loop did not close" in out, out
