"""Drift references (built, round-tripped, hostile ones refused) and the per-window monitor."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from edge_agent.drift import (
    DEFAULT_LIMITS,
    REFERENCE_FORMAT,
    DriftMonitor,
    DriftReference,
    DriftSummary,
    Histogram,
    InputReference,
    PageHinkley,
    ReferenceLimits,
    build_reference,
)
from edge_agent.errors import AgentError, DriftReferenceError

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


# --- the reference --------------------------------------------------------------------


def test_build_reference_summarises_the_arrays(reference: DriftReference) -> None:
    weights = reference.class_weights()
    assert sorted(weights) == ["cat", "dog", "fox"]
    assert sum(weights.values()) == 20_000
    assert reference.confidence.bins == 10
    proportions = reference.confidence.proportions()
    assert np.allclose(proportions, 0.1, atol=0.002)  # equal-mass bins
    brightness = reference.input("brightness")
    assert brightness.n == 20_000 and len(brightness.points) == 1024
    assert list(brightness.points) == sorted(brightness.points)
    with pytest.raises(KeyError):
        reference.input("contrast")


def test_build_reference_keeps_small_samples_whole_and_stringifies_classes() -> None:
    built = build_reference([1, 2, 2], [0.9, 0.8, 0.8], {"x": [3.0, 1.0, 2.0]}, bins=4)
    assert built.classes == (("1", 1.0), ("2", 2.0))
    assert built.input("x").points == (1.0, 2.0, 3.0)
    single = build_reference(["a"], [0.7])
    assert single.confidence.edges == pytest.approx((0.2, 1.2))


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        (([], []), {}, "non-empty"),
        ((["a"], [0.5, 0.6]), {}, "1 predictions but 2"),
        ((["a"], [math.nan]), {}, "finite"),
        ((["a"], [0.5], {"x": []}), {}, "input 'x'"),
        ((["a"], [0.5]), {"bins": 0}, "bins"),
        ((["a"], [0.5]), {"max_points": 10**6}, "max_points"),
        (([str(i) for i in range(2000)], [0.5] * 2000), {}, "classes, over the cap"),
    ],
)
def test_build_reference_refuses_bad_arrays(
    args: tuple[Any, ...], kwargs: dict[str, Any], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        build_reference(*args, **kwargs)


def test_the_reference_round_trips_through_json(reference: DriftReference) -> None:
    text = reference.to_json()
    again = DriftReference.from_json(text)
    assert again == reference
    assert again.to_json() == text
    assert DriftReference.from_json(text.encode()) == reference
    assert json.loads(text)["format"] == REFERENCE_FORMAT
    assert len(text) < DEFAULT_LIMITS.max_bytes


def valid_document() -> dict[str, Any]:
    return {
        "format": REFERENCE_FORMAT,
        "classes": {"cat": 3, "dog": 1.5},
        "confidence": {"edges": [0.0, 0.5, 1.0], "counts": [1, 3]},
        "inputs": {"x": {"points": [0.1, 0.2, 0.3], "n": 30}},
    }


def test_a_minimal_document_is_accepted() -> None:
    parsed = DriftReference.from_json(json.dumps(valid_document()))
    assert parsed.classes == (("cat", 3.0), ("dog", 1.5))
    assert parsed.input("x").n == 30
    no_inputs = valid_document()
    del no_inputs["inputs"]
    assert DriftReference.from_json(json.dumps(no_inputs)).inputs == ()


def mutate(path: str, value: Any) -> str:
    """The valid document with the value at ``path`` (dotted; ``-`` deletes) replaced."""
    document = valid_document()
    *parents, last = path.split(".")
    node = document
    for key in parents:
        node = node[key]
    if value == "-":
        del node[last]
    else:
        node[last] = value
    return json.dumps(document)


HOSTILE = {
    "wrong format": mutate("format", "edgeskill-drift-reference/2"),
    "unknown key": mutate("extra", 1),
    "no classes": mutate("classes", "-"),
    "classes not an object": mutate("classes", ["cat"]),
    "empty class mix": mutate("classes", {}),
    "negative class weight": mutate("classes", {"cat": -1}),
    "zero class weights": mutate("classes", {"cat": 0}),
    "weight as a string": mutate("classes", {"cat": "3"}),
    "weight as a bool": mutate("classes", {"cat": True}),
    "empty class name": mutate("classes", {"": 1}),
    "long class name": mutate("classes", {"c" * 129: 1}),
    "too many classes": mutate("classes", {f"c{i}": 1 for i in range(1025)}),
    "negative counts": mutate("confidence.counts", [-1, 3]),
    "counts as strings": mutate("confidence.counts", ["1", "3"]),
    "counts not a list": mutate("confidence.counts", 4),
    "edges not increasing": mutate("confidence.edges", [0.0, 1.0, 0.5]),
    "edges and counts disagree": mutate("confidence.edges", [0.0, 1.0]),
    "too many bins": mutate("confidence", {"edges": list(range(301)), "counts": [1] * 300}),
    "confidence extra key": mutate("confidence.bins", 2),
    "null edge": mutate("confidence.edges", [0.0, None, 1.0]),
    "huge number": mutate("confidence.edges", [0.0, 0.5, 1.0]).replace("1.0]", "1e400]"),
    "huge integer": mutate("confidence.counts", [1, 10**400]),
    "unsorted points": mutate("inputs.x.points", [0.3, 0.1]),
    "empty points": mutate("inputs.x.points", []),
    "too many points": mutate("inputs.x", {"points": list(range(5000)), "n": 5000}),
    "n below the points": mutate("inputs.x.n", 2),
    "n as a float": mutate("inputs.x.n", 30.0),
    "n over the cap": mutate("inputs.x.n", 10**13),
    "input without n": mutate("inputs.x.n", "-"),
    "too many inputs": mutate("inputs", {f"i{k}": {"points": [0.0], "n": 1} for k in range(65)}),
    "NaN": mutate("confidence.edges", [0.0, 0.5, 1.0]).replace("0.5", "NaN"),
    "Infinity": mutate("confidence.edges", [0.0, 0.5, 1.0]).replace("1.0]", "Infinity]"),
    "duplicate keys": '{"format": "x", "format": "y"}',
    "not an object": json.dumps([1, 2, 3]),
    "not JSON": "{not json",
    "bad UTF-8": b'{"format": "\xff"}',
    "deep nesting": "[" * 200_000 + "]" * 200_000,
    "oversized": " " * (DEFAULT_LIMITS.max_bytes + 1),
    "oversized in UTF-8": '"' + "é" * (DEFAULT_LIMITS.max_bytes // 2 + 1) + '"',
}


@pytest.mark.parametrize("document", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_references_are_refused(document: str | bytes) -> None:
    with pytest.raises(DriftReferenceError, match="drift reference"):
        DriftReference.from_json(document)


def test_refusals_are_agent_errors_and_say_what_is_wrong() -> None:
    with pytest.raises(AgentError, match="over the cap of 1024"):
        DriftReference.from_json(HOSTILE["too many classes"])
    with pytest.raises(DriftReferenceError, match="NaN is not allowed"):
        DriftReference.from_json(HOSTILE["NaN"])
    with pytest.raises(DriftReferenceError, match="expected JSON text"):
        DriftReference.from_json(123)  # type: ignore[arg-type]


def test_tighter_limits_apply() -> None:
    text = json.dumps(valid_document())
    with pytest.raises(DriftReferenceError, match="bytes"):
        DriftReference.from_json(text, ReferenceLimits(max_bytes=50))
    with pytest.raises(DriftReferenceError, match="points"):
        DriftReference.from_json(text, ReferenceLimits(max_points=2))


def test_the_dataclasses_validate_themselves() -> None:
    confidence = Histogram((0.0, 1.0), (1.0,))
    with pytest.raises(DriftReferenceError, match="sorted"):
        DriftReference((("b", 1.0), ("a", 1.0)), confidence)
    with pytest.raises(DriftReferenceError, match="unique"):
        DriftReference((("a", 1.0),), confidence, (InputReference("x", (1.0,), 1),) * 2)
    with pytest.raises(DriftReferenceError, match="Histogram"):
        DriftReference((("a", 1.0),), "histogram")  # type: ignore[arg-type]
    with pytest.raises(DriftReferenceError, match="finite"):
        InputReference("x", (math.nan,), 1)


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
