"""Replay sources and the telemetry window the agent sends up."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge_agent.errors import AgentError
from edge_agent.workload import ReplaySource, WindowStats, percentiles


def test_window_counts_accuracy_and_latency_percentiles() -> None:
    w = WindowStats("digits", "1.0.0")
    for i in range(100):
        w.record({"label": i % 10}, latency_ms=float(i + 1), label=(i % 10) if i < 80 else 0)
    w.record({"other": 1}, latency_ms=1.0, label=3)  # no label in the result: not labelled
    msg = w.to_message(dropped=7)
    assert (msg.inferences, msg.labelled, msg.correct) == (101, 100, 82)
    assert msg.latency_p50_ms == pytest.approx(50.0, abs=1.0)
    assert msg.latency_p99_ms == pytest.approx(99.0, abs=1.0)
    assert msg.latency_p95_ms == pytest.approx(95.0, abs=1.0)
    assert msg.dropped_messages == 7 and msg.window_end_ms >= msg.window_start_ms
    assert msg.errors == 0
    w.record_error()
    again = w.to_message()
    assert (again.inferences, again.errors, again.labelled) == (102, 1, 100)


@given(
    st.lists(st.floats(0.0, 1e6, allow_nan=False), min_size=1, max_size=200),
    st.lists(st.floats(0.0, 100.0), min_size=1, max_size=5),
)
def test_percentiles_agree_with_numpy(values: list[float], qs: list[float]) -> None:
    # The window's latency percentiles are computed without numpy; numpy's default is the rule.
    expected = np.percentile(np.asarray(values), qs)
    assert percentiles(values, qs) == pytest.approx(list(expected), rel=1e-9, abs=1e-6)


def test_replay_source_reads_samples_and_labels(tmp_path: Path) -> None:
    path = tmp_path / "s.npz"
    np.savez(path, x=np.zeros((3, 1, 8, 8), np.float32), y=np.array([1, 2, 3]))
    src = ReplaySource.load(path)
    item, label = src.item(2)
    assert len(src) == 3 and label == 3 and item["scaled"] is True


@pytest.mark.parametrize(
    "arrays",
    [{"y": np.array([1])}, {"x": np.zeros((2, 8, 8)), "y": np.array([1, 2, 3])}],
    ids=["no-samples", "label-count-mismatch"],
)
def test_bad_sources_are_refused(tmp_path: Path, arrays: dict[str, np.ndarray]) -> None:
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(AgentError):
        ReplaySource.load(path)


def test_pickled_sources_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "evil.npz"
    np.savez(path, x=np.array([{"a": 1}], dtype=object))
    with pytest.raises(AgentError):
        ReplaySource.load(path)
