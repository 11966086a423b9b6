"""Per-target conversion, each result checked against its source on sample inputs.

=================  ============================================  ===============================
target             artefacts                                     checked with
=================  ============================================  ===============================
onnx-cpu           ``<name>.onnx``                               ONNX Runtime (CPU)
onnx-cuda          ``<name>.onnx`` (for the CUDA provider)       ONNX Runtime (CPU)
onnx-cann          ``<name>.onnx`` (for the CANN provider)       ONNX Runtime (CPU)
onnx-tensorrt      ``<name>.onnx`` + ``<name>.engine``           ONNX Runtime; ``trtexec``
openvino           ``<name>.xml`` + ``<name>.bin`` (f32)         OpenVINO CPU, f32 precision hint
tflite             ``<name>.tflite`` (batch fixed)               LiteRT interpreter
om                 ``<name>.om`` (Ascend, via ``atc``)           ``ais_bench`` when installed
=================  ============================================  ===============================

The source is a torch model (exported to ONNX first, and checked against torch)
or an ONNX file (checked in ONNX Runtime). Artefacts are built in a staging
folder and moved into ``out_dir`` only after they pass, so a failed conversion
leaves nothing behind.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from converters import _external
from converters._loop import predict
from converters.backends import open_runner
from converters.errors import ConversionError
from converters.onnx_export import export_onnx, ort_session, run_onnx
from converters.tflite import export_tflite

__all__ = ["TARGETS", "TOLERANCES", "ConversionResult", "convert"]

TARGETS = ("onnx-cpu", "onnx-cuda", "onnx-tensorrt", "onnx-cann", "openvino", "tflite", "om")
TOLERANCES = {
    "onnx-cpu": 1e-4,
    "onnx-cuda": 1e-4,
    "onnx-cann": 1e-4,
    "onnx-tensorrt": 1e-4,
    "openvino": 1e-4,
    "tflite": 1e-4,
    "om": _external.OM_TOLERANCE,  # atc builds fp16 by default
}
"""Largest absolute output difference accepted per target, for a float source."""
QUANTIZED_RELATIVE_TOLERANCE = 0.02
"""For an INT8 (QDQ) source, runtimes round differently (measured: 0.7 % of the largest
logit between ONNX Runtime and OpenVINO); the bound becomes this fraction of the
largest output magnitude when that is looser."""
MAX_ONNX_SOURCE_BYTES = 2 * 1024**3


@dataclass(frozen=True)
class ConversionResult:
    """A checked conversion.

    Attributes:
        target: One of :data:`TARGETS`.
        artifacts: Files written, the main one first.
        max_abs_diff: Largest output difference from the source on the samples.
        tolerance: The bound it was checked against.
        checked_with: Runtime that ran the converted model for the check.
        notes: Anything the caller should know (skipped optional steps...).
    """

    target: str
    artifacts: tuple[Path, ...]
    max_abs_diff: float
    tolerance: float
    checked_with: str
    notes: tuple[str, ...] = ()


@dataclass
class _Source:
    onnx: Path
    torch_model: torch.nn.Module | None
    expected: np.ndarray
    quantized: bool = False


def convert(
    source: torch.nn.Module | Path,
    target: str,
    out_dir: Path,
    *,
    sample: np.ndarray,
    name: str = "model",
    tolerance: float | None = None,
    engine: bool | None = None,
) -> ConversionResult:
    """Convert a model for a device target and check the result.

    Args:
        source: A torch model or an ONNX file.
        target: One of :data:`TARGETS`.
        out_dir: Folder that receives the artefacts.
        sample: Inputs used for export and for the check (float32 ``[N, ...]``); the
            ``tflite`` and ``om`` targets fix the batch size to ``N``.
        name: Base name of the artefacts.
        tolerance: Override of :data:`TOLERANCES` for this target.
        engine: For ``onnx-tensorrt``: build a TensorRT engine with ``trtexec``;
            ``None`` builds it when ``trtexec`` is on PATH, ``True`` requires it.

    Returns:
        The artefacts and the check's numbers.

    Raises:
        ConversionError: Unknown target, corrupt or unsupported source, a failed
            conversion, or outputs beyond tolerance.
        ToolMissingError: The target needs a tool or package that is absent
            (``litert-torch``, ``atc``, ``trtexec`` when ``engine=True``).
    """
    if target not in TARGETS:
        raise ConversionError(f"unknown target {target!r}; known: {', '.join(TARGETS)}")
    if not name.replace("-", "").replace("_", "").isalnum():
        raise ConversionError(f"artefact name {name!r} must be letters, digits, - and _")
    sample = np.ascontiguousarray(sample, dtype=np.float32)
    with tempfile.TemporaryDirectory(prefix="edgeskill-convert-") as tmp:
        stage = Path(tmp)
        src = _prepare(source, sample, stage)
        atol = TOLERANCES[target] if tolerance is None else tolerance
        if src.quantized and tolerance is None:
            atol = max(atol, QUANTIZED_RELATIVE_TOLERANCE * float(np.max(np.abs(src.expected))))
        if target == "openvino":
            files, diff, runtime, notes = _to_openvino(src, stage, name, sample, atol)
        elif target == "tflite":
            files, diff, runtime, notes = _to_tflite(src, stage, name, sample, atol)
        elif target == "om":
            files, diff, runtime, notes = _external.to_om(
                src.onnx, src.expected, stage, name, sample
            )
        else:
            files, diff, runtime, notes = _to_onnx(src, stage, name, sample, atol)
            if target == "onnx-tensorrt":
                extra, engine_notes = _external.tensorrt_engine(
                    files[0], src.expected, sample, engine
                )
                files, notes = files + extra, notes + engine_notes
        _check(target, diff, atol)
        return ConversionResult(target, _publish(files, out_dir), diff, atol, runtime, notes)


def _prepare(source: torch.nn.Module | Path, sample: np.ndarray, stage: Path) -> _Source:
    if isinstance(source, torch.nn.Module):
        onnx_path = export_onnx(source, sample, stage / "source.onnx")
        return _Source(onnx_path, source, predict(source, sample))
    if not isinstance(source, Path):
        raise ConversionError(
            f"source must be a torch model or a path, not {type(source).__name__}"
        )
    if not source.is_file():
        raise ConversionError(f"source model {source} does not exist")
    if source.stat().st_size > MAX_ONNX_SOURCE_BYTES:
        raise ConversionError(f"{source.name} is over {MAX_ONNX_SOURCE_BYTES} bytes")
    if source.suffix != ".onnx":
        raise ConversionError(f"unsupported source format {source.suffix!r}; give a .onnx file")
    quantized = _validate_onnx(source)
    return _Source(source, None, run_onnx(ort_session(source), sample), quantized)


def _validate_onnx(path: Path) -> bool:
    """Check the file is valid ONNX; return whether it holds quantised (QDQ) nodes."""
    import onnx  # noqa: PLC0415

    try:
        onnx.checker.check_model(str(path))
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # onnx raises ValidationError, DecodeError, OSError...
        raise ConversionError(f"{path.name} is not a valid ONNX model: {exc}") from exc
    return any(node.op_type == "DequantizeLinear" for node in model.graph.node)


def _max_diff(got: np.ndarray, expected: np.ndarray) -> float:
    if got.shape != expected.shape:
        raise ConversionError(
            f"output shape {got.shape} differs from the source's {expected.shape}"
        )
    return float(np.max(np.abs(got.astype(np.float64) - expected))) if got.size else 0.0


def _check(target: str, diff: float, atol: float) -> None:
    if not diff <= atol:  # NaN fails too
        raise ConversionError(
            f"{target}: outputs differ from the source by {diff:.3g} > {atol:.3g}"
        )


_Built = tuple[list[Path], float, str, tuple[str, ...]]


def _to_onnx(src: _Source, stage: Path, name: str, sample: np.ndarray, atol: float) -> _Built:
    out = stage / f"{name}.onnx"
    shutil.copyfile(src.onnx, out)
    diff = _max_diff(run_onnx(ort_session(out), sample), src.expected)
    return [out], diff, "onnxruntime", ()


def _to_openvino(src: _Source, stage: Path, name: str, sample: np.ndarray, atol: float) -> _Built:
    import openvino as ov  # noqa: PLC0415

    xml = stage / f"{name}.xml"
    try:
        # Core.read_model, not ov.convert_model: the latter forks a telemetry sender.
        model = ov.Core().read_model(str(src.onnx))
        # Weights stay f32: OpenVINO would otherwise store them as fp16.
        ov.save_model(model, str(xml), compress_to_fp16=False)
    except Exception as exc:  # OpenVINO raises its own untyped errors
        raise ConversionError(f"OpenVINO conversion failed: {exc}") from exc
    diff = _max_diff(open_runner(xml, "openvino")(sample), src.expected)
    return [xml, xml.with_suffix(".bin")], diff, "openvino", ("precision: f32",)


def _to_tflite(src: _Source, stage: Path, name: str, sample: np.ndarray, atol: float) -> _Built:
    if src.torch_model is None:
        raise ConversionError("the tflite target converts from the torch model, not from ONNX")
    out = export_tflite(src.torch_model, sample, stage / f"{name}.tflite")
    diff = _max_diff(open_runner(out, "litert")(sample), src.expected)
    notes = (f"batch size fixed at {sample.shape[0]}",)
    return [out], diff, "litert", notes


def _publish(files: list[Path], out_dir: Path) -> tuple[Path, ...]:
    out_dir.mkdir(parents=True, exist_ok=True)
    published = []
    # Companions (.bin) land before the main file, so a reader never sees it half-made.
    for staged in reversed(files):
        final = out_dir / staged.name
        tmp = out_dir / f".{staged.name}.part"
        shutil.copyfile(staged, tmp)
        tmp.replace(final)
        published.append(final)
    return tuple(reversed(published))
