"""Export torch models to ONNX and check the export against torch in ONNX Runtime."""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from converters._files import atomic_write_bytes
from converters._loop import predict
from converters.digits import Split
from converters.errors import ConversionError

if TYPE_CHECKING:
    import onnxruntime as ort

__all__ = [
    "check_onnx",
    "export_onnx",
    "onnx_accuracy",
    "ort_session",
    "run_onnx",
]

MAX_ONNX_BYTES = 2 * 1024**3 - 1  # protobuf's hard limit for one self-contained file
_EVAL_BATCH = 512


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    # The dynamo exporter warns from stdlib modules (copyreg) and logs about optional
    # torchvision ops; neither says anything about our model.
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            yield
    finally:
        logger.setLevel(level)


def export_onnx(
    model: torch.nn.Module,
    sample: np.ndarray,
    out: Path,
    *,
    input_name: str = "image",
    output_name: str = "logits",
    opset: int = 20,
) -> Path:
    """Export a single-input, single-output model with the dynamo exporter.

    The batch dimension (axis 0) is dynamic; the file is self-contained (no external
    data) and appears at ``out`` only once complete.

    Args:
        model: The torch model; it is put in eval mode.
        sample: An example input batch (float32), used to trace the graph.
        out: Destination ``.onnx`` path.
        input_name: Name of the graph input.
        output_name: Name of the graph output.
        opset: ONNX opset version.

    Returns:
        ``out``.

    Raises:
        ConversionError: The exporter failed or the model is too large for one file.
    """
    model.eval()
    x = torch.from_numpy(np.ascontiguousarray(sample, dtype=np.float32))
    batch = torch.export.Dim("batch", min=1, max=65536)
    try:
        with _quiet_exporter(), torch.no_grad():
            program = torch.onnx.export(
                model,
                (x,),
                dynamo=True,
                opset_version=opset,
                input_names=[input_name],
                output_names=[output_name],
                dynamic_shapes=({0: batch},),
                external_data=False,
                verbose=False,
            )
        if program is None:
            raise ConversionError("the ONNX exporter returned no program")
        proto = program.model_proto
        for node in proto.graph.node:  # torch stack traces: debugging aid, ~3 % of the file
            del node.metadata_props[:]
        data = proto.SerializeToString()
    except ConversionError:
        raise
    except Exception as exc:  # the exporter raises many unrelated types
        raise ConversionError(f"ONNX export of {type(model).__name__} failed: {exc}") from exc
    if len(data) > MAX_ONNX_BYTES:
        raise ConversionError(f"model is {len(data)} bytes, over the {MAX_ONNX_BYTES} byte limit")
    atomic_write_bytes(out, data)
    return out


def ort_session(onnx_path: Path) -> ort.InferenceSession:
    """Open an ONNX Runtime CPU session.

    Raises:
        ConversionError: The file is missing, corrupt or not runnable.
    """
    import onnxruntime as ort  # noqa: PLC0415

    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        return ort.InferenceSession(
            str(onnx_path), sess_options=options, providers=["CPUExecutionProvider"]
        )
    except Exception as exc:  # onnxruntime raises its own untyped Fail/InvalidGraph errors
        raise ConversionError(f"ONNX Runtime cannot load {onnx_path.name}: {exc}") from exc


def run_onnx(session: ort.InferenceSession, x: np.ndarray) -> np.ndarray:
    """Run the first input/output of an ONNX Runtime session in batches.

    Raises:
        ConversionError: Inference failed.
    """
    name = session.get_inputs()[0].name
    outputs = []
    try:
        for start in range(0, x.shape[0], _EVAL_BATCH):
            chunk = np.ascontiguousarray(x[start : start + _EVAL_BATCH], dtype=np.float32)
            outputs.append(np.asarray(session.run(None, {name: chunk})[0]))
    except Exception as exc:
        raise ConversionError(f"ONNX Runtime inference failed: {exc}") from exc
    return np.concatenate(outputs, axis=0)


def check_onnx(
    model: torch.nn.Module, onnx_path: Path, samples: np.ndarray, atol: float = 1e-4
) -> float:
    """Compare an ONNX file with its torch source on sample inputs.

    Args:
        model: The torch source model.
        onnx_path: The exported file.
        samples: Input batch (float32).
        atol: Largest allowed absolute difference of any output element.

    Returns:
        The largest absolute difference seen.

    Raises:
        ConversionError: The file does not load or run, shapes differ, or the
            difference exceeds ``atol``.
    """
    expected = predict(model, samples)
    got = run_onnx(ort_session(onnx_path), samples)
    if got.shape != expected.shape:
        raise ConversionError(f"output shape {got.shape} differs from torch's {expected.shape}")
    diff = float(np.max(np.abs(got.astype(np.float64) - expected))) if got.size else 0.0
    if not diff <= atol:  # written this way so NaN fails too
        raise ConversionError(f"ONNX output differs from torch by {diff:.3g} > atol {atol:.3g}")
    return diff


def onnx_accuracy(onnx_path: Path, split: Split) -> float:
    """Top-1 accuracy of an ONNX classifier on a split, run in ONNX Runtime.

    Raises:
        ConversionError: The file does not load or run.
    """
    logits = run_onnx(ort_session(onnx_path), split.x)
    return float(np.mean(logits.argmax(axis=1) == split.y)) if len(split) else 0.0
