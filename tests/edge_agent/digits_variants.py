"""The digits model converted once per backend: ONNX (fp32, int8), OpenVINO IR, TFLite (fp32, int8).

Shared by the backend agreement tests and the firmware proof. Training takes about a
second; the TFLite export runs litert-torch in a child process (tens of seconds).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from converters.digits import DigitsData, load_digits_data, train_digits
from converters.onnx_export import export_onnx
from converters.quantize import quantize_int8
from converters.targets import convert
from converters.tflite import quantize_tflite_int8

#: The TFLite batch is fixed at export; every comparison runs batches of this size.
BATCH = 16


@dataclass(frozen=True)
class DigitsVariants:
    """One trained digits model in every format the agent's backends read."""

    data: DigitsData
    onnx_fp32: Path
    onnx_int8: Path
    openvino_fp32: Path
    tflite_fp32: Path
    tflite_int8: Path | None


def build_digits_variants(
    out: Path, *, epochs: int = 3, int8_tflite: bool = True
) -> DigitsVariants:
    """Train the digits CNN and convert it for every backend, each checked by the converter.

    Raises:
        ConversionError: a conversion failed or disagreed with its source.
        ToolMissingError: litert-torch (the ``tflite`` extra) is not installed.
    """
    out.mkdir(parents=True, exist_ok=True)
    data = load_digits_data(seed=0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model on a shared machine: one thread is fastest
    try:
        model, _ = train_digits(data, epochs=epochs, seed=0)
        onnx_fp32 = export_onnx(model, data.test.x[:BATCH], out / "digits.onnx")
        onnx_int8 = quantize_int8(onnx_fp32, out / "digits-int8.onnx", data.train.x[:300])
        sample = data.test.x[:BATCH]
        ov = convert(onnx_fp32, "openvino", out / "openvino", sample=sample, name="digits")
        tfl = convert(model, "tflite", out / "tflite", sample=sample, name="digits")
    finally:
        torch.set_num_threads(threads)
    tflite_int8 = None
    if int8_tflite:
        tflite_int8 = quantize_tflite_int8(
            tfl.artifacts[0], out / "tflite" / "digits-int8.tflite", data.train.x[:320]
        )
    return DigitsVariants(
        data, onnx_fp32, onnx_int8, ov.artifacts[0], tfl.artifacts[0], tflite_int8
    )


def batches(x: np.ndarray) -> list[np.ndarray]:
    """``x`` cut into full batches of :data:`BATCH` (the tail is dropped)."""
    return [x[i : i + BATCH] for i in range(0, len(x) - BATCH + 1, BATCH)]


_NAMED_EXPORT = """
import sys, numpy as np, torch, litert_torch
model = torch.load(sys.argv[1], weights_only=False).eval()
sample = torch.from_numpy(np.load(sys.argv[2]))

class Named(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, image):
        return {"logits": self.inner(image)}

with torch.no_grad():
    litert_torch.convert(Named(model), sample_args=(), sample_kwargs={"image": sample}).export(
        sys.argv[3]
    )
"""


def export_named_tflite(model: torch.nn.Module, sample: np.ndarray, out: Path) -> Path:
    """A ``.tflite`` whose signature names the tensors as the ONNX export does (``image`` in,
    ``logits`` out), so the digits skill's control code runs it unchanged.

    converters.tflite exports positionally (``args_0``/``output_0``); a skill that names
    its tensors cannot run those files (reported for the converter).
    """
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    work = out.parent
    work.mkdir(parents=True, exist_ok=True)
    torch.save(model, work / "named-model.pt")
    np.save(work / "named-sample.npy", np.ascontiguousarray(sample, dtype=np.float32))
    subprocess.run(
        [sys.executable, "-c", _NAMED_EXPORT, str(work / "named-model.pt"),
         str(work / "named-sample.npy"), str(out)],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    return out


def train_digits_model(epochs: int = 3) -> tuple[torch.nn.Module, DigitsData]:
    """The digits CNN trained on one thread."""
    data = load_digits_data(seed=0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model, _ = train_digits(data, epochs=epochs, seed=0)
    finally:
        torch.set_num_threads(threads)
    return model, data
