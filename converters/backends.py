"""Run a model file on one inference backend, and time it.

Backends: ``onnxruntime`` (``.onnx``), ``openvino`` (``.onnx`` or IR ``.xml``) and
``litert`` (``.tflite``). Each runner takes a float32 batch and returns the first
output. Timing uses one thread per backend so that numbers compare across
backends on a shared machine.
"""

from __future__ import annotations

import importlib.util
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from converters.errors import ConversionError, ToolMissingError

__all__ = [
    "BACKENDS",
    "Runner",
    "available_backends",
    "backend_for",
    "measure_latency_ms",
    "open_runner",
]

BACKENDS = ("onnxruntime", "openvino", "litert")
_MODULES = {"onnxruntime": "onnxruntime", "openvino": "openvino", "litert": "ai_edge_litert"}
_SUFFIXES = {"onnxruntime": {".onnx"}, "openvino": {".onnx", ".xml"}, "litert": {".tflite"}}

Runner = Callable[[np.ndarray], np.ndarray]
"""Float32 input batch in, first output out."""


def available_backends() -> tuple[str, ...]:
    """Backends whose Python package is installed here."""
    return tuple(b for b in BACKENDS if importlib.util.find_spec(_MODULES[b]) is not None)


def backend_for(path: Path) -> tuple[str, ...]:
    """Backends that can run a file, judged by its suffix."""
    return tuple(b for b in BACKENDS if path.suffix in _SUFFIXES[b])


def open_runner(path: Path, backend: str, *, threads: int = 1) -> Runner:
    """Load a model file on a backend.

    Args:
        path: The model file.
        backend: One of :data:`BACKENDS`.
        threads: Inference threads.

    Raises:
        ToolMissingError: The backend's package is not installed.
        ConversionError: Unknown backend, a file it cannot run, or a corrupt file.
    """
    if backend not in BACKENDS:
        raise ConversionError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
    if path.suffix not in _SUFFIXES[backend]:
        raise ConversionError(f"{backend} cannot run {path.suffix} files")
    if backend not in available_backends():
        raise ToolMissingError(f"backend {backend} needs the Python package {_MODULES[backend]}")
    if not path.is_file():
        raise ConversionError(f"model file {path} does not exist")
    opener = {"onnxruntime": _ort, "openvino": _openvino, "litert": _litert}[backend]
    try:
        return opener(path, threads)
    except ConversionError:
        raise
    except Exception as exc:  # each runtime raises its own untyped errors for bad files
        raise ConversionError(f"{backend} cannot load {path.name}: {exc}") from exc


def _ort(path: Path, threads: int) -> Runner:
    import onnxruntime as ort  # noqa: PLC0415

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name

    def run(x: np.ndarray) -> np.ndarray:
        return np.asarray(session.run(None, {name: x})[0])

    return _guarded("onnxruntime", run)


def _openvino(path: Path, threads: int) -> Runner:
    import openvino as ov  # noqa: PLC0415

    core = ov.Core()
    # This CPU defaults to bf16 inference; f32 keeps results comparable with the source.
    config = {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": threads}
    compiled = core.compile_model(core.read_model(str(path)), "CPU", config)
    output = compiled.output(0)
    request = compiled.create_infer_request()

    def run(x: np.ndarray) -> np.ndarray:
        return np.array(request.infer([x])[output])

    return _guarded("openvino", run)


def _litert(path: Path, threads: int) -> Runner:
    from ai_edge_litert.interpreter import Interpreter  # noqa: PLC0415

    interpreter = Interpreter(model_path=str(path), num_threads=threads)
    interpreter.allocate_tensors()
    input_detail = interpreter.get_input_details()[0]
    output_detail = interpreter.get_output_details()[0]
    fixed_batch = int(input_detail["shape"][0])

    def run(x: np.ndarray) -> np.ndarray:
        # The converter fixes the batch size, so larger batches run in slices.
        outputs = []
        for start in range(0, x.shape[0], fixed_batch):
            chunk = x[start : start + fixed_batch]
            if chunk.shape[0] != fixed_batch:
                pad = np.zeros((fixed_batch - chunk.shape[0], *chunk.shape[1:]), chunk.dtype)
                chunk = np.concatenate([chunk, pad])
            interpreter.set_tensor(input_detail["index"], _to_tensor(chunk, input_detail))
            interpreter.invoke()
            raw = interpreter.get_tensor(output_detail["index"])
            outputs.append(_from_tensor(raw, output_detail))
        return np.concatenate(outputs)[: x.shape[0]]

    return _guarded("litert", run)


def _to_tensor(x: np.ndarray, detail: dict[str, Any]) -> np.ndarray:
    dtype = np.dtype(detail["dtype"])
    if dtype == np.float32:
        return x
    # A fully integer model (INT8 input) takes values quantised with the input's scale.
    scale, zero_point = detail["quantization"]
    info = np.iinfo(dtype)
    return np.clip(np.round(x / scale) + zero_point, info.min, info.max).astype(dtype)


def _from_tensor(raw: np.ndarray, detail: dict[str, Any]) -> np.ndarray:
    if raw.dtype == np.float32:
        return np.array(raw)
    scale, zero_point = detail["quantization"]
    return (raw.astype(np.float32) - zero_point) * scale


def _guarded(backend: str, run: Runner) -> Runner:
    def guarded(x: np.ndarray) -> np.ndarray:
        try:
            return run(np.ascontiguousarray(x, dtype=np.float32))
        except Exception as exc:  # runtime errors of the backend, translated here
            raise ConversionError(f"{backend} inference failed: {exc}") from exc

    return guarded


def measure_latency_ms(
    runner: Runner, sample: np.ndarray, *, runs: int = 200, warmup: int = 20, budget_s: float = 3.0
) -> float:
    """Median wall time of one call, in milliseconds.

    Args:
        runner: From :func:`open_runner`.
        sample: The input batch (usually one image).
        runs: Timed calls at most.
        warmup: Untimed calls first.
        budget_s: Stop timing after this long (at least 5 calls are timed).

    Raises:
        ConversionError: Inference failed.
    """
    for _ in range(warmup):
        runner(sample)
    times: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(times) < runs and (len(times) < 5 or time.perf_counter() < deadline):
        started = time.perf_counter()
        runner(sample)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000.0
