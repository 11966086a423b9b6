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

Given samples, it also measures what each lossy codec costs at each cut
(:func:`codec_losses`: the top-1 points lost against the uncompressed model, on
labels when given, else as disagreement), and records it in ``split.json``.
With ``codec="auto"`` (samples required) each cut, the hub-only input
included, is given the smallest codec whose loss stays within ``max_loss_pt``:
the cut and its compression are then chosen together, the cut by the agent's
planner at run time from the bytes each cut's own codec sends.
"""

from __future__ import annotations

import dataclasses
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
from skills.tensor_codec import decode, encode

if TYPE_CHECKING:
    import onnxruntime as ort

__all__ = ["BATCH_DIM", "DEFAULT_MAX_LOSS_PT", "add_split", "codec_losses", "relax_batch"]

#: The name given to the symbolic batch dimension of segment inputs and outputs.
BATCH_DIM = "N"
#: Largest difference between the segments and the full model accepted (relative to
#: the outputs' largest magnitude, plus a floor).
_TOLERANCE = 1e-4
#: The accuracy a cut's codec may cost under ``codec="auto"``, in top-1 points.
DEFAULT_MAX_LOSS_PT = 0.5
#: The lossy codecs, smallest first; fp32 is exact and always allowed.
_LOSSY = ("int8", "fp16")
#: The most samples the codec costs are measured on.
MAX_CODEC_SAMPLES = 1000


def add_split(
    skill_dir: Path,
    model: str,
    onnx_path: Path,
    *,
    k: int = 6,
    codec: str = "fp16",
    sample: np.ndarray | None = None,
    samples: np.ndarray | None = None,
    labels: np.ndarray | None = None,
    max_loss_pt: float = DEFAULT_MAX_LOSS_PT,
) -> SplitSpec:
    """Write the split plan and segments of ``onnx_path`` under ``skill_dir/models/<model>/``.

    Args:
        skill_dir: The skill's source folder.
        model: The model's name in the manifest.
        onnx_path: The full model.
        k: The most middle cuts to ship.
        codec: The activation codec the manifest will declare; ``auto`` chooses one per
            cut from the measured costs.
        sample: An input for checking and timing (batch 1); random when not given.
        samples: Inputs (batch on axis 0, at most :data:`MAX_CODEC_SAMPLES`) to measure
            each codec's accuracy cost at each cut on; required for ``auto``.
        labels: Their true classes, if known (else the loss is the disagreement with
            the uncompressed model).
        max_loss_pt: Under ``auto``, the most top-1 points a cut's codec may cost.

    Returns:
        The ``[[split]]`` declaration for the manifest.

    Raises:
        ManifestError: ``model`` or ``codec`` is not valid in a manifest.
        ConversionError: The model does not load, has more than one input or a
            non-float32 one, cannot be cut, or the segments do not match it; ``auto``
            without samples; samples or labels of the wrong shape.
    """
    spec = SplitSpec(model=model, plan=f"models/{model}/split.json", codec=codec)
    if codec == "auto" and samples is None:
        raise ConversionError("codec auto measures each codec's cost: pass samples")
    if not (0.0 <= max_loss_pt <= 100.0):
        raise ConversionError(f"max_loss_pt must be in [0, 100], got {max_loss_pt!r}")
    full = _load(onnx_path)
    feeds = _sample(full, sample)
    batch = None if samples is None else _batch(samples, feeds)
    if sample is None and batch is not None:  # a real input times better than noise
        feeds = {name: x[:1] for name, x in batch.items()}
    graph_cuts = enumerate_cuts(full)
    floats = _float_tensors(full)
    chosen = [c for c in choose_candidates(graph_cuts, k) if set(c.tensors) <= floats]
    pieces = segments(full, chosen)
    env = run_segments(open_segments(pieces), pieces, feeds)
    pieces = [relax_batch(piece, env) for piece in pieces]
    sessions = open_segments(pieces)
    _check_composes(full, sessions, pieces, feeds)
    times = tuple(profile_segments(sessions, pieces, feeds, repeats=10, warmup=2))
    cuts = (
        CutInfo(HUB_ONLY, -1, tuple(feeds), graph_cuts.input_bytes),
        *(CutInfo(c.name, i, c.tensors, c.nbytes) for i, c in enumerate(chosen)),
    )
    if batch is not None:
        measured = codec_losses(sessions, pieces, cuts, batch, labels)
        cuts = tuple(
            dataclasses.replace(
                cut,
                loss_pt=tuple(sorted(measured[cut.name].items())),
                codec=_choose(measured[cut.name], max_loss_pt) if codec == "auto" else None,
            )
            for cut in cuts
        )
    plan = SplitPlan(
        model=model,
        input_names=tuple(feeds),
        output_names=tuple(o.name for o in full.graph.output),
        input_bytes=graph_cuts.input_bytes,
        output_bytes=graph_cuts.output_bytes,
        segments=tuple(
            SegmentInfo(f"seg-{i:02d}.onnx", p.inputs, p.outputs) for i, p in enumerate(pieces)
        ),
        cuts=cuts,
        hub_ms=times,
        device_ms=times,
    )
    _write(skill_dir / "models" / model, plan, pieces)
    return spec


def codec_losses(
    sessions: Sequence[ort.InferenceSession],
    pieces: Sequence[Segment],
    cuts: Sequence[CutInfo],
    samples: Mapping[str, np.ndarray],
    labels: np.ndarray | None = None,
) -> dict[str, dict[str, float]]:
    """Each lossy codec's top-1 cost at each cut, in points (``{cut: {codec: points}}``).

    Every sample runs alone, as a device sends it: the head to the cut, the cut's
    tensors encoded and decoded with the codec (:mod:`skills.tensor_codec`, as
    they cross), the tail from there; its top-1 (the first output's argmax) is
    compared with the uncompressed model's. With labels, the cost is the accuracy
    lost (never below 0); without, the share of samples whose top-1 changed.

    Raises:
        ConversionError: The labels do not match the samples, or a segment fails.
    """
    count = len(next(iter(samples.values())))
    if labels is not None and np.shape(labels) != (count,):
        raise ConversionError(f"labels must be a list of {count} classes")
    envs = [
        run_segments(sessions, pieces, {n: x[i : i + 1] for n, x in samples.items()})
        for i in range(count)
    ]
    output = pieces[-1].outputs[0]
    reference = np.array([int(np.argmax(env[output])) for env in envs])
    truth = None if labels is None else np.asarray(labels)
    losses: dict[str, dict[str, float]] = {}
    for cut in cuts:
        losses[cut.name] = {}
        for codec in _LOSSY:
            top1 = []
            for env in envs:
                sent = decode(encode({n: env[n] for n in cut.tensors}, codec))
                out = run_segments(sessions, pieces, sent, start=cut.after + 1)
                top1.append(int(np.argmax(out[output])))
            got = np.array(top1)
            if truth is None:
                points = 100.0 * float(np.mean(got != reference))
            else:
                points = 100.0 * float(np.mean(reference == truth) - np.mean(got == truth))
            losses[cut.name][codec] = round(max(points, 0.0), 3)
    return losses


def _choose(losses: Mapping[str, float], max_loss_pt: float) -> str:
    """The smallest codec whose loss is within the budget (fp32 when none is)."""
    return next((c for c in _LOSSY if losses[c] <= max_loss_pt), "fp32")


def _batch(samples: np.ndarray, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``samples`` as the model's input, checked against the timing sample's shape."""
    ((name, one),) = feeds.items()
    batch = np.ascontiguousarray(samples, np.float32)
    if batch.ndim != one.ndim or batch.shape[1:] != one.shape[1:]:
        raise ConversionError(f"samples must have shape (n, {', '.join(map(str, one.shape[1:]))})")
    if not 0 < len(batch) <= MAX_CODEC_SAMPLES:
        raise ConversionError(f"need 1..{MAX_CODEC_SAMPLES} samples, got {len(batch)}")
    return {name: batch}


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
