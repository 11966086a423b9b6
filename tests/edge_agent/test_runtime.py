"""The runtime facade: variant selection by device order, and real backends running a model."""

from __future__ import annotations

import hashlib
import logging
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edge_agent.errors import RuntimeBackendError
from edge_agent.runtime import (
    Backend,
    LiteRtBackend,
    OnnxRuntimeBackend,
    OpenVinoBackend,
    Runtime,
    select_variant,
)
from skills.manifest import Manifest, ModelVariant

RNG = np.random.default_rng(7)
WEIGHTS = RNG.normal(size=(64, 10)).astype(np.float32)
BIAS = RNG.normal(size=10).astype(np.float32)


def tiny_model_bytes() -> bytes:
    """Flatten + MatMul + Add: image [N,1,8,8] -> logits [N,10]."""
    graph = helper.make_graph(
        [
            helper.make_node("Flatten", ["image"], ["flat"]),
            helper.make_node("MatMul", ["flat", "w"], ["mm"]),
            helper.make_node("Add", ["mm", "b"], ["logits"]),
        ],
        "tiny",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(WEIGHTS, "w"), numpy_helper.from_array(BIAS, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model.SerializeToString()


def expected_logits(images: np.ndarray) -> np.ndarray:
    return images.reshape(len(images), 64) @ WEIGHTS + BIAS


def variant(
    target: str, path: str = "", data: bytes = b"", precision: str = "fp32"
) -> ModelVariant:
    return ModelVariant(
        model="classifier",
        target=target,
        path=path or f"models/classifier-{target}-{precision}.onnx",
        sha256=hashlib.sha256(data).hexdigest() if data else "",
        size=len(data),
        precision=precision,
    )


def skill_with(tmp_path: Path, *targets: str) -> tuple[Path, Manifest]:
    """A skill folder holding the tiny model once per target (ONNX files: ORT and OpenVINO
    both read them)."""
    data = tiny_model_bytes()
    (tmp_path / "models").mkdir()
    variants = []
    for target in targets:
        v = variant(target, data=data)
        (tmp_path / v.path).write_bytes(data)
        variants.append(v)
    return tmp_path, Manifest(
        name="tiny", version="1.0.0", entrypoint="m:C", models=tuple(variants)
    )


class MissingBackend(Backend):
    """A backend whose library is not installed: the real import fails."""

    name = "missing"
    targets: ClassVar[frozenset[str]] = frozenset({"om"})
    _module = "edgeskill_no_such_runtime_module"

    def _load(self, library, path, target, name):  # type: ignore[no-untyped-def]
        raise AssertionError("never loaded")


def test_select_follows_the_device_order_not_the_bundle_order() -> None:
    variants = [variant("onnx-cpu"), variant("openvino")]
    backends = [OnnxRuntimeBackend(), OpenVinoBackend()]
    if not OpenVinoBackend().available():
        pytest.skip("openvino does not import here")
    assert select_variant(variants, ["openvino", "onnx-cpu"], backends).target == "openvino"
    assert select_variant(variants, ["onnx-cpu", "openvino"], backends).target == "onnx-cpu"


def test_select_prefers_the_first_listed_variant_of_a_target() -> None:
    variants = [variant("onnx-cpu", precision="int8"), variant("onnx-cpu", precision="fp32")]
    chosen = select_variant(variants, ["onnx-cpu"], [OnnxRuntimeBackend()])
    assert chosen.precision == "int8"


def test_select_follows_the_device_precision_preference() -> None:
    variants = [variant("onnx-cpu", precision="fp32"), variant("onnx-cpu", precision="int8")]
    backends = [OnnxRuntimeBackend()]
    int8_first = select_variant(variants, ["onnx-cpu"], backends, ("int8", "fp32"))
    fp32_first = select_variant(variants, ["onnx-cpu"], backends, ("fp32", "int8"))
    assert (int8_first.precision, fp32_first.precision) == ("int8", "fp32")
    # Target order still comes first: a preferred precision does not pull in a worse target.
    only_fp32 = [variant("onnx-cpu", precision="fp32"), variant("tflite", precision="int8")]
    chosen = select_variant(only_fp32, ["onnx-cpu", "tflite"], backends, ("int8",))
    assert chosen.target == "onnx-cpu"


def test_select_skips_targets_whose_backend_is_not_installed() -> None:
    variants = [variant("om"), variant("onnx-cpu")]
    backends = [MissingBackend(), OnnxRuntimeBackend()]
    assert select_variant(variants, ["om", "onnx-cpu"], backends).target == "onnx-cpu"


def test_select_fails_naming_both_sides_when_nothing_fits() -> None:
    variants = [variant("onnx-tensorrt"), variant("om")]
    backends = [MissingBackend(), OnnxRuntimeBackend()]
    with pytest.raises(RuntimeBackendError) as info:
        select_variant(variants, ["om", "onnx-cpu"], backends)
    message = str(info.value)
    assert "onnx-tensorrt" in message and "'om'" in message  # what the bundle has
    assert "can run ['onnx-cpu']" in message  # what the device can run


def test_runtime_runs_the_model_on_onnxruntime(tmp_path: Path) -> None:
    skill_dir, manifest = skill_with(tmp_path, "onnx-cpu")
    runtime = Runtime(skill_dir, manifest, ["onnx-cuda", "onnx-cpu"])
    model = runtime.model("classifier")
    images = RNG.random((3, 1, 8, 8), dtype=np.float32)
    logits = model.run({"image": images})["logits"]
    assert logits.shape == (3, 10)
    np.testing.assert_allclose(logits, expected_logits(images), rtol=1e-5, atol=1e-5)
    assert (model.backend, model.target, model.provider) == (
        "onnxruntime",
        "onnx-cpu",
        "CPUExecutionProvider",
    )
    assert model.input_names == ("image",) and model.output_names == ("logits",)
    assert runtime.model("classifier") is model  # loaded once


def test_missing_provider_falls_back_to_cpu_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    onnxruntime = pytest.importorskip("onnxruntime")
    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this ONNX Runtime has CUDA; nothing to fall back from")
    skill_dir, manifest = skill_with(tmp_path, "onnx-cuda")
    with caplog.at_level(logging.WARNING, logger="edge_agent.runtime"):
        model = Runtime(skill_dir, manifest, ["onnx-cuda"]).model("classifier")
    assert model.target == "onnx-cuda" and model.provider == "CPUExecutionProvider"
    assert "CUDAExecutionProvider" in caplog.text


def test_bad_feeds_raise_our_error(tmp_path: Path) -> None:
    skill_dir, manifest = skill_with(tmp_path, "onnx-cpu")
    model = Runtime(skill_dir, manifest, ["onnx-cpu"]).model("classifier")
    with pytest.raises(RuntimeBackendError, match="takes inputs"):
        model.run({"pixels": np.zeros((1, 1, 8, 8), np.float32)})
    with pytest.raises(RuntimeBackendError, match="failed on onnxruntime"):
        model.run({"image": np.zeros((1, 1, 8, 8), np.float64)})


def test_runtime_rejects_unknown_models_and_tampered_files(tmp_path: Path) -> None:
    skill_dir, manifest = skill_with(tmp_path, "onnx-cpu")
    runtime = Runtime(skill_dir, manifest, ["onnx-cpu"])
    with pytest.raises(RuntimeBackendError, match="no model 'detector'"):
        runtime.model("detector")
    path = skill_dir / manifest.models[0].path
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(RuntimeBackendError, match="sha256"):
        runtime.model("classifier")
    path.write_bytes(bytes(data) + b"x")
    with pytest.raises(RuntimeBackendError, match="bytes, the manifest says"):
        runtime.model("classifier")


def test_runtime_error_names_the_model_when_nothing_fits(tmp_path: Path) -> None:
    skill_dir, manifest = skill_with(tmp_path, "onnx-tensorrt")
    with pytest.raises(RuntimeBackendError, match=r"model 'classifier': no model variant fits"):
        Runtime(skill_dir, manifest, ["tflite"], backends=[OnnxRuntimeBackend()]).model(
            "classifier"
        )


def test_openvino_agrees_with_onnxruntime(tmp_path: Path) -> None:
    pytest.importorskip("openvino")
    skill_dir, manifest = skill_with(tmp_path, "onnx-cpu", "openvino")
    ort_model = Runtime(skill_dir, manifest, ["onnx-cpu"]).model("classifier")
    ov_model = Runtime(skill_dir, manifest, ["openvino"]).model("classifier")
    assert ov_model.backend == "openvino" and ov_model.input_names == ("image",)
    images = RNG.random((4, 1, 8, 8), dtype=np.float32)
    ov_logits = ov_model.run({"image": images})["logits"]
    np.testing.assert_allclose(ov_logits, ort_model.run({"image": images})["logits"], atol=1e-5)
    again = ov_model.run({"image": images[:1]})["logits"]  # results are copies, not views
    np.testing.assert_allclose(ov_logits[:1], again, atol=1e-5)
    assert not np.shares_memory(ov_logits, again)


def test_openvino_keeps_the_model_files_output_names(tmp_path: Path) -> None:
    """An output made by an Identity (as converted models end) keeps its own name.

    OpenVINO folds the Identity into the node before it, and the compiled port then
    carries both names; the backend must still report, and key results by, the file's.
    """
    pytest.importorskip("openvino")
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["x", "one"], ["add_7"]),
            helper.make_node("Identity", ["add_7"], ["scores"]),
        ],
        "identity-out",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 3])],
        [numpy_helper.from_array(np.ones((1, 3), np.float32), "one")],
    )
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    model = OpenVinoBackend().load(path, "openvino")
    assert (model.input_names, model.output_names) == (("x",), ("scores",))
    out = model.run({"x": np.zeros((1, 3), np.float32)})
    assert list(out) == ["scores"]
    np.testing.assert_allclose(out["scores"], np.ones((1, 3)))


def test_litert_rejects_a_file_that_is_not_tflite(tmp_path: Path) -> None:
    pytest.importorskip("ai_edge_litert.interpreter")
    path = tmp_path / "model.tflite"
    path.write_bytes(tiny_model_bytes())
    with pytest.raises(RuntimeBackendError, match="litert could not load"):
        LiteRtBackend().load(path, "tflite")
    with pytest.raises(RuntimeBackendError, match="does not serve"):
        LiteRtBackend().load(path, "onnx-cpu")


def test_importing_the_runtime_loads_no_inference_library() -> None:
    code = (
        "import sys, edge_agent.runtime\n"
        "heavy = {'onnxruntime', 'openvino', 'ai_edge_litert', 'torch'} & set(sys.modules)\n"
        "print(sorted(heavy))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"
