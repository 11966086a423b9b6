"""A skill's drift reference: what its live statistics are compared with.

The hub builds it from the data a skill version was validated on
(:func:`build_reference`) and ships it in the signed bundle as JSON (the path
the manifest's ``[drift]`` table names); the agent reads it back with
:meth:`DriftReference.from_json`. A bundle's content is not trusted: the parser
caps the size of everything (:class:`ReferenceLimits`), refuses NaN,
infinities, duplicate keys, unknown keys, wrong types and inconsistent values,
and says what is wrong in a :class:`~skills.errors.DriftReferenceError` (the
bundle publisher's fault).

Pure numpy and the standard library: the hub and the agent share this module
(its caps, :class:`ReferenceLimits`, live in :mod:`skills.drift_limits`, which
needs no numpy).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from skills.drift_limits import DEFAULT_LIMITS, ReferenceLimits
from skills.drift_stats import Histogram, check_int, finite_array
from skills.errors import DriftReferenceError

__all__ = [
    "DEFAULT_LIMITS",
    "REFERENCE_FORMAT",
    "DriftReference",
    "Histogram",
    "InputReference",
    "ReferenceLimits",
    "build_reference",
]

REFERENCE_FORMAT = "edgeskill-drift-reference/1"


def _fail(message: str) -> DriftReferenceError:
    return DriftReferenceError(f"drift reference: {message}")


def _name(value: object, where: str, max_chars: int | None = None) -> str:
    if not isinstance(value, str) or not value:
        raise _fail(f"{where} must be a non-empty string")
    if max_chars is not None and len(value) > max_chars:
        raise _fail(f"{where} is over {max_chars} characters")
    return value


def _number(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _fail(f"{where} must be a number, got {type(value).__name__}")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise _fail(f"{where} must be finite")
    return number


@dataclass(frozen=True)
class InputReference:
    """The reference distribution of one input summary (e.g. mean brightness).

    Attributes:
        name: The summary's name, as the skill reports it.
        points: Sorted finite values: the reference sample itself, or its quantiles
            at evenly spaced probabilities when it was larger.
        n: How many observations ``points`` stand for (``>= len(points)``); the KS
            test's p-value uses it.
    """

    name: str
    points: tuple[float, ...]
    n: int

    def __post_init__(self) -> None:
        """Check the invariants.

        Raises:
            DriftReferenceError: An invariant above does not hold.
        """
        where = f"input {self.name!r}"
        _name(self.name, "an input name")
        if not isinstance(self.points, tuple) or not self.points:
            raise _fail(f"{where} needs a non-empty tuple of points")
        points = tuple(_number(v, f"{where} point") for v in self.points)
        if any(b < a for a, b in pairwise(points)):
            raise _fail(f"{where} points must be sorted")
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < len(points):
            raise _fail(f"{where} n must be an int >= its {len(points)} points")
        object.__setattr__(self, "points", points)


@dataclass(frozen=True)
class DriftReference:
    """What a skill version's live statistics are compared with.

    Attributes:
        classes: ``(class, weight)`` pairs, sorted by class, unique, weights
            ``>= 0`` with a positive sum (counts or proportions).
        confidence: The histogram of the top-class confidence.
        inputs: Reference distributions of the declared input summaries, unique names.
    """

    classes: tuple[tuple[str, float], ...]
    confidence: Histogram
    inputs: tuple[InputReference, ...] = ()

    def __post_init__(self) -> None:
        """Check the invariants.

        Raises:
            DriftReferenceError: An invariant above does not hold.
        """
        if not isinstance(self.classes, tuple) or not self.classes:
            raise _fail("the class mix needs at least one class")
        pairs = []
        for pair in self.classes:
            if not isinstance(pair, tuple) or len(pair) != 2:
                raise _fail("the class mix must be (class, weight) pairs")
            name, weight = _name(pair[0], "a class name"), _number(pair[1], "a class weight")
            if weight < 0:
                raise _fail(f"class {name!r} weight must be >= 0")
            pairs.append((name, weight))
        names = [name for name, _ in pairs]
        if names != sorted(set(names)):
            raise _fail("classes must be unique and sorted")
        if sum(weight for _, weight in pairs) <= 0:
            raise _fail("class weights sum to zero")
        object.__setattr__(self, "classes", tuple(pairs))
        if not isinstance(self.confidence, Histogram):
            raise _fail("confidence must be a Histogram")
        if not isinstance(self.inputs, tuple) or not all(
            isinstance(item, InputReference) for item in self.inputs
        ):
            raise _fail("inputs must be a tuple of InputReference")
        if len({item.name for item in self.inputs}) != len(self.inputs):
            raise _fail("input names must be unique")

    def class_weights(self) -> dict[str, float]:
        """The class mix as a mapping."""
        return dict(self.classes)

    def input(self, name: str) -> InputReference:
        """The reference of input summary ``name``.

        Raises:
            KeyError: No such input summary is declared.
        """
        for item in self.inputs:
            if item.name == name:
                return item
        raise KeyError(name)

    def check_limits(self, limits: ReferenceLimits = DEFAULT_LIMITS) -> None:
        """Raise unless every part is within ``limits``.

        Raises:
            DriftReferenceError: A part is over its cap.
        """
        if len(self.classes) > limits.max_classes:
            raise _fail(f"{len(self.classes)} classes, over the cap of {limits.max_classes}")
        if self.confidence.bins > limits.max_bins:
            raise _fail(f"{self.confidence.bins} bins, over the cap of {limits.max_bins}")
        if len(self.inputs) > limits.max_inputs:
            raise _fail(f"{len(self.inputs)} inputs, over the cap of {limits.max_inputs}")
        for name, _ in self.classes:
            _name(name, "a class name", limits.max_name_chars)
        for item in self.inputs:
            _name(item.name, "an input name", limits.max_name_chars)
            if len(item.points) > limits.max_points:
                raise _fail(f"input {item.name!r} has over {limits.max_points} points")
            if item.n > limits.max_n:
                raise _fail(f"input {item.name!r} n is over {limits.max_n}")

    def to_json(self) -> str:
        """The reference as the JSON document a bundle carries."""
        document = {
            "format": REFERENCE_FORMAT,
            "classes": dict(self.classes),
            "confidence": {
                "edges": list(self.confidence.edges),
                "counts": list(self.confidence.counts),
            },
            "inputs": {i.name: {"points": list(i.points), "n": i.n} for i in self.inputs},
        }
        return json.dumps(document, allow_nan=False, separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(
        cls, data: str | bytes, limits: ReferenceLimits = DEFAULT_LIMITS
    ) -> DriftReference:
        """Read a reference from a bundle's JSON, refusing anything malformed or oversized.

        Raises:
            DriftReferenceError: Not a string or bytes, over ``limits``, not valid
                JSON, or not a valid reference.
        """
        document = _load(data, limits)
        keys = set(document)
        if (
            not {"format", "classes", "confidence"}
            <= keys
            <= {"format", "classes", "confidence", "inputs"}
        ):
            raise _fail(f"needs format, classes, confidence and maybe inputs; got {sorted(keys)}")
        if document["format"] != REFERENCE_FORMAT:
            raise _fail(f"unknown format {document['format']!r}")
        classes = _mapping(document["classes"], "classes", limits.max_classes)
        pairs = tuple(
            sorted(
                (
                    _name(name, "a class name", limits.max_name_chars),
                    _number(weight, "a class weight"),
                )
                for name, weight in classes.items()
            )
        )
        confidence = _histogram(document["confidence"], limits)
        inputs = _mapping(document.get("inputs", {}), "inputs", limits.max_inputs)
        parsed = tuple(_input(name, body, limits) for name, body in sorted(inputs.items()))
        reference = cls(pairs, confidence, parsed)
        reference.check_limits(limits)
        return reference


def _reject_constant(token: str) -> float:
    raise _fail(f"{token} is not allowed")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    document = dict(pairs)
    if len(document) != len(pairs):
        raise _fail("duplicate keys")
    return document


def _load(data: str | bytes, limits: ReferenceLimits) -> dict[str, Any]:
    if not isinstance(data, str | bytes):
        raise _fail(f"expected JSON text or bytes, got {type(data).__name__}")
    # A character is at least a byte: a long text is refused before it is encoded.
    size = len(data)
    if isinstance(data, str) and size <= limits.max_bytes:
        size = len(data.encode("utf-8", "surrogatepass"))
    if size > limits.max_bytes:
        raise _fail(f"{size} bytes or more, over the cap of {limits.max_bytes}")
    try:
        document = json.loads(data, parse_constant=_reject_constant, object_pairs_hook=_unique_keys)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, bad UTF-8, huge ints, nesting
        raise _fail(f"not valid JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise _fail("the document must be a JSON object")
    return document


def _mapping(value: object, where: str, cap: int) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(f"{where} must be an object")
    if len(value) > cap:
        raise _fail(f"{where} has {len(value)} entries, over the cap of {cap}")
    return value


def _numbers(value: object, where: str, cap: int) -> tuple[float, ...]:
    if not isinstance(value, list):
        raise _fail(f"{where} must be a list")
    if len(value) > cap:
        raise _fail(f"{where} has {len(value)} entries, over the cap of {cap}")
    return tuple(_number(v, where) for v in value)


def _histogram(value: object, limits: ReferenceLimits) -> Histogram:
    body = _mapping(value, "confidence", 2)
    if set(body) != {"edges", "counts"}:
        raise _fail("confidence needs exactly 'edges' and 'counts'")
    edges = _numbers(body["edges"], "confidence edges", limits.max_bins + 1)
    counts = _numbers(body["counts"], "confidence counts", limits.max_bins)
    try:
        return Histogram(edges, counts)
    except ValueError as exc:
        raise _fail(f"confidence: {exc}") from exc


def _input(name: str, value: object, limits: ReferenceLimits) -> InputReference:
    _name(name, "an input name", limits.max_name_chars)
    body = _mapping(value, f"input {name!r}", 2)
    if set(body) != {"points", "n"}:
        raise _fail(f"input {name!r} needs exactly 'points' and 'n'")
    points = _numbers(body["points"], f"input {name!r} points", limits.max_points)
    n = body["n"]
    if isinstance(n, bool) or not isinstance(n, int) or not 0 < n <= limits.max_n:
        raise _fail(f"input {name!r} n must be an int in 1..{limits.max_n}")
    return InputReference(name, points, n)


def build_reference(
    predictions: ArrayLike,
    confidences: ArrayLike,
    inputs: Mapping[str, ArrayLike] | None = None,
    *,
    bins: int = 10,
    max_points: int = 1024,
    limits: ReferenceLimits = DEFAULT_LIMITS,
) -> DriftReference:
    """Build a reference from a skill's predictions on its validation data.

    The confidence histogram has up to ``bins`` equal-mass bins (quantile edges;
    ties merge bins). Each input keeps its sorted sample, or ``max_points``
    quantiles at probabilities ``(i + 0.5) / max_points`` when larger. Class names
    are ``str(prediction)``, as the agent's drift monitor names them.

    Args:
        predictions: The predicted class per sample (1-D).
        confidences: The top-class confidence per sample, same length.
        inputs: Input-summary name to its values (1-D, any length).
        bins: Confidence bins wanted.
        max_points: Points kept per input.
        limits: The caps the result must meet (the agent's defaults).

    Raises:
        ValueError: An array is empty, not 1-D, not finite, or the lengths differ; a
            parameter is out of range; or the result would be over ``limits``.
    """
    check_int("bins", bins, 1, limits.max_bins)
    check_int("max_points", max_points, 1, limits.max_points)
    labels = np.asarray(predictions)
    if labels.ndim != 1 or labels.size == 0:
        raise ValueError("predictions must be a non-empty 1-D array")
    scores = finite_array("confidences", confidences)
    if scores.size != labels.size:
        raise ValueError(f"{labels.size} predictions but {scores.size} confidences")
    mix = Counter(str(label) for label in labels.tolist())
    edges = np.unique(np.quantile(scores, np.linspace(0.0, 1.0, bins + 1)))
    if edges.size < 2:  # one value only: a single bin around it
        edges = np.array([edges[0] - 0.5, edges[0] + 0.5])
    summaries = []
    for name, values in sorted((inputs or {}).items()):
        sample = np.sort(finite_array(f"input {name!r}", values))
        if sample.size > max_points:
            sample = np.quantile(sample, (np.arange(max_points) + 0.5) / max_points)
        summaries.append((name, tuple(sample.tolist()), int(np.asarray(values).size)))
    try:
        reference = DriftReference(
            tuple(sorted((name, float(count)) for name, count in mix.items())),
            Histogram.from_values(scores, edges),
            tuple(InputReference(*summary) for summary in summaries),
        )
        reference.check_limits(limits)
    except DriftReferenceError as exc:
        raise ValueError(str(exc)) from exc
    return reference
