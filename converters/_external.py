"""Targets built by vendor command-line tools: TensorRT engines (``trtexec``) and
Ascend OM files (``atc``). Neither tool is on PyPI; without them these steps raise
:class:`ToolMissingError` saying what to install."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np

from converters.errors import ConversionError, ToolMissingError

TOOL_TIMEOUT_S = 1800
MAX_TOOL_OUTPUT_BYTES = 256 * 1024**2
ENGINE_TOLERANCE = 5e-2
OM_TOLERANCE = 5e-2

_Built = tuple[list[Path], float, str, tuple[str, ...]]


def _run(argv: list[str], what: str) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, timeout=TOOL_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConversionError(f"{what} could not run: {exc}") from exc
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).decode(errors="replace")[-2000:]
        raise ConversionError(f"{what} failed (exit {done.returncode}): {tail}")


def _input_name(onnx_path: Path) -> str:
    import onnx  # noqa: PLC0415

    return str(onnx.load(str(onnx_path), load_external_data=False).graph.input[0].name)


def _diff(got: np.ndarray, expected: np.ndarray, what: str, atol: float) -> float:
    if got.size != expected.size:
        raise ConversionError(f"{what}: output has {got.size} values, the source {expected.size}")
    diff = float(np.max(np.abs(got.reshape(expected.shape) - expected))) if got.size else 0.0
    if not diff <= atol:
        raise ConversionError(f"{what}: outputs differ from the source by {diff:.3g} > {atol:.3g}")
    return diff


def tensorrt_engine(
    onnx_path: Path, expected: np.ndarray, sample: np.ndarray, engine: bool | None
) -> tuple[list[Path], tuple[str, ...]]:
    """Build and check ``<name>.engine`` next to the ONNX file with ``trtexec``.

    Raises:
        ToolMissingError: ``engine`` is True and ``trtexec`` is not on PATH.
        ConversionError: The build failed or the engine's outputs differ.
    """
    if engine is False:
        return [], ("TensorRT engine not requested",)
    trtexec = shutil.which("trtexec")
    if trtexec is None:
        message = (
            "a TensorRT engine needs trtexec (NVIDIA TensorRT) on PATH; the ONNX file still "
            "serves ONNX Runtime's TensorRT execution provider"
        )
        if engine:
            raise ToolMissingError(message)
        return [], (message,)
    name = _input_name(onnx_path)
    shape = "x".join(str(d) for d in sample.shape)
    one = "x".join(str(d) for d in (1, *sample.shape[1:]))
    plan = onnx_path.with_suffix(".engine")
    _run(
        [trtexec, f"--onnx={onnx_path}", f"--saveEngine={plan}", f"--minShapes={name}:{one}",
         f"--optShapes={name}:{shape}", f"--maxShapes={name}:{shape}"],
        "trtexec build",
    )  # fmt: skip
    inputs, outputs = plan.with_suffix(".in.bin"), plan.with_suffix(".out.json")
    inputs.write_bytes(sample.tobytes())
    _run(
        [trtexec, f"--loadEngine={plan}", f"--loadInputs={name}:{inputs}",
         f"--shapes={name}:{shape}", f"--exportOutput={outputs}"],
        "trtexec check",
    )  # fmt: skip
    if outputs.stat().st_size > MAX_TOOL_OUTPUT_BYTES:
        raise ConversionError("trtexec output is too large to check")
    try:
        values = np.asarray(json.loads(outputs.read_text())[0]["values"], dtype=np.float64)
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise ConversionError(f"cannot read trtexec's output: {exc}") from exc
    diff = _diff(values, expected, "TensorRT engine", ENGINE_TOLERANCE)
    return [plan], (f"TensorRT engine max abs diff {diff:.3g}",)


def to_om(
    onnx_path: Path, expected: np.ndarray, stage: Path, name: str, sample: np.ndarray
) -> _Built:
    """Build ``<name>.om`` for an Ascend NPU with ``atc`` and check it with ``ais_bench``.

    The SoC is ``$EDGESKILL_ASCEND_SOC`` (default ``Ascend310``).

    Raises:
        ToolMissingError: ``atc`` is not on PATH, or ``ais_bench`` is missing for the check.
        ConversionError: ``atc`` failed or the OM's outputs differ.
    """
    atc = shutil.which("atc")
    if atc is None:
        raise ToolMissingError(
            "the om target needs atc from Huawei's CANN toolkit on PATH (not on PyPI); "
            "meanwhile the onnx-cann target serves ONNX Runtime's CANN execution provider"
        )
    soc = os.environ.get("EDGESKILL_ASCEND_SOC", "Ascend310")
    shape = ",".join(str(d) for d in sample.shape)
    _run(
        [atc, f"--model={onnx_path}", "--framework=5", f"--output={stage / name}",
         f"--soc_version={soc}", f"--input_shape={_input_name(onnx_path)}:{shape}"],
        "atc",
    )  # fmt: skip
    om = stage / f"{name}.om"
    try:
        from ais_bench.infer.interface import InferSession  # noqa: PLC0415
    except ImportError as exc:
        raise ToolMissingError(
            "atc built the OM file but checking it needs ais_bench (CANN tools) installed"
        ) from exc
    try:
        got = np.asarray(InferSession(0, str(om)).infer([sample])[0], dtype=np.float64)
    except Exception as exc:  # ACL errors are untyped
        raise ConversionError(f"the OM file does not run: {exc}") from exc
    return [om], _diff(got, expected, "om", OM_TOLERANCE), "ais_bench", (f"soc {soc}",)
