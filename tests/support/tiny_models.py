"""Tiny ONNX models and skill sources made in milliseconds, without torch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from skills.manifest import Manifest, ModelVariant, TensorSpec

DIGIT_INPUT = TensorSpec(name="image", dtype="float32", shape=(-1, 1, 8, 8))


def digits_like_onnx(path: Path, *, input_name: str = "x") -> Path:
    """Write a classifier shaped like the digits model: [N, 1, 8, 8] in, [N, 10] out."""
    weights = numpy_helper.from_array(np.ones((64, 10), np.float32), name="w")
    graph = helper.make_graph(
        [
            helper.make_node("Flatten", [input_name], ["flat"], axis=1),
            helper.make_node("MatMul", ["flat", "w"], ["scores"]),
        ],
        "digits",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, ["N", 1, 8, 8])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", 10])],
        [weights],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(path))
    return path


def skill_source(
    root: Path,
    models: dict[str, bytes],
    *,
    target: str = "onnx-cpu",
    version: str = "1.0.0",
    sha256: str = "",
) -> Path:
    """Write a skill source folder whose ``models/`` holds ``models`` (name to bytes).

    Each file becomes a variant of ``classifier`` for ``target`` (precisions in
    order fp32, int8, ...); ``sha256`` is declared for every variant when given.
    """
    (root / "control").mkdir(parents=True)
    (root / "control" / "skill.py").write_text("class Skill:\n    pass\n")
    (root / "models").mkdir()
    variants = []
    for (name, data), precision in zip(models.items(), ("fp32", "int8", "fp16"), strict=False):
        (root / "models" / name).write_bytes(data)
        variants.append(
            ModelVariant(
                model="classifier",
                target=target,
                path=f"models/{name}",
                precision=precision,
                sha256=sha256,
            )
        )
    manifest = Manifest(
        name="tiny",
        version=version,
        entrypoint="skill:Skill",
        inputs=(DIGIT_INPUT,),
        models=tuple(variants),
    )
    (root / "skill.toml").write_text(manifest.to_toml())
    return root
