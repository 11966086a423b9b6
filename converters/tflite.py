"""TFLite (LiteRT) export from torch through the optional ``litert-torch`` package,
and INT8 quantisation of a ``.tflite`` file with ``ai-edge-quantizer``.

``litert-torch`` keeps NCHW layout and exact float32 numerics but fixes the batch
size at export. It is an optional extra (it brings jax and torchao); without it
these functions raise :class:`ToolMissingError` naming what to install.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import logging
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

from converters._files import atomic_write_bytes
from converters._tflite_worker import MISSING_EXIT_CODE
from converters.errors import ConversionError, ToolMissingError

__all__ = ["LITERT_EXTRA", "export_tflite", "litert_torch_available", "quantize_tflite_int8"]

LITERT_EXTRA = (
    "litert-torch==0.10.0 (install it with --no-deps, plus litert-converter==0.5.0, "
    "jax==0.10.2, jaxlib==0.10.2, opt-einsum, torchao==0.18.0, ai-edge-quantizer==0.10.0, "
    "immutabledict, absl-py)"
)
_MAX_CALIBRATION = 1000
WORKER_TIMEOUT_S = 900


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    # The converter prints progress lines and raises advisory warnings from torch internals.
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    sink = io.StringIO()
    try:
        with (
            warnings.catch_warnings(),
            contextlib.redirect_stdout(sink),
            contextlib.redirect_stderr(sink),
        ):
            warnings.simplefilter("ignore")
            yield
    finally:
        root.setLevel(level)


def _import(module: str) -> ModuleType:
    try:
        with _quiet():
            return importlib.import_module(module)
    except ImportError as exc:
        raise ToolMissingError(f"TFLite conversion needs {LITERT_EXTRA}: {exc}") from exc


def litert_torch_available() -> bool:
    """Whether ``litert-torch`` is installed (checked without importing it)."""
    return importlib.util.find_spec("litert_torch") is not None


def export_tflite(model: torch.nn.Module, sample: np.ndarray, out: Path) -> Path:
    """Convert a torch model to ``.tflite``; the batch size is fixed to ``sample``'s.

    The converter runs in a child process: it imports jax, whose threads make any
    later ``os.fork`` in this process unsafe (jax warns about it).

    Raises:
        ToolMissingError: ``litert-torch`` (or one of its dependencies) is not installed.
        ConversionError: The converter failed.
    """
    if not litert_torch_available():
        raise ToolMissingError(f"TFLite conversion needs {LITERT_EXTRA}")
    model.eval()
    with tempfile.TemporaryDirectory(prefix="edgeskill-tflite-") as tmp:
        work = Path(tmp)
        # A private file this process wrote a moment ago: unpickling it in the child is safe.
        torch.save(model, work / "model.pt")
        np.save(work / "sample.npy", np.ascontiguousarray(sample, dtype=np.float32))
        staged = work / "model.tflite"
        argv = [sys.executable, "-m", "converters._tflite_worker", str(work), str(staged)]
        try:
            done = subprocess.run(argv, capture_output=True, timeout=WORKER_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ConversionError(f"TFLite conversion could not run: {exc}") from exc
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        if done.returncode == MISSING_EXIT_CODE:
            raise ToolMissingError(f"TFLite conversion needs {LITERT_EXTRA}: {tail[0]}")
        if done.returncode != 0 or not staged.is_file():
            raise ConversionError(
                f"TFLite conversion of {type(model).__name__} failed: {tail[0][:500]}"
            )
        atomic_write_bytes(out, staged.read_bytes())
    return out


def quantize_tflite_int8(tflite_in: Path, out: Path, calibration: np.ndarray) -> Path:
    """Static INT8 quantisation (weights and activations) of a float ``.tflite`` file.

    The result takes and returns INT8 tensors; :func:`converters.backends.open_runner`
    quantises inputs and dequantises outputs with the stored scales.

    Raises:
        ToolMissingError: ``ai-edge-quantizer`` is not installed.
        ConversionError: Bad calibration data or the quantiser failed.
    """
    quantizer = _import("ai_edge_quantizer.quantizer")
    recipe = _import("ai_edge_quantizer.recipe")
    interpreter_mod = _import("ai_edge_litert.interpreter")
    if calibration.ndim < 2 or not 0 < calibration.shape[0] <= _MAX_CALIBRATION:
        raise ConversionError(
            f"need 1..{_MAX_CALIBRATION} calibration inputs, got {calibration.shape}"
        )
    try:
        with _quiet():
            signatures = interpreter_mod.Interpreter(model_path=str(tflite_in)).get_signature_list()
            signature = next(iter(signatures))
            input_name = signatures[signature]["inputs"][0]
            batch = _fixed_batch(interpreter_mod, tflite_in)
            feeds = [
                {input_name: np.ascontiguousarray(calibration[i : i + batch], dtype=np.float32)}
                for i in range(0, calibration.shape[0] - batch + 1, batch)
            ]
            qt = quantizer.Quantizer(str(tflite_in))
            qt.load_quantization_recipe(recipe.static_wi8_ai8())
            result = qt.calibrate({signature: feeds}, num_threads=1)
            quantized = qt.quantize(result, enable_progress_report=False)
            data = bytes(quantized.quantized_model)
    except Exception as exc:  # the quantiser raises many unrelated types
        raise ConversionError(
            f"TFLite INT8 quantisation of {tflite_in.name} failed: {exc}"
        ) from exc
    atomic_write_bytes(out, data)
    return out


def _fixed_batch(interpreter_mod: ModuleType, path: Path) -> int:
    interpreter = interpreter_mod.Interpreter(model_path=str(path))
    return int(interpreter.get_input_details()[0]["shape"][0])
