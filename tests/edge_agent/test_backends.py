"""Each backend runs the same digits model on the CPU and agrees with ONNX Runtime.

Tolerances, stated once:

* float models: the largest absolute logit difference from ONNX Runtime on the whole
  test split is at most :data:`FLOAT_ATOL` (the converters' bound), and every
  prediction is the same;
* INT8 models: runtimes round differently, so the bound is :data:`INT8_REL` of the
  largest logit (OpenVINO on the same QDQ model), or, for LiteRT's own quantiser
  (a different INT8 model), at least :data:`INT8_AGREEMENT` of the predictions the same
  as ONNX Runtime's INT8 model and accuracy within :data:`INT8_ACCURACY_DROP` of float.
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import numpy as np
import pytest

from converters.tflite import litert_torch_available
from edge_agent.runtime import LiteRtBackend, LoadedModel, OnnxRuntimeBackend, OpenVinoBackend
from tests.edge_agent.digits_variants import DigitsVariants, batches, build_digits_variants

FLOAT_ATOL = 1e-4
INT8_REL = 0.02
INT8_AGREEMENT = 0.95
INT8_ACCURACY_DROP = 0.03
REPO = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not litert_torch_available(), reason="the tflite extra is not installed"),
]


@pytest.fixture(scope="module")
def variants(tmp_path_factory: pytest.TempPathFactory) -> DigitsVariants:
    return build_digits_variants(tmp_path_factory.mktemp("digits-variants"))


def logits(model: LoadedModel, x: np.ndarray) -> np.ndarray:
    name = model.input_names[0]
    return np.concatenate([next(iter(model.run({name: b}).values())) for b in batches(x)])


def labels(y: np.ndarray) -> np.ndarray:
    return y[: len(y) - len(y) % 16]


def test_float_models_agree_with_onnxruntime(variants: DigitsVariants) -> None:
    x = variants.data.test.x
    reference = logits(OnnxRuntimeBackend().load(variants.onnx_fp32, "onnx-cpu"), x)
    ov = OpenVinoBackend().load(variants.openvino_fp32, "openvino")
    lite = LiteRtBackend().load(variants.tflite_fp32, "tflite")
    assert lite.provider == "cpu (ai_edge_litert.interpreter)"
    for model in (ov, lite):
        got = logits(model, x)
        assert float(np.max(np.abs(got - reference))) <= FLOAT_ATOL, model.backend
        assert np.array_equal(got.argmax(1), reference.argmax(1)), model.backend
    accuracy = float(np.mean(reference.argmax(1) == labels(variants.data.test.y)))
    assert accuracy > 0.85


def test_int8_models_agree_with_onnxruntime_int8(variants: DigitsVariants) -> None:
    assert variants.tflite_int8 is not None
    x, y = variants.data.test.x, labels(variants.data.test.y)
    ort_int8 = logits(OnnxRuntimeBackend().load(variants.onnx_int8, "onnx-cpu"), x)
    ov_int8 = logits(OpenVinoBackend().load(variants.onnx_int8, "openvino"), x)
    bound = INT8_REL * float(np.max(np.abs(ort_int8)))
    assert float(np.max(np.abs(ov_int8 - ort_int8))) <= bound
    lite = LiteRtBackend().load(variants.tflite_int8, "tflite")  # integer in and out
    lite_int8 = logits(lite, x)
    assert lite_int8.dtype == np.float32  # dequantised by the backend
    agreement = float(np.mean(lite_int8.argmax(1) == ort_int8.argmax(1)))
    assert agreement >= INT8_AGREEMENT
    ort_fp32 = logits(OnnxRuntimeBackend().load(variants.onnx_fp32, "onnx-cpu"), x)
    float_acc = float(np.mean(ort_fp32.argmax(1) == y))
    assert float(np.mean(lite_int8.argmax(1) == y)) >= float_acc - INT8_ACCURACY_DROP


# -- the tflite-runtime path: an older ARM image's stack, numpy 1.x -------------

TFLITE_RUNTIME_VENV = REPO / ".build" / "venvs" / "tflite-runtime"
TFLITE_RUNTIME_PINS = ["tflite-runtime==2.14.0", "numpy==1.26.4", "protobuf==7.36.2"]
CHECK = """
import sys, numpy as np
from pathlib import Path
from edge_agent.runtime import LiteRtBackend
backend = LiteRtBackend()
model = backend.load(Path(sys.argv[1]), "tflite")
x = np.load(sys.argv[2])
out = np.concatenate([model.run({model.input_names[0]: x[i:i + 16]})[model.output_names[0]]
                      for i in range(0, len(x), 16)])
np.save(sys.argv[3], out)
print(backend.library, np.__version__)
"""


def tflite_runtime_python() -> Path:
    """A virtual environment with tflite-runtime and numpy 1.x (made once, under .build)."""
    python = TFLITE_RUNTIME_VENV / "bin" / "python"
    if not python.exists():
        venv.EnvBuilder(with_pip=True, clear=True).create(TFLITE_RUNTIME_VENV)
        subprocess.run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "-q",
                "--only-binary=:all:",
                *TFLITE_RUNTIME_PINS,
            ],
            check=True,
            timeout=600,
        )
    return python


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="tflite-runtime 2.14 has no wheel here")
def test_tflite_runtime_with_numpy_1_runs_the_same_model(
    variants: DigitsVariants, tmp_path: Path
) -> None:
    python = tflite_runtime_python()
    x = variants.data.test.x[:160]
    np.save(tmp_path / "x.npy", x)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [str(python), "-c", CHECK, str(variants.tflite_fp32), str(tmp_path / "x.npy"),
         str(tmp_path / "y.npy")],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["tflite_runtime.interpreter", "1.26.4"]
    reference = logits(OnnxRuntimeBackend().load(variants.onnx_fp32, "onnx-cpu"), x)
    got = np.load(tmp_path / "y.npy")
    assert float(np.max(np.abs(got - reference))) <= FLOAT_ATOL
