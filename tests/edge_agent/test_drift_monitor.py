"""The per-window drift monitor, fed a classifier's stream against its reference.

The reference format itself (built, round-tripped, hostile documents refused)
belongs to the bundle format and is tested in ``tests/skills/test_drift_reference.py``.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

import edge_agent.drift
import skills.drift_reference
from edge_agent.drift import (
    DriftMonitor,
    DriftReference,
    DriftSummary,
    PageHinkley,
    build_reference,
)

CLASSES = np.array(["cat", "dog", "fox"])


def skill_outputs(seed: int, n: int, *, shifted: bool = False) -> dict[str, Any]:
    """What a classifier sees and says: classes, confidences, a brightness summary, labels."""
    rng = np.random.default_rng(seed)
    mix = [0.2, 0.3, 0.5] if shifted else [0.5, 0.3, 0.2]
    labels = CLASSES[rng.choice(3, size=n, p=mix)]
    wrong = rng.random(n) < (0.3 if shifted else 0.1)
    predictions = np.where(wrong, CLASSES[(np.searchsorted(CLASSES, labels) + 1) % 3], labels)
    confidences = rng.beta(4, 2 if shifted else 1, size=n)
    brightness = rng.normal(0.6 if shifted else 0.5, 0.1, size=n)
    return {
        "predictions": predictions,
        "confidences": confidences,
        "brightness": brightness,
        "labels": labels,
    }


@pytest.fixture(scope="module")
def reference() -> DriftReference:
    data = skill_outputs(0, 20_000)
    return build_reference(
        data["predictions"], data["confidences"], {"brightness": data["brightness"]}
    )


# --- the monitor ------------------------------------------------------------------------


def feed(
    monitor: DriftMonitor, data: dict[str, Any], *, labelled: bool = True
) -> list[DriftSummary]:
    summaries = []
    for i in range(len(data["predictions"])):
        summary = monitor.observe(
            str(data["predictions"][i]),
            float(data["confidences"][i]),
            at=float(i),
            inputs={"brightness": float(data["brightness"][i])},
            label=str(data["labels"][i]) if labelled else None,
        )
        if summary is not None:
            summaries.append(summary)
    return summaries


def test_a_stationary_stream_shows_no_drift(reference: DriftReference) -> None:
    monitor = DriftMonitor("sorter", "1.2.0", reference, window_size=1000)
    summaries = feed(monitor, skill_outputs(1, 5000))
    assert len(summaries) == 5 and monitor.pending == 0
    for summary in summaries:
        assert summary.n_samples == 1000 and summary.n_labelled == 1000
        assert summary.class_mix_psi < 0.01
        assert summary.confidence_psi < 0.05
        (brightness,) = summary.inputs
        assert brightness.name == "brightness" and brightness.n == 1000
        assert brightness.pvalue > 0.001
        assert summary.accuracy == pytest.approx(0.9, abs=0.03)
        assert summary.alarms == ()
    assert (summaries[0].window_start, summaries[0].window_end) == (0.0, 999.0)
    assert summaries[-1].window_start == 4000.0


def test_a_shifted_stream_shows_drift_everywhere(reference: DriftReference) -> None:
    monitor = DriftMonitor("sorter", "1.2.0", reference, window_size=1000)
    feed(monitor, skill_outputs(1, 3000))
    (summary,) = feed(monitor, skill_outputs(2, 1000, shifted=True))
    assert summary.class_mix_psi > 0.25
    assert summary.confidence_psi > 0.25
    assert summary.inputs[0].statistic > 0.3 and summary.inputs[0].pvalue < 1e-10
    assert summary.accuracy == pytest.approx(0.7, abs=0.04)
    assert summary.alarms == ("accuracy", "confidence")
    json.dumps(summary.to_dict())  # the report is plain data


def test_flush_summarises_a_partial_window(reference: DriftReference) -> None:
    monitor = DriftMonitor("sorter", "1.2.0", reference, window_size=1000)
    assert monitor.flush() is None
    feed(monitor, skill_outputs(3, 10), labelled=False)
    summary = monitor.flush()
    assert summary is not None and summary.n_samples == 10
    assert (summary.accuracy, summary.n_labelled) == (None, 0)
    assert (summary.skill, summary.version) == ("sorter", "1.2.0")
    assert monitor.flush() is None


def test_observations_without_inputs_skip_their_ks_test(reference: DriftReference) -> None:
    monitor = DriftMonitor("s", "1", reference, window_size=2)
    monitor.observe("cat", 0.9, at=0.0)
    summary = monitor.observe(np.int64(1), np.float32(0.8), at=np.float64(1.0), label=1)
    assert summary is not None and summary.inputs == ()
    assert summary.accuracy == 1.0  # an int class (numpy's too) compares as its str


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        (("cat", math.nan), {"at": 0.0}, "confidence"),
        (("cat", 0.9), {"at": math.inf}, "at"),
        ((None, 0.9), {"at": 0.0}, "predicted"),
        (("cat", 0.9), {"at": 0.0, "label": 1.5}, "label"),
        (("cat", 0.9), {"at": 0.0, "inputs": {"contrast": 1.0}}, "not declared"),
        (("cat", 0.9), {"at": 0.0, "inputs": {"brightness": math.nan}}, "brightness"),
    ],
)
def test_bad_observations_are_refused_and_not_recorded(
    reference: DriftReference, args: tuple[Any, ...], kwargs: dict[str, Any], match: str
) -> None:
    monitor = DriftMonitor("s", "1", reference)
    with pytest.raises(ValueError, match=match):
        monitor.observe(*args, **kwargs)
    assert monitor.pending == 0


def test_the_monitor_validates_its_arguments(reference: DriftReference) -> None:
    for kwargs in ({"window_size": 0}, {"window_size": 10**7}, {"epsilon": 0.0}):
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            DriftMonitor("s", "1", reference, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-empty"):
        DriftMonitor("", "1", reference)


def test_custom_detectors_are_used(reference: DriftReference) -> None:
    touchy = PageHinkley(delta=0.0, threshold=0.01, min_instances=1, mode="both")
    monitor = DriftMonitor("s", "1", reference, window_size=50, confidence_detector=touchy)
    (summary,) = feed(monitor, skill_outputs(4, 50), labelled=False)
    assert summary.alarms == ("confidence",)


def test_the_drift_package_stays_light() -> None:
    probe = (
        "import json, sys\n"
        "import edge_agent.drift\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    heavy = {"scipy", "pandas", "river", "torch", "fastapi", "sqlalchemy", "cloud", "converters"}
    assert not set(json.loads(out)) & heavy


def test_the_reference_format_is_the_bundle_formats_re_exported() -> None:
    # One copy: the hub builds references with skills, the agent reads them with the same.
    for name in ("DriftReference", "InputReference", "ReferenceLimits", "Histogram"):
        assert getattr(edge_agent.drift, name) is getattr(skills.drift_reference, name)
    assert edge_agent.drift.build_reference is skills.drift_reference.build_reference
