"""The model check before signing: every variant loads in its runtime and runs once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from skills.bundle import build_bundle
from skills.manifest import Manifest, ModelVariant, TensorSpec
from skills.model_check import (
    ModelCheckError,
    check_bundle,
    check_models,
    parse_unchecked_targets,
    sample_shape,
)
from tests.support.tiny_models import DIGIT_INPUT, digits_like_onnx, skill_source

DIGIT = DIGIT_INPUT


def _fails_when_run(path: Path) -> Path:
    """Loads fine, but reshaping a [N, K] input to [2, 3] fails for the sample (N = K = 1)."""
    shape = numpy_helper.from_array(np.array([2, 3], np.int64), name="shape")
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "K"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [shape],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(path))
    return path


def _manifest(*variants: ModelVariant, inputs: tuple[TensorSpec, ...] = (DIGIT,)) -> Manifest:
    return Manifest(
        name="digits", version="1.0.0", entrypoint="skill:Skill", inputs=inputs, models=variants
    )


def _variant(path: str, target: str = "onnx-cpu") -> ModelVariant:
    return ModelVariant(model="classifier", target=target, path=path)


def test_a_working_onnx_model_passes(tmp_path: Path) -> None:
    digits_like_onnx(tmp_path / "models" / "m.onnx")
    assert check_models(tmp_path, _manifest(_variant("models/m.onnx"))) == ()


@pytest.mark.parametrize("target", ["onnx-cpu", "onnx-cuda", "onnx-tensorrt", "onnx-cann"])
def test_random_bytes_posing_as_onnx_are_refused_for_every_onnx_target(
    tmp_path: Path, target: str
) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "m.onnx").write_bytes(os.urandom(4000))
    with pytest.raises(ModelCheckError) as caught:
        check_models(tmp_path, _manifest(_variant("models/m.onnx", target)))
    message = str(caught.value)
    assert message.startswith(f"models/m.onnx (target {target}) does not load in ONNX Runtime: ")
    assert "\n" not in message
    assert str(tmp_path) not in message  # the check's folder is no part of the reason
    assert (caught.value.path, caught.value.target) == ("models/m.onnx", target)


def test_a_truncated_onnx_model_is_refused(tmp_path: Path) -> None:
    good = digits_like_onnx(tmp_path / "models" / "m.onnx").read_bytes()
    (tmp_path / "models" / "m.onnx").write_bytes(good[: len(good) // 2])
    with pytest.raises(ModelCheckError, match=r"^models/m.onnx \(target onnx-cpu\) does not load"):
        check_models(tmp_path, _manifest(_variant("models/m.onnx")))


def test_a_model_whose_input_differs_from_the_manifest_is_refused(tmp_path: Path) -> None:
    digits_like_onnx(tmp_path / "models" / "m.onnx")
    colour = TensorSpec(name="image", dtype="float32", shape=(-1, 3, 32, 32))
    with pytest.raises(ModelCheckError) as caught:
        check_models(tmp_path, _manifest(_variant("models/m.onnx"), inputs=(colour,)))
    assert str(caught.value) == (
        "models/m.onnx (target onnx-cpu) takes input 'x' of shape [N, 1, 8, 8], but "
        "skill.toml's input 'image' is [-1, 3, 32, 32] (size 3 where the model has 1)"
    )


def test_a_manifest_input_of_another_rank_is_refused(tmp_path: Path) -> None:
    digits_like_onnx(tmp_path / "models" / "m.onnx")
    flat = TensorSpec(name="image", dtype="float32", shape=(1, 64))
    with pytest.raises(ModelCheckError, match="rank differs"):
        check_models(tmp_path, _manifest(_variant("models/m.onnx"), inputs=(flat,)))


def test_without_manifest_inputs_the_model_signature_shapes_the_sample(tmp_path: Path) -> None:
    digits_like_onnx(tmp_path / "models" / "m.onnx")
    assert check_models(tmp_path, _manifest(_variant("models/m.onnx"), inputs=())) == ()


def test_a_model_that_loads_but_does_not_run_is_refused(tmp_path: Path) -> None:
    _fails_when_run(tmp_path / "models" / "m.onnx")
    with pytest.raises(ModelCheckError) as caught:
        check_models(tmp_path, _manifest(_variant("models/m.onnx"), inputs=()))
    assert str(caught.value).startswith(
        "models/m.onnx (target onnx-cpu) does not run in ONNX Runtime on a sample input "
        "(x [1, 1]): "
    )


def test_every_variant_is_checked_not_only_the_first(tmp_path: Path) -> None:
    digits_like_onnx(tmp_path / "models" / "good.onnx")
    (tmp_path / "models" / "bad.onnx").write_bytes(b"\x08\x07garbage" * 50)
    manifest = _manifest(
        _variant("models/good.onnx"),
        ModelVariant(
            model="classifier", target="onnx-cpu", path="models/bad.onnx", precision="int8"
        ),
    )
    with pytest.raises(ModelCheckError, match=r"^models/bad.onnx "):
        check_models(tmp_path, manifest)


def test_openvino_ir_is_run_in_openvino(tmp_path: Path) -> None:
    import openvino as ov  # noqa: PLC0415

    onnx_path = digits_like_onnx(tmp_path / "src" / "m.onnx")
    ov.save_model(ov.convert_model(str(onnx_path)), str(tmp_path / "models" / "m.xml"))
    assert (tmp_path / "models" / "m.bin").is_file()
    variant = _variant("models/m.xml", "openvino")
    assert check_models(tmp_path, _manifest(variant)) == ()

    (tmp_path / "models" / "m.bin").write_bytes(b"")  # the weights are gone
    with pytest.raises(ModelCheckError, match=r"\(target openvino\) does not load in OpenVINO: "):
        check_models(tmp_path, _manifest(variant))
    (tmp_path / "models" / "m.bin").unlink()
    with pytest.raises(ModelCheckError, match=r"its weights file m\.bin is missing"):
        check_models(tmp_path, _manifest(variant))


def test_junk_tflite_is_refused_by_litert(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "m.tflite").write_bytes(os.urandom(3000))
    with pytest.raises(ModelCheckError) as caught:
        check_models(tmp_path, _manifest(_variant("models/m.tflite", "tflite")))
    assert str(caught.value).startswith("models/m.tflite (target tflite) does not load in LiteRT: ")


def test_targets_that_cannot_run_here_need_the_loud_flag(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "m.om").write_bytes(os.urandom(100))
    (tmp_path / "models" / "m.engine").write_bytes(os.urandom(100))
    om = _variant("models/m.om", "om")
    engine = _variant("models/m.engine", "onnx-tensorrt")
    with pytest.raises(ModelCheckError) as caught:
        check_models(tmp_path, _manifest(om))
    assert "Ascend" in str(caught.value)
    assert "pass --unchecked-target om to sign it unchecked" in str(caught.value)
    with pytest.raises(ModelCheckError, match="--unchecked-target onnx-tensorrt"):
        check_models(tmp_path, _manifest(engine))

    both = _manifest(om, engine)
    allowed = parse_unchecked_targets(["om", "onnx-tensorrt"])
    assert check_models(tmp_path, both, unchecked_targets=allowed) == (om, engine)


def test_the_flag_never_lets_through_a_variant_that_can_be_checked(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "m.onnx").write_bytes(os.urandom(1000))
    variant = _variant("models/m.onnx", "onnx-tensorrt")  # an ONNX file: ONNX Runtime runs it
    with pytest.raises(ModelCheckError, match="does not load in ONNX Runtime"):
        check_models(tmp_path, _manifest(variant), unchecked_targets={"onnx-tensorrt"})


def test_an_unknown_unchecked_target_is_an_error() -> None:
    with pytest.raises(ModelCheckError, match="unknown target 'omm' for --unchecked-target"):
        parse_unchecked_targets(["om", "omm"])


@pytest.mark.parametrize(
    ("model", "declared", "expected"),
    [
        ((None, 1, 8, 8), (-1, 1, 8, 8), (1, 1, 8, 8)),
        ((None, 1, 8, 8), (4, 1, 8, 8), (4, 1, 8, 8)),
        ((None, 1, 8, 8), None, (1, 1, 8, 8)),
        ((2, None), (-1, -1), (2, 1)),
        ((), (), ()),
    ],
)
def test_sample_shape(
    model: tuple[int | None, ...], declared: tuple[int, ...] | None, expected: tuple[int, ...]
) -> None:
    assert sample_shape(model, declared) == expected


@pytest.mark.parametrize(("model", "declared"), [((None, 1, 8, 8), (1, 3, 8, 8)), ((1, 8), (8,))])
def test_sample_shape_refuses_what_the_model_cannot_take(
    model: tuple[int | None, ...], declared: tuple[int, ...]
) -> None:
    with pytest.raises(ValueError):
        sample_shape(model, declared)


def test_check_bundle_runs_the_models_of_a_built_bundle(tmp_path: Path) -> None:
    good = digits_like_onnx(tmp_path / "good.onnx").read_bytes()
    bundle = build_bundle(skill_source(tmp_path / "good", {"m.onnx": good}), tmp_path / "dist-good")
    assert check_bundle(bundle) == ()

    junk_src = skill_source(tmp_path / "junk", {"m.onnx": os.urandom(2000)})
    junk = build_bundle(junk_src, tmp_path / "dist-junk")
    with pytest.raises(ModelCheckError, match=r"^models/m.onnx \(target onnx-cpu\) does not load"):
        check_bundle(junk)


def test_the_check_imports_no_torch(tmp_path: Path) -> None:
    digits_like_onnx(tmp_path / "models" / "m.onnx")
    (tmp_path / "skill.toml").write_text(_manifest(_variant("models/m.onnx")).to_toml())
    code = (
        "import sys; from pathlib import Path\n"
        "from skills.manifest import Manifest\n"
        "from skills.model_check import check_models\n"
        "root = Path(sys.argv[1])\n"
        "check_models(root, Manifest.from_toml((root / 'skill.toml').read_text()))\n"
        "heavy = sorted(m for m in ('torch', 'openvino', 'ai_edge_litert') if m in sys.modules)\n"
        "print(heavy)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert out.stdout.strip() == "[]"
