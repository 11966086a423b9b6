"""The agent's drift watch: a monitor per running version, its window as telemetry metrics.

No agent here: the watch is fed results as the agent's workload feeds them,
and asked for each window's metrics as the telemetry loop asks.
"""

from __future__ import annotations

import itertools
import logging
import re
from pathlib import Path

import numpy as np
import pytest

from edge_agent.drift_watch import DRIFT_PREFIX, DriftWatch
from protos.limits import MAX_METRIC_NAME_CHARS, MAX_METRICS
from skills.drift_reference import build_reference
from skills.drift_spec import DriftSpec, write_reference
from skills.manifest import Manifest

#: The hub's rule for a metric name (cloud.store.checks): the agent must meet it.
METRIC_NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._/-]{{0,{MAX_METRIC_NAME_CHARS - 1}}}")
RNG = np.random.default_rng(7)


def manifest(drift: DriftSpec | None) -> Manifest:
    return Manifest(name="sorter", version="1.0.0", entrypoint="m:C", drift=drift)


@pytest.fixture
def installed(tmp_path: Path) -> tuple[Path, Manifest]:
    """An installed version whose reference: classes 0..2, confidences ~ U(0.5, 1), ink."""
    reference = build_reference(
        RNG.integers(0, 3, 5000), RNG.uniform(0.5, 1.0, 5000), {"ink": RNG.normal(0.3, 0.05, 5000)}
    )
    return tmp_path, manifest(write_reference(tmp_path, reference))


def results(n: int, *, shifted: bool = False) -> list[dict[str, object]]:
    classes = RNG.choice(3, n, p=[0.8, 0.1, 0.1] if shifted else [1 / 3] * 3)
    low, high = (0.3, 0.7) if shifted else (0.5, 1.0)
    return [
        {
            "label": int(c),
            "confidence": float(RNG.uniform(low, high)),
            "summaries": {"ink": float(RNG.normal(0.5 if shifted else 0.3, 0.05)), "other": 1.0},
        }
        for c in classes
    ]


def test_a_window_becomes_valid_telemetry_metrics(installed: tuple[Path, Manifest]) -> None:
    watch = DriftWatch(itertools.count().__next__)
    watch.attach("sorter", "1.0.0", *installed)
    assert watch.watching("sorter", "1.0.0")
    for i, result in enumerate(results(600)):
        watch.observe(("sorter", "1.0.0"), result, label=i % 3)
    metrics = watch.flush_all()[("sorter", "1.0.0")]
    assert metrics[f"{DRIFT_PREFIX}n"] == 600 and metrics["drift.labelled"] == 600
    assert metrics["drift.psi_class"] < 0.05 and metrics["drift.psi_confidence"] < 0.1
    assert metrics["drift.accuracy"] == pytest.approx(1 / 3, abs=0.06)
    assert metrics["drift.ks_p.ink"] > 0.001 and "drift.ks.other" not in metrics  # undeclared
    assert len(metrics) < MAX_METRICS
    assert all(METRIC_NAME.fullmatch(name) and np.isfinite(v) for name, v in metrics.items())
    assert watch.flush_all() == {}  # nothing since: no window


def test_a_shifted_stream_shows_in_its_window(installed: tuple[Path, Manifest]) -> None:
    watch = DriftWatch()
    watch.attach("sorter", "1.0.0", *installed)
    for result in results(600, shifted=True):
        watch.observe(("sorter", "1.0.0"), result, label=None)
    metrics = watch.flush_all()[("sorter", "1.0.0")]
    assert metrics["drift.psi_class"] > 0.25 and metrics["drift.psi_confidence"] > 1.0
    assert metrics["drift.ks.ink"] > 0.9 and metrics["drift.ks_p.ink"] < 1e-10
    assert "drift.accuracy" not in metrics  # no labels came back
    assert metrics["drift.alarms"] == metrics.get("drift.alarm.confidence", 0.0)


def test_a_bad_reference_is_logged_once_and_the_version_runs_unwatched(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spec = DriftSpec("drift/reference.json", ())
    (tmp_path / "drift").mkdir()
    (tmp_path / "drift" / "reference.json").write_text("{not json")
    watch = DriftWatch()
    with caplog.at_level(logging.WARNING, logger="edge_agent.drift_watch"):
        for _ in range(3):  # started again after a crash: not logged again
            watch.attach("sorter", "1.0.0", tmp_path, manifest(spec))
    assert [r.getMessage() for r in caplog.records] == [
        "skill sorter 1.0.0 runs without drift statistics: drift reference: not valid JSON: "
        "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"
    ]
    watch.observe(("sorter", "1.0.0"), {"label": 1, "confidence": 0.9}, label=1)
    assert not watch.watching("sorter", "1.0.0") and watch.flush_all() == {}


def test_a_version_without_a_reference_is_not_watched(tmp_path: Path) -> None:
    watch = DriftWatch()
    watch.attach("sorter", "1.0.0", tmp_path, manifest(None))
    watch.observe(("sorter", "1.0.0"), {"label": 1, "confidence": 0.9}, label=None)
    assert watch.flush_all() == {}


def test_unusable_results_are_skipped_and_logged_once(
    installed: tuple[Path, Manifest], caplog: pytest.LogCaptureFixture
) -> None:
    watch = DriftWatch()
    watch.attach("sorter", "1.0.0", *installed)
    key = ("sorter", "1.0.0")
    with caplog.at_level(logging.WARNING, logger="edge_agent.drift_watch"):
        for bad in (
            {"label": 1.5, "confidence": 0.9},
            {"label": True, "confidence": 0.9},
            {"label": 1, "confidence": "high"},
            {"label": 1, "confidence": float("nan")},
            {"label": 1, "confidence": 0.9, "summaries": {"ink": "dark"}},
        ):
            watch.observe(key, bad, label=None)
        for ignored in ({"label": 1}, {"confidence": 0.9}, ["label", 1], None):
            watch.observe(key, ignored, label=None)
    assert len(caplog.records) == 1 and "results drift cannot use" in caplog.text
    watch.observe(key, {"label": "1", "confidence": 0.9, "summaries": [0.1]}, label=1)
    metrics = watch.flush_all()[key]
    assert metrics["drift.n"] == 1 and metrics["drift.accuracy"] == 1.0  # "1" is class 1


def test_a_stopped_versions_last_window_waits_for_the_next_telemetry_window(
    installed: tuple[Path, Manifest],
) -> None:
    watch = DriftWatch()
    watch.attach("sorter", "1.0.0", *installed)
    for result in results(5):
        watch.observe(("sorter", "1.0.0"), result, label=None)
    watch.detach("sorter")
    assert not watch.watching("sorter", "1.0.0")
    watch.observe(("sorter", "1.0.0"), results(1)[0], label=None)  # too late: not counted
    assert watch.flush_all()[("sorter", "1.0.0")]["drift.n"] == 5
    assert watch.flush_all() == {}


def test_a_restarted_version_keeps_its_monitor(installed: tuple[Path, Manifest]) -> None:
    watch = DriftWatch()
    watch.attach("sorter", "1.0.0", *installed)
    watch.observe(("sorter", "1.0.0"), results(1)[0], label=None)
    watch.attach("sorter", "1.0.0", *installed)
    watch.observe(("sorter", "1.0.0"), results(1)[0], label=None)
    assert watch.flush_all()[("sorter", "1.0.0")]["drift.n"] == 2
