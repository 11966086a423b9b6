"""The drift reference format: built from a skill's outputs, round-tripped, hostile ones refused.

A reference comes out of a bundle, so its parser is fed every kind of broken,
oversized and inconsistent document here; each must fail with a
:class:`DriftReferenceError` that says what is wrong.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest

from skills.drift_reference import (
    DEFAULT_LIMITS,
    REFERENCE_FORMAT,
    DriftReference,
    Histogram,
    InputReference,
    ReferenceLimits,
    build_reference,
)
from skills.errors import BundleError, DriftReferenceError


@pytest.fixture(scope="module")
def reference() -> DriftReference:
    """A classifier's reference: three classes, beta confidences, a brightness summary."""
    rng = np.random.default_rng(0)
    predictions = np.array(["cat", "dog", "fox"])[rng.choice(3, size=20_000, p=[0.5, 0.3, 0.2])]
    confidences = rng.beta(4, 1, size=20_000)
    brightness = rng.normal(0.5, 0.1, size=20_000)
    return build_reference(predictions, confidences, {"brightness": brightness})


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


def test_refusals_are_bundle_errors_and_say_what_is_wrong() -> None:
    # The publisher's fault, as any other bad bundle content.
    assert issubclass(DriftReferenceError, BundleError)
    with pytest.raises(BundleError, match="over the cap of 1024"):
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
