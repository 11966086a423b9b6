"""The manifest's split and joint declarations: ``[[split]]`` and ``[[joint]]``.

A ``[[split]]`` table says a model ships cut into segments, with a split plan
(:mod:`skills.split_plan`) the device and the hub both read; a ``[[joint]]``
table pairs a small model the device runs with a big one the hub runs on the
inputs the small one is unsure about. Both are frozen and validate themselves,
like everything in :mod:`skills.manifest`::

    [[split]]
    model = "classifier"                   # the model name control code asks for
    plan = "models/classifier/split.json"  # bundle path of its split plan
    codec = "fp16"                         # fp32 | fp16 | int8: the activations at the cut
    deadline_ms = 1000                     # the device finishes locally past this

    [[joint]]
    small = "digits-small"                 # the model the device runs
    big = "digits-big"                     # the model the hub runs (onnx-cpu, same bundle)
    measure = "entropy"                    # entropy | margin
    threshold = 0.5                        # entropy above it (margin below it) goes to the hub
    deadline_ms = 1000

Whether ``small`` and ``big`` name ``[[models]]`` entries is not checked here
(a manifest may be written before its models); the hub checks it when it
serves the pair and refuses the request when they do not.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from skills._fields import Table, check_bundle_path, check_choice, check_int, fail, located

__all__ = [
    "AUTO_FALLBACK_CODEC",
    "JOINT_MEASURES",
    "MAX_DEADLINE_MS",
    "MAX_JOINTS",
    "MAX_SPLITS",
    "SPLIT_CODECS",
    "JointSpec",
    "SplitSpec",
    "check_splits_and_joints",
    "joint_from",
    "joint_table",
    "split_from",
    "split_table",
]

#: A manifest's codec: one for every cut, or ``auto``: each cut in the codec its plan chose.
SPLIT_CODECS = ("fp32", "fp16", "int8", "auto")
#: What a cut travels in under ``auto`` when its plan chose nothing for it.
AUTO_FALLBACK_CODEC = "fp16"
JOINT_MEASURES = ("entropy", "margin")
MAX_SPLITS = 16
MAX_JOINTS = 16
MAX_DEADLINE_MS = 600_000
#: Entropy is at most ln(classes); a margin lies in [0, 1]. Anything larger is a typo.
_MAX_THRESHOLD = 1000.0
_MODEL_RE = re.compile(r"[a-z][a-z0-9_-]{0,62}")


def _check_model(value: object, where: str) -> str:
    if not isinstance(value, str) or _MODEL_RE.fullmatch(value) is None:
        raise fail(where, f"{value!r} must match ^{_MODEL_RE.pattern}$")
    return value


@dataclass(frozen=True)
class SplitSpec:
    """A model shipped as segments that the device and the hub can split between them.

    Attributes:
        model: The model's name, as control code asks for it.
        plan: Bundle path of its ``split.json`` (inside ``models/``); the segments
            lie next to it.
        codec: How the activations at the cut travel: ``fp32``, ``fp16`` or ``int8``
            at every cut, or ``auto``: each cut in the codec its ``split.json`` chose
            (the smallest within the builder's accuracy budget; fp16 where none).
        deadline_ms: How long the device waits for the hub before finishing itself.
    """

    model: str
    plan: str
    codec: str = "fp16"
    deadline_ms: int = 1000

    def __post_init__(self) -> None:
        """Validate the fields.

        Raises:
            ManifestError: A field is invalid; the message names it.
        """
        _check_model(self.model, "model")
        path = check_bundle_path(self.plan, "plan")
        if not path.startswith("models/") or not path.endswith(".json"):
            raise fail("plan", f"{path!r} must be a .json file inside models/")
        check_choice(self.codec, "codec", SPLIT_CODECS)
        check_int(self.deadline_ms, "deadline_ms", 1, MAX_DEADLINE_MS)

    def codec_at(self, chosen: str | None) -> str:
        """The codec of a cut whose plan chose ``chosen`` (None: nothing chosen)."""
        if self.codec != "auto":
            return self.codec
        return chosen or AUTO_FALLBACK_CODEC


@dataclass(frozen=True)
class JointSpec:
    """A small model on the device that hands its unsure inputs to a big one on the hub.

    Attributes:
        small: The model the device runs.
        big: The model the hub runs on the same inputs (an ``onnx-cpu`` variant).
        measure: How the small model's confidence is measured: ``entropy`` or ``margin``.
        threshold: Entropy above it, or margin below it, sends the input to the hub.
        deadline_ms: How long the device waits for the hub before keeping its answer.
    """

    small: str
    big: str
    measure: str = "entropy"
    threshold: float = 0.5
    deadline_ms: int = 1000

    def __post_init__(self) -> None:
        """Validate the fields.

        Raises:
            ManifestError: A field is invalid; the message names it.
        """
        _check_model(self.small, "small")
        _check_model(self.big, "big")
        if self.small == self.big:
            raise fail("big", "must differ from small")
        check_choice(self.measure, "measure", JOINT_MEASURES)
        value = self.threshold
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise fail("threshold", f"expected a number, got {type(value).__name__}")
        if not (math.isfinite(value) and 0.0 <= value <= _MAX_THRESHOLD):
            raise fail("threshold", f"{value} is outside [0, {_MAX_THRESHOLD:g}]")
        object.__setattr__(self, "threshold", float(value))
        check_int(self.deadline_ms, "deadline_ms", 1, MAX_DEADLINE_MS)


def check_splits_and_joints(
    splits: object, joints: object
) -> tuple[tuple[SplitSpec, ...], tuple[JointSpec, ...]]:
    """Check the manifest's declarations together.

    Returns:
        Both, as tuples.

    Raises:
        ManifestError: Not lists of specs, too many, a model split twice, a small model
            paired twice, or a model both split and paired.
    """
    if not isinstance(splits, tuple | list) or len(splits) > MAX_SPLITS:
        raise fail("split", f"must be a list of at most {MAX_SPLITS} entries")
    if not isinstance(joints, tuple | list) or len(joints) > MAX_JOINTS:
        raise fail("joint", f"must be a list of at most {MAX_JOINTS} entries")
    if not all(isinstance(s, SplitSpec) for s in splits):
        raise fail("split", "items must be SplitSpec")
    if not all(isinstance(j, JointSpec) for j in joints):
        raise fail("joint", "items must be JointSpec")
    split_models = [s.model for s in splits]
    smalls = [j.small for j in joints]
    if len(set(split_models)) != len(split_models):
        raise fail("split", "a model is split twice")
    if len(set(smalls)) != len(smalls):
        raise fail("joint", "a small model is paired twice")
    both = sorted(set(split_models) & set(smalls))
    if both:
        raise fail("joint", f"{', '.join(both)} is both split and paired")
    return tuple(splits), tuple(joints)


def split_from(raw: object, where: str) -> SplitSpec:
    """Read one ``[[split]]`` table.

    Raises:
        ManifestError: Unknown or mistyped keys, or an invalid field.
    """
    table = Table(raw, where)
    fields: dict[str, Any] = {
        "model": table.get("model", str),
        "plan": table.get("plan", str),
        "codec": table.get("codec", str, "fp16"),
        "deadline_ms": table.get("deadline_ms", int, 1000),
    }
    table.done()
    with located(where):
        return SplitSpec(**fields)


def joint_from(raw: object, where: str) -> JointSpec:
    """Read one ``[[joint]]`` table.

    Raises:
        ManifestError: Unknown or mistyped keys, or an invalid field.
    """
    table = Table(raw, where)
    fields: dict[str, Any] = {
        "small": table.get("small", str),
        "big": table.get("big", str),
        "measure": table.get("measure", str, "entropy"),
        "threshold": table.get("threshold", (int, float), 0.5),
        "deadline_ms": table.get("deadline_ms", int, 1000),
    }
    table.done()
    with located(where):
        return JointSpec(**fields)


def split_table(specs: Sequence[SplitSpec]) -> list[dict[str, Any]]:
    """The ``[[split]]`` tables of ``specs``, for ``to_toml``."""
    return [
        {"model": s.model, "plan": s.plan, "codec": s.codec, "deadline_ms": s.deadline_ms}
        for s in specs
    ]


def joint_table(specs: Sequence[JointSpec]) -> list[dict[str, Any]]:
    """The ``[[joint]]`` tables of ``specs``, for ``to_toml``."""
    return [
        {
            "small": j.small,
            "big": j.big,
            "measure": j.measure,
            "threshold": j.threshold,
            "deadline_ms": j.deadline_ms,
        }
        for j in specs
    ]
