"""Compression pipeline: build the standard variants of a trained model and report on each.

Variants (names as they appear in reports):

==========================  ===================================================================
``float``                   the trained model, exported to ONNX
``int8``                    ONNX Runtime static INT8 (QDQ, per-channel) of ``float``
``magnitude``               50 % of weights zeroed by magnitude, fine-tuned (smaller only gzipped)
``pruned``                  structured channel pruning, fine-tuned (really smaller tensors)
``pruned+int8``             ``pruned`` quantised
``distilled``               a narrower network trained from the float model's soft targets
``distilled+int8``          ``distilled`` quantised
``pruned+distilled+int8``   channel-pruned, fine-tuned by distillation from ``float``, quantised
==========================  ===================================================================

Each variant is exported to ONNX (checked against torch), optionally to TFLite (checked
in LiteRT, INT8 variants quantised with ``ai-edge-quantizer``), and compared with
``float`` on the held-out test split on every backend present.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from torch import nn

from converters.digits import DigitsData
from converters.distill import DEFAULT_DISTILL, distill, make_student
from converters.errors import CompressionError
from converters.fit import TrainConfig
from converters.onnx_export import check_onnx, export_onnx
from converters.prune import channel_prune, magnitude_prune
from converters.quantize import quantize_int8
from converters.report import (
    BAR_PT,
    CompressionReport,
    Evaluation,
    artifacts_for,
    build_report,
    evaluate_artifacts,
)
from converters.tflite import export_tflite, litert_torch_available, quantize_tflite_int8

__all__ = ["VARIANTS", "CompressOptions", "Variant", "compress_model"]

VARIANTS = (
    "float",
    "int8",
    "magnitude",
    "pruned",
    "pruned+int8",
    "distilled",
    "distilled+int8",
    "pruned+distilled+int8",
)


@dataclass(frozen=True)
class CompressOptions:
    """Knobs of :func:`compress_model`.

    Attributes:
        sparsity: Fraction of weights zeroed by magnitude pruning.
        keep: Fraction of channels kept by channel pruning.
        student_width: Width of the distilled student relative to the default layout.
        finetune: Fine-tuning after pruning.
        distill: Training of the student, and the distillation that recovers a
            channel-pruned network in ``pruned+distilled+int8``.
        calibration_images: Training images used to calibrate INT8.
        tflite: Also build and measure TFLite files (needs ``litert-torch``);
            ``None`` means when installed.
        latency: Measure batch-1 latency per backend.
        bar_pt: Accuracy-loss bar of the reports.
    """

    sparsity: float = 0.5
    keep: float = 0.5
    student_width: float = 0.5
    finetune: TrainConfig = field(default_factory=lambda: TrainConfig(epochs=6, lr=3e-3))
    distill: TrainConfig = DEFAULT_DISTILL
    calibration_images: int = 300
    tflite: bool | None = None
    latency: bool = True
    bar_pt: float = BAR_PT


@dataclass(frozen=True)
class Variant:
    """One built variant.

    Attributes:
        name: One of :data:`VARIANTS`.
        onnx: The ONNX file.
        tflite: The TFLite file, if built.
        report: Comparison with the float model.
        model: The torch model it came from (float weights; ``None`` for none).
    """

    name: str
    onnx: Path
    tflite: Path | None
    report: CompressionReport
    model: nn.Module | None


@dataclass
class _Context:
    model_name: str
    data: DigitsData
    out_dir: Path
    options: CompressOptions
    tflite: bool
    reference: Evaluation | None = None
    torch_models: dict[str, nn.Module] = field(default_factory=dict)
    floats: dict[str, tuple[Path, Path | None]] = field(default_factory=dict)


def compress_model(
    model_name: str,
    model: nn.Module,
    data: DigitsData,
    out_dir: Path,
    *,
    variants: Sequence[str] = VARIANTS,
    options: CompressOptions | None = None,
    on_variant: Callable[[Variant], None] | None = None,
) -> list[Variant]:
    """Build and report the requested variants of a trained model.

    Args:
        model_name: Name used in the reports.
        model: The trained float model (a :class:`DigitsCNN` or :class:`MobileNet`).
        data: Splits: train for fine-tuning and calibration, test for the reports.
        out_dir: Folder receiving ``<variant>.onnx`` (and ``.tflite``) files.
        variants: Which of :data:`VARIANTS` to build; ``float`` is always built first.
        options: Knobs; defaults when ``None``.
        on_variant: Called as each variant is done.

    Returns:
        The variants in the order of :data:`VARIANTS`.

    Raises:
        CompressionError: Unknown variant names or unsupported model.
        ConversionError: An export, quantisation or check failed.
        TrainingError: Fine-tuning or distillation diverged.
    """
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise CompressionError(f"unknown variants: {', '.join(sorted(unknown))}")
    opts = options or CompressOptions()
    use_tflite = litert_torch_available() if opts.tflite is None else opts.tflite
    ctx = _Context(model_name, data, out_dir, opts, use_tflite)
    ctx.torch_models["float"] = model.eval()
    results = []
    for name in VARIANTS:
        if name != "float" and name not in variants:
            continue
        variant = _build(ctx, name)
        results.append(variant)
        if on_variant is not None:
            on_variant(variant)
    return results


def _base_model(ctx: _Context, name: str) -> nn.Module:
    """The float torch model behind a variant, trained on first use."""
    if name in ctx.torch_models:
        return ctx.torch_models[name]
    opts, teacher = ctx.options, ctx.torch_models["float"]
    if name == "magnitude":
        built = magnitude_prune(
            teacher, ctx.data, sparsity=opts.sparsity, finetune=opts.finetune
        ).model
    elif name == "pruned":
        built = channel_prune(teacher, ctx.data, keep=opts.keep, finetune=opts.finetune).model
    elif name == "distilled":
        student = make_student(teacher, opts.student_width)
        built = distill(teacher, student, ctx.data, config=opts.distill).model
    elif name == "pruned+distilled":
        narrow = channel_prune(teacher, ctx.data, keep=opts.keep, finetune=None).model
        built = distill(teacher, narrow, ctx.data, config=opts.distill).model
    else:
        raise CompressionError(f"no recipe for {name}")
    ctx.torch_models[name] = built
    return built


def _float_files(ctx: _Context, base: str) -> tuple[Path, Path | None]:
    """Export (and check) a float model once, to ONNX and optionally TFLite."""
    if base in ctx.floats:
        return ctx.floats[base]
    model, sample = _base_model(ctx, base), ctx.data.test.x[:2]
    stem = base.replace("+", "_")
    onnx = export_onnx(model, sample, ctx.out_dir / f"{stem}.onnx")
    check_onnx(model, onnx, ctx.data.test.x[:64])
    tflite = None
    if ctx.tflite:
        tflite = export_tflite(model, ctx.data.test.x[:1], ctx.out_dir / f"{stem}.tflite")
    ctx.floats[base] = (onnx, tflite)
    return onnx, tflite


def _build(ctx: _Context, name: str) -> Variant:
    quantized = name.endswith("+int8") or name == "int8"
    base = "float" if name == "int8" else name.removesuffix("+int8")
    onnx, tflite = _float_files(ctx, base)
    if quantized:
        calibration = ctx.data.train.x[: ctx.options.calibration_images]
        stem = name.replace("+", "_")
        onnx = quantize_int8(onnx, ctx.out_dir / f"{stem}.onnx", calibration)
        if tflite is not None:
            tflite = quantize_tflite_int8(tflite, ctx.out_dir / f"{stem}.tflite", calibration)
    evaluation = evaluate_artifacts(
        artifacts_for(onnx, tflite), ctx.data.test, latency=ctx.options.latency
    )
    if ctx.reference is None:
        ctx.reference = evaluation
    report = build_report(
        ctx.model_name, name, ctx.reference, evaluation, bar_pt=ctx.options.bar_pt
    )
    return Variant(name, onnx, tflite, report, ctx.torch_models.get(base))
