"""The split demo's bookkeeping: link phases and what the telemetry says about each."""

from __future__ import annotations

import math

import pytest

from cloud.service import TelemetryWindowView
from edgeskill.demo_split import LinkPhase, phase_stats

CUTS = ["input", "mid", "device"]


def _window(start_ms: int, cut: int, **paths: int) -> TelemetryWindowView:
    metrics = {f"split.path.{p}": float(n) for p, n in paths.items()}
    metrics["split.classifier.cut_index"] = float(cut)
    metrics["split.fallbacks"] = 1.0 if paths.get("device") else 0.0
    return TelemetryWindowView(
        skill="imagenet",
        version="1.0.0",
        inferences=sum(paths.values()),
        labelled=0,
        correct=0,
        latency_p50_ms=10.0 * (cut + 1),
        latency_p99_ms=0.0,
        window_start_ms=start_ms,
        window_end_ms=start_ms + 1000,
        metrics=metrics,
    )


def test_a_phase_sums_the_windows_whose_middle_it_holds() -> None:
    windows = [
        _window(0, 2, device=5),  # middle at 500: before the phase
        _window(900, 2, device=4),  # middle at 1400: in it
        _window(1900, 0, hub=7),
        _window(2900, 0, hub=6, split=1),  # middle at 3400: after it
    ]
    stats = phase_stats(windows, LinkPhase(1e9, 1.0), 1000, 3000, CUTS)
    assert stats.items == 11
    assert stats.paths == {"split": 0, "hub": 7, "device": 4}
    assert stats.fallbacks == 1
    assert stats.cuts == ["device", "input"]
    assert stats.final_cut == "input"
    assert stats.cut_changes() == "device -> input"
    assert stats.latency_ms == pytest.approx(20.0)


def test_a_phase_without_telemetry_says_so() -> None:
    stats = phase_stats([], LinkPhase(1e6, 100.0), 0, 1000, CUTS)
    assert (stats.items, stats.final_cut, stats.cut_changes()) == (0, "-", "-")
    assert math.isnan(stats.latency_ms)


def test_link_phases_shape_both_directions_and_describe_themselves() -> None:
    slow = LinkPhase(1e6, 100.0)
    assert slow.describe() == "1 Mbit/s, 100 ms RTT"
    assert LinkPhase(1e9, 1.0).describe() == "1 Gbit/s, 1 ms RTT"
    assert (slow.shape().rate_bps, slow.shape().delay_ms) == (125_000.0, 50.0)
