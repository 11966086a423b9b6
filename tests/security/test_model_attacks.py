"""Hostile model files inside a signed bundle: nothing in them runs, nothing outside is read.

A publisher's signature says who built a bundle, not that its models are
harmless. The agent's runtime never unpickles (there is no torch on the
device), loads ONNX only through ONNX Runtime, refuses external tensor data
outside the skill's folder, and checks every model file against the manifest.
"""

from __future__ import annotations

import hashlib
import pickle
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edge_agent.errors import RuntimeBackendError
from edge_agent.runtime import Runtime
from skills.manifest import Manifest, ModelVariant

TARGETS = ("onnx-cpu",)


class _Payload:
    """Unpickling this touches a file: proof that someone ran the pickle."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return (Path.touch, (self.marker,))


def _runtime(skill_dir: Path, rel: str) -> Runtime:
    data = (skill_dir / rel).read_bytes()
    variant = ModelVariant(
        model="m",
        target="onnx-cpu",
        path=rel,
        sha256=hashlib.sha256(data).hexdigest(),
        size=len(data),
    )
    manifest = Manifest(name="hostile", version="1.0.0", entrypoint="x:Y", models=(variant,))
    return Runtime(skill_dir, manifest, TARGETS)


def test_a_pickle_posing_as_a_model_is_refused_and_never_unpickled(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    skill = tmp_path / "skill"
    (skill / "models").mkdir(parents=True)
    (skill / "models" / "m.onnx").write_bytes(pickle.dumps(_Payload(marker)))
    (skill / "models" / "m.pt").write_bytes(pickle.dumps(_Payload(marker)))

    for rel in ("models/m.onnx", "models/m.pt"):
        with pytest.raises(RuntimeBackendError):
            _runtime(skill, rel).model("m")
    assert not marker.exists()


def _model_with_external_data(skill: Path, location: str) -> None:
    weights = numpy_helper.from_array(np.ones((2, 2), np.float32), name="w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])],
        [weights],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    weights = model.graph.initializer[0]
    weights.ClearField("raw_data")
    weights.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", "16")):
        entry = weights.external_data.add()
        entry.key, entry.value = key, value
    (skill / "models").mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(skill / "models" / "m.onnx"))


@pytest.mark.parametrize("location", ["../../secret.bin", "/etc/shadow"])
def test_external_tensor_data_outside_the_skill_is_refused(tmp_path: Path, location: str) -> None:
    (tmp_path / "secret.bin").write_bytes(np.full(4, 7, np.float32).tobytes())
    skill = tmp_path / "skill"
    _model_with_external_data(skill, location)
    with pytest.raises(RuntimeBackendError):
        _runtime(skill, "models/m.onnx").model("m")


def test_a_model_changed_on_disk_after_install_is_refused(tmp_path: Path) -> None:
    skill = tmp_path / "skill"
    _model_with_external_data(skill, "w.bin")
    (skill / "models" / "w.bin").write_bytes(np.ones(4, np.float32).tobytes())
    runtime = _runtime(skill, "models/m.onnx")
    path = skill / "models" / "m.onnx"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # one flipped bit after the manifest was checked at install
    path.write_bytes(bytes(data))
    with pytest.raises(RuntimeBackendError, match="does not match its sha256"):
        runtime.model("m")
