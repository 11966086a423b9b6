"""Make a model splittable in a skill: its segments and ``split.json`` under ``models/<model>/``.

:func:`add_split` enumerates the cut points of an ONNX model, keeps the few
worth shipping (:func:`converters.split.choose_candidates`; only cuts whose
tensors are float32, which is what the activation codecs carry), partitions
the model into segments at them, makes every segment batchable where the graph
allows (the first dimension of its inputs and outputs symbolic, checked by
running two rows against two single runs; a segment that fails keeps its
shapes and is served one request at a time), checks that the segments compose
to the full model, times each segment, and writes the files. The caller puts
the returned :class:`~skills.manifest.SplitSpec` in the manifest.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx

from converters.errors import ConversionError
from converters.split import (
    Segment,
    choose_candidates,
    enumerate_cuts,
    open_segments,
    profile_segments,
    run_segments,
    segments,
)
from skills.manifest import SplitSpec
from skills.split_plan import HUB_ONLY, CutInfo, SegmentInfo, SplitPlan

if TYPE_CHECKING:
    import onnxruntime as ort

__all__ = ["BATCH_DIM", "add_split", "relax_batch"]

#: The name given to the symbolic batch dimension of segment inputs and outputs.
BATCH_DIM = "N"
#: Largest difference between the segments and the full model accepted (relative to
#: the outputs' largest magnitude, plus a floor).
_TOLERANCE = 1e-4


def add_split(
    skill_dir: Path,
    model: str,
    onnx_path: Path,
    *,
    k: int = 6,
    codec: str = "fp16",
    sample: np.ndarray | None = None,
) -> SplitSpec:
    """Write the split plan and segments of ``onnx_path`` under ``skill_dir/models/<model>/``.

    Args:
        skill_dir: The skill's source folder.
        model: The model's name in the manifest.
        onnx_path: The full model.
        k: The most middle cuts to ship.
        codec: The activation codec the manifest will declare.
        sample: An input for checking and timing (batch 1); random when not given.

    Returns:
        The ``[[split]]`` declaration for the manifest.

    Raises:
        ManifestError: ``model`` or ``codec`` is not valid in a manifest.
        ConversionError: The model does not load, has more than one input or a
            non-float32 one, cannot be cut, or the segments do not match it.
    """
    spec = SplitSpec(model=model, plan=f"models/{model}/split.json", codec=codec)
    full = _load(onnx_path)
    feeds = _sample(full, sample)
    graph_cuts = enumerate_cuts(full)
    floats = _float_tensors(full)
    chosen = [c for c in choose_candidates(graph_cuts, k) if set(c.tensors) <= floats]
    pieces = segments(full, chosen)
    env = run_segments(open_segments(pieces), pieces, feeds)
    pieces = [relax_batch(piece, env) for piece in pieces]
    sessions = open_segments(pieces)
    _check_composes(full, sessions, pieces, feeds)
    times = tuple(profile_segments(sessions, pieces, feeds, repeats=10, warmup=2))
    plan = SplitPlan(
        model=model,
        input_names=tuple(feeds),
        output_names=tuple(o.name for o in full.graph.output),
        input_bytes=graph_cuts.input_bytes,
        output_bytes=graph_cuts.output_bytes,
        segments=tuple(
            SegmentInfo(f"seg-{i:02d}.onnx", p.inputs, p.outputs) for i, p in enumerate(pieces)
        ),
        cuts=(
            CutInfo(HUB_ONLY, -1, tuple(feeds), graph_cuts.input_bytes),
            *(CutInfo(c.name, i, c.tensors, c.nbytes) for i, c in enumerate(chosen)),
        ),
        hub_ms=times,
        device_ms=times,
    )
    _write(skill_dir / "models" / model, plan, pieces)
    return spec


def _load(path: Path) -> onnx.ModelProto:
    try:
        return onnx.load(str(path))
    except (OSError, ValueError, onnx.checker.ValidationError) as exc:
        raise ConversionError(f"cannot load {path}: {exc}") from exc


def _sample(full: onnx.ModelProto, sample: np.ndarray | None) -> dict[str, np.ndarray]:
    initializers = {t.name for t in full.graph.initializer}
    inputs = [i for i in full.graph.input if i.name not in initializers]
    if len(inputs) != 1 or inputs[0].type.tensor_type.elem_type != onnx.TensorProto.FLOAT:
        raise ConversionError("a split model needs exactly one float32 input")
    info = inputs[0]
    if sample is None:
        dims = [d.dim_value or 1 for d in info.type.tensor_type.shape.dim]
        sample = np.random.default_rng(0).normal(size=dims).astype(np.float32)
    return {info.name: np.ascontiguousarray(sample, np.float32)}


def _float_tensors(full: onnx.ModelProto) -> set[str]:
    try:
        graph = onnx.shape_inference.infer_shapes(full).graph
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as exc:
        raise ConversionError(f"shape inference failed: {exc}") from exc
    return {
        v.name
        for v in [*graph.value_info, *graph.input, *graph.output]
        if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    }


def relax_batch(piece: Segment, env: Mapping[str, np.ndarray]) -> Segment:
    """``piece`` with a symbolic first dimension on its inputs and outputs, if it still runs.

    The relaxed segment is run on two rows (``env``'s tensors repeated) and must
    give each row what the segment gives it alone; otherwise ``piece`` comes back
    as it was.
    """
    relaxed = onnx.ModelProto()
    relaxed.CopyFrom(piece.model)
    del relaxed.graph.value_info[:]
    for info in [*relaxed.graph.input, *relaxed.graph.output]:
        dims = info.type.tensor_type.shape.dim
        if len(dims) > 0:
            dims[0].Clear()
            dims[0].dim_param = BATCH_DIM
    candidate = Segment(relaxed, piece.inputs, piece.outputs)
    try:
        single, double = open_segments([piece, candidate])
        one = single.run(list(piece.outputs), {n: env[n] for n in piece.inputs})
        feed = {n: np.concatenate([env[n], env[n]]) for n in piece.inputs}
        two = double.run(list(piece.outputs), feed)
    except (ConversionError, KeyError, ValueError, RuntimeError):
        return piece
    for alone, paired in zip(one, two, strict=True):
        a, b = np.asarray(alone), np.asarray(paired)
        if b.shape[:1] != (2 * a.shape[0],) or not np.allclose(
            np.concatenate([a, a]), b, rtol=1e-4, atol=1e-5
        ):
            return piece
    return candidate


def _check_composes(
    full: onnx.ModelProto,
    sessions: Sequence[ort.InferenceSession],
    pieces: Sequence[Segment],
    feeds: dict[str, np.ndarray],
) -> None:
    (whole,) = open_segments([Segment(full, (), ())])
    expected = whole.run(None, feeds)
    env = run_segments(sessions, pieces, feeds)
    for info, value in zip(full.graph.output, expected, strict=True):
        want = np.asarray(value, np.float64)
        got = env[info.name].astype(np.float64)
        scale = float(np.max(np.abs(want))) if want.size else 0.0
        if got.shape != want.shape or (
            want.size and float(np.max(np.abs(got - want))) > _TOLERANCE * (1.0 + scale)
        ):
            raise ConversionError(f"the segments do not compose to the model at {info.name!r}")


def _write(folder: Path, plan: SplitPlan, pieces: Sequence[Segment]) -> None:
    """Replace ``folder`` with the plan and its segments, all or nothing."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        for segment, piece in zip(plan.segments, pieces, strict=True):
            (staging / segment.file).write_bytes(piece.model.SerializeToString())
        (staging / "split.json").write_text(plan.to_json(), encoding="utf-8")
        SplitPlan.load(staging / "split.json")  # what we wrote reads back
        if folder.exists():
            shutil.rmtree(folder)
        staging.rename(folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
