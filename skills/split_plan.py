"""A split model's plan, ``split.json``: its segments, the cuts between them, their costs.

A model declared in a ``[[split]]`` table ships as consecutive ONNX segments
(``seg-00.onnx``, ``seg-01.onnx``, …) next to its ``split.json``. The device
runs segments ``0..after`` of a cut and sends the cut's tensors; the hub runs
the rest. The plan is read by the agent and by the hub from the same signed
bundle, so it is checked like any outside input: JSON only (no numpy), a cap
on every count and length, segment files inside the plan's folder, and cuts
that agree with the segments.

Layout::

    {
      "model": "classifier",
      "input_names": ["image"], "output_names": ["logits"],
      "input_bytes": 602112, "output_bytes": 4000,
      "segments": [{"file": "seg-00.onnx", "inputs": ["image"], "outputs": ["t1"]}, ...],
      "cuts": [{"name": "input", "after": -1, "tensors": ["image"], "nbytes": 602112},
               {"name": "t1", "after": 0, "tensors": ["t1"], "nbytes": 401408,
                "codec": "int8", "loss_pt": {"fp16": 0.0, "int8": 0.0}}, ...],
      "hub_ms": [1.2, ...], "device_ms": [1.2, ...]
    }

``cuts`` always starts with the hub-only cut ``input`` (``after = -1``, the
model's inputs); a file may leave it out and it is added. Then come the middle
cuts: cut ``i`` (counting from 0 after ``input``) has ``after = i`` and is
the boundary between segment ``i`` and ``i + 1``. There is no device-only cut:
running every segment needs no plan entry. ``hub_ms`` and ``device_ms`` are
per-segment times measured when the plan was built (both on the build
machine: ``device_ms`` is the reference a device scales by its own profile).

A cut may also say which codec its tensors travel in (``codec``) and what each
codec cost in accuracy when the plan was built (``loss_pt``: top-1 points lost
against the uncompressed model, over the builder's samples). The builder
records them when asked to choose (a manifest's ``codec = "auto"``); a cut
without them travels in the manifest's codec.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from skills.codec_limits import CODECS
from skills.errors import BundleError

__all__ = [
    "HUB_ONLY",
    "MAX_PLAN_BYTES",
    "MAX_SEGMENTS",
    "PING",
    "CutInfo",
    "SegmentInfo",
    "SplitPlan",
    "SplitPlanError",
]

#: The implicit cut that sends the model's inputs: the hub runs everything.
HUB_ONLY = "input"
#: Not a cut: an ``InferRequest`` with this split and no tensors asks the hub for an
#: empty answer at once, so the agent can time the link's round trip.
PING = "ping"
MAX_SEGMENTS = 256
MAX_NAME_CHARS = 256
MAX_TENSORS = 64
MAX_PLAN_BYTES = 1024 * 1024
_MAX_BYTES_VALUE = 1 << 40
_MAX_MS = 3_600_000.0
_PLAN_KEYS = frozenset(
    {
        "model",
        "input_names",
        "output_names",
        "input_bytes",
        "output_bytes",
        "segments",
        "cuts",
        "hub_ms",
        "device_ms",
    }
)


class SplitPlanError(BundleError):
    """A ``split.json`` is malformed, over a cap, or inconsistent with itself."""


def _fail(where: str, problem: str) -> SplitPlanError:
    return SplitPlanError(f"split plan {where}: {problem}")


def _name(value: object, where: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME_CHARS:
        raise _fail(where, f"must be a string of 1..{MAX_NAME_CHARS} characters")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise _fail(where, "contains control characters")
    return value


def _names(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not 0 < len(value) <= MAX_TENSORS:
        raise _fail(where, f"must be a list of 1..{MAX_TENSORS} names")
    names = tuple(_name(v, f"{where}[{i}]") for i, v in enumerate(value))
    if len(set(names)) != len(names):
        raise _fail(where, "names repeat")
    return names


def _count(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_BYTES_VALUE:
        raise _fail(where, f"must be an integer in [0, {_MAX_BYTES_VALUE}]")
    return value


def _times(value: object, where: str, count: int) -> tuple[float, ...]:
    if not isinstance(value, list) or len(value) != count:
        raise _fail(where, f"must be a list of {count} times (one per segment)")
    out = []
    for index, item in enumerate(value):
        ok = not isinstance(item, bool) and isinstance(item, int | float)
        if not ok or not (math.isfinite(item) and 0.0 <= item <= _MAX_MS):
            raise _fail(f"{where}[{index}]", f"must be milliseconds in [0, {_MAX_MS:g}]")
        out.append(float(item))
    return tuple(out)


def _table(value: object, where: str, keys: frozenset[str]) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise _fail(where, "must be an object")
    unknown = sorted(set(value) - keys)
    missing = sorted(keys - set(value))
    if unknown or missing:
        raise _fail(where, f"unknown keys {unknown}, missing keys {missing}")
    return value


def _segment_file(value: object, where: str) -> str:
    text = _name(value, where)
    path = PurePosixPath(text)
    if (
        text.startswith("/")
        or "\\" in text
        or any(part in ("", ".", "..") for part in text.split("/"))
        or path.suffix != ".onnx"
    ):
        raise _fail(where, f"{text!r} must be an .onnx file inside the plan's folder")
    return text


@dataclass(frozen=True)
class SegmentInfo:
    """One consecutive piece of the model.

    Attributes:
        file: Its ONNX file, relative to the folder of ``split.json``.
        inputs: Tensors it reads (fed, or made by earlier segments).
        outputs: Tensors it adds.
    """

    file: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class CutInfo:
    """One place the model can be split.

    Attributes:
        name: What a request names it by (``input`` for hub-only).
        after: Index of the last segment the device runs (-1: none).
        tensors: The tensors that cross, in the order they are sent.
        nbytes: Their size uncompressed at batch 1 (fp32).
        codec: The codec chosen for this cut when the plan was built, if one was.
        loss_pt: Each codec's measured top-1 loss at this cut (points), as
            ``(codec, points)`` pairs; empty when none was measured.
    """

    name: str
    after: int
    tensors: tuple[str, ...]
    nbytes: int
    codec: str | None = None
    loss_pt: tuple[tuple[str, float], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The cut as a ``cuts`` entry of ``split.json``."""
        doc: dict[str, Any] = {
            "name": self.name,
            "after": self.after,
            "tensors": list(self.tensors),
            "nbytes": self.nbytes,
        }
        if self.codec is not None:
            doc["codec"] = self.codec
        if self.loss_pt:
            doc["loss_pt"] = dict(self.loss_pt)
        return doc


@dataclass(frozen=True)
class SplitPlan:
    """A parsed, checked ``split.json``.

    Attributes:
        model: The model's name.
        input_names: The model's inputs.
        output_names: The model's outputs.
        input_bytes: Bytes of the inputs at batch 1.
        output_bytes: Bytes of the outputs at batch 1.
        segments: The segments, in the order they run.
        cuts: ``input`` first, then the middle cuts (``after`` 0, 1, …).
        hub_ms: Time of each segment measured on the hub when the plan was built.
        device_ms: The reference device time of each segment (the same machine).
    """

    model: str
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    input_bytes: int
    output_bytes: int
    segments: tuple[SegmentInfo, ...]
    cuts: tuple[CutInfo, ...]
    hub_ms: tuple[float, ...]
    device_ms: tuple[float, ...]

    @classmethod
    def from_json(cls, text: str) -> SplitPlan:
        """Parse and check a plan.

        Raises:
            SplitPlanError: Not JSON, over a cap, unknown or missing keys, bad values,
                or cuts that do not match the segments.
        """
        if not isinstance(text, str) or len(text) > MAX_PLAN_BYTES:
            raise _fail("text", f"must be a string of at most {MAX_PLAN_BYTES} characters")
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise _fail("text", f"is not JSON: {exc}") from exc
        top = _table(doc, "top level", _PLAN_KEYS)
        segments = _segments(top["segments"])
        inputs = _names(top["input_names"], "input_names")
        input_bytes = _count(top["input_bytes"], "input_bytes")
        plan = cls(
            model=_name(top["model"], "model"),
            input_names=inputs,
            output_names=_names(top["output_names"], "output_names"),
            input_bytes=input_bytes,
            output_bytes=_count(top["output_bytes"], "output_bytes"),
            segments=segments,
            cuts=_cuts(top["cuts"], len(segments), inputs, input_bytes),
            hub_ms=_times(top["hub_ms"], "hub_ms", len(segments)),
            device_ms=_times(top["device_ms"], "device_ms", len(segments)),
        )
        plan.check()
        return plan

    @classmethod
    def load(cls, path: Path) -> SplitPlan:
        """Read and check the plan at ``path``.

        Raises:
            SplitPlanError: Unreadable, over the cap, not UTF-8, or as :meth:`from_json`.
        """
        try:
            with Path(path).open("rb") as handle:
                data = handle.read(MAX_PLAN_BYTES + 1)
        except OSError as exc:
            raise _fail(str(path), f"cannot be read: {exc}") from exc
        if len(data) > MAX_PLAN_BYTES:
            raise _fail(str(path), f"is larger than {MAX_PLAN_BYTES} bytes")
        try:
            return cls.from_json(data.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise _fail(str(path), "is not UTF-8") from exc

    def to_json(self) -> str:
        """The plan as ``split.json`` text (``from_json`` gives it back)."""
        doc = {
            "model": self.model,
            "input_names": list(self.input_names),
            "output_names": list(self.output_names),
            "input_bytes": self.input_bytes,
            "output_bytes": self.output_bytes,
            "segments": [
                {"file": s.file, "inputs": list(s.inputs), "outputs": list(s.outputs)}
                for s in self.segments
            ],
            "cuts": [c.to_dict() for c in self.cuts],
            "hub_ms": list(self.hub_ms),
            "device_ms": list(self.device_ms),
        }
        return json.dumps(doc, indent=1) + "\n"

    def cut(self, name: str) -> CutInfo:
        """The cut called ``name`` (``input`` is the hub-only cut).

        Raises:
            SplitPlanError: The plan has no such cut.
        """
        for cut in self.cuts:
            if cut.name == name:
                return cut
        raise SplitPlanError(f"model {self.model!r} has no cut {name[:MAX_NAME_CHARS]!r}")

    @property
    def middle_cuts(self) -> tuple[CutInfo, ...]:
        """The cuts where both sides run a part (``after >= 0``)."""
        return tuple(c for c in self.cuts if c.after >= 0)

    def check(self) -> None:
        """Check that the segments compute what the cuts and outputs say, from the inputs.

        Raises:
            SplitPlanError: A segment reads a tensor nothing before it made, a cut
                sends a tensor not available at its place, or an output is never made.
        """
        available = set(self.input_names)
        reachable: list[set[str]] = []
        for index, segment in enumerate(self.segments):
            missing = sorted(set(segment.inputs) - available)
            if missing:
                raise _fail(f"segments[{index}]", f"reads {missing[:4]} that nothing made")
            available |= set(segment.outputs)
            reachable.append(set(available))
        for cut in self.cuts:
            have = set(self.input_names) if cut.after < 0 else reachable[cut.after]
            if not set(cut.tensors) <= have:
                raise _fail(f"cut {cut.name!r}", "sends tensors not made before it")
            later = self.segments[cut.after + 1 :]
            needed = {n for s in later for n in s.inputs} | set(self.output_names)
            if (needed & have) - _made_later(later) - set(cut.tensors):
                raise _fail(f"cut {cut.name!r}", "does not carry every tensor the hub needs")
        if not set(self.output_names) <= available:
            raise _fail("output_names", "are not all made by the segments")

    def tail_needs(self, cut: CutInfo) -> tuple[SegmentInfo, ...]:
        """The segments the hub runs for ``cut``."""
        return self.segments[cut.after + 1 :]


def _made_later(segments: Sequence[SegmentInfo]) -> set[str]:
    return {n for s in segments for n in s.outputs}


def _segments(value: object) -> tuple[SegmentInfo, ...]:
    if not isinstance(value, list) or not 0 < len(value) <= MAX_SEGMENTS:
        raise _fail("segments", f"must be a list of 1..{MAX_SEGMENTS} segments")
    out = []
    keys = frozenset({"file", "inputs", "outputs"})
    for index, raw in enumerate(value):
        where = f"segments[{index}]"
        table = _table(raw, where, keys)
        out.append(
            SegmentInfo(
                file=_segment_file(table["file"], f"{where}.file"),
                inputs=_names(table["inputs"], f"{where}.inputs"),
                outputs=_names(table["outputs"], f"{where}.outputs"),
            )
        )
    if len({s.file for s in out}) != len(out):
        raise _fail("segments", "two segments share a file")
    return tuple(out)


_CUT_KEYS = frozenset({"name", "after", "tensors", "nbytes"})
_CUT_OPTIONAL = frozenset({"codec", "loss_pt"})


def _codec(value: object, where: str) -> str:
    if not isinstance(value, str) or value not in CODECS:
        raise _fail(where, f"must be one of {list(CODECS)}")
    return value


def _losses(value: object, where: str) -> tuple[tuple[str, float], ...]:
    if not isinstance(value, dict) or not 0 < len(value) <= len(CODECS):
        raise _fail(where, f"must be an object of 1..{len(CODECS)} codecs")
    out = []
    for codec, points in value.items():
        name = _codec(codec, f"{where} key")
        ok = not isinstance(points, bool) and isinstance(points, int | float)
        if not ok or not (math.isfinite(points) and 0.0 <= points <= 100.0):
            raise _fail(f"{where}.{name}", "must be points in [0, 100]")
        out.append((name, float(points)))
    return tuple(out)


def _cut(raw: object, where: str) -> CutInfo:
    if not isinstance(raw, dict):
        raise _fail(where, "must be an object")
    extra = {k: v for k, v in raw.items() if k in _CUT_OPTIONAL}
    table = _table({k: v for k, v in raw.items() if k not in _CUT_OPTIONAL}, where, _CUT_KEYS)
    after = table["after"]
    if isinstance(after, bool) or not isinstance(after, int) or not -1 <= after < MAX_SEGMENTS:
        raise _fail(f"{where}.after", f"must be an integer in [-1, {MAX_SEGMENTS})")
    return CutInfo(
        name=_name(table["name"], f"{where}.name"),
        after=after,
        tensors=_names(table["tensors"], f"{where}.tensors"),
        nbytes=_count(table["nbytes"], f"{where}.nbytes"),
        codec=_codec(extra["codec"], f"{where}.codec") if "codec" in extra else None,
        loss_pt=_losses(extra["loss_pt"], f"{where}.loss_pt") if "loss_pt" in extra else (),
    )


def _cuts(
    value: object, segments: int, inputs: tuple[str, ...], input_bytes: int
) -> tuple[CutInfo, ...]:
    if not isinstance(value, list) or len(value) > MAX_SEGMENTS:
        raise _fail("cuts", f"must be a list of at most {MAX_SEGMENTS} cuts")
    cuts = [_cut(raw, f"cuts[{index}]") for index, raw in enumerate(value)]
    if cuts and cuts[0].after == -1:
        first = cuts.pop(0)
        if first.name != HUB_ONLY or set(first.tensors) != set(inputs):
            raise _fail("cuts[0]", f"a cut with after -1 must be {HUB_ONLY!r} sending the inputs")
        hub_only = first
    else:
        hub_only = CutInfo(HUB_ONLY, -1, inputs, input_bytes)
    if [c.after for c in cuts] != list(range(segments - 1)):
        raise _fail("cuts", f"need middle cuts with after = 0..{segments - 2}, in order")
    names = [HUB_ONLY, *(c.name for c in cuts)]
    if len(set(names)) != len(names):
        raise _fail("cuts", f"names repeat (or a middle cut is called {HUB_ONLY!r})")
    if PING in names:
        raise _fail("cuts", f"{PING!r} is reserved for the agent's round-trip pings")
    return (hub_only, *cuts)
