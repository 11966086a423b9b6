from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import tomli_w

from skills.errors import ManifestError
from skills.manifest import (
    MAX_MANIFEST_BYTES,
    DriftSpec,
    JointSpec,
    Manifest,
    ModelVariant,
    Resources,
    SplitSpec,
    TensorSpec,
    parse_version,
)

SHA = "ab" * 32


def full_manifest() -> Manifest:
    return Manifest(
        name="face-detect",
        version="1.2.0-rc.1",
        entrypoint="pkg.detector:FaceDetect",
        description='Finds faces\nin images, with "quotes" and ünïcode',
        inputs=(TensorSpec("image", "float32", (1, 3, -1, -1)),),
        outputs=(TensorSpec("boxes", "float32", (-1, 4)), TensorSpec("onnx::Score_1", "int64", ())),
        resources=Resources(
            memory_mb=512, cpu_seconds=60, startup_timeout_s=5.5, max_open_files=64
        ),
        models=(
            ModelVariant("detector", "onnx-cpu", "models/det.onnx", SHA, 1234, "fp32"),
            ModelVariant("detector", "tflite", "models/tflite/det.tflite", "", 0, "int8"),
            ModelVariant("landmarks", "openvino", "models/lm.xml"),
        ),
        config={"threshold": "0.5", "max_faces": "10"},
        drift=DriftSpec("stats/reference.json", ("brightness", "contrast")),
    )


def base_doc() -> dict[str, Any]:
    return {
        "skill": {"name": "face-detect", "version": "1.0.0", "entrypoint": "detector:FaceDetect"},
        "inputs": [{"name": "image", "dtype": "float32", "shape": [1, 3, 128, 128]}],
        "models": [{"model": "detector", "target": "onnx-cpu", "path": "models/d.onnx"}],
    }


def test_round_trip_keeps_every_field() -> None:
    manifest = full_manifest()
    text = manifest.to_toml()
    again = Manifest.from_toml(text)
    assert again == manifest
    assert again.to_toml() == text
    assert hash(again) == hash(manifest)


def test_minimal_manifest_gets_defaults() -> None:
    text = '[skill]\nname = "a"\nversion = "0.1.0"\nentrypoint = "m:C"\n'
    manifest = Manifest.from_toml(text)
    assert manifest.resources == Resources()
    assert manifest.models == () and manifest.inputs == () and manifest.drift is None
    assert dict(manifest.config) == {}
    assert manifest.entry_module == "m" and manifest.entry_class == "C"


def test_documented_layout_parses() -> None:
    text = tomli_w.dumps(base_doc()) + "\n[resources]\nstartup_timeout_s = 10\n"
    manifest = Manifest.from_toml(text)
    assert manifest.resources.startup_timeout_s == 10.0
    assert isinstance(manifest.resources.startup_timeout_s, float)
    assert manifest.inputs[0].shape == (1, 3, 128, 128)


def test_config_is_read_only() -> None:
    manifest = full_manifest()
    with pytest.raises(TypeError):
        manifest.config["threshold"] = "0.9"  # type: ignore[index]
    source = {"k": "v"}
    manifest = dataclasses.replace(manifest, config=source)
    source["k"] = "changed"
    assert manifest.config["k"] == "v"


def test_variants_and_with_models() -> None:
    manifest = full_manifest()
    assert [v.target for v in manifest.variants("detector")] == ["onnx-cpu", "tflite"]
    assert manifest.variants("missing") == ()
    only = manifest.with_models([manifest.models[2]])
    assert only.models == (manifest.models[2],) and only.name == manifest.name
    with pytest.raises(ManifestError, match="share a path"):
        manifest.with_models(
            [manifest.models[0], dataclasses.replace(manifest.models[0], target="om")]
        )


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = doc
        for part in parents:
            node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
        node[last] = value

    return change


def _drop(path: str) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        table, key = path.split(".")
        del doc[table][key]

    return change


def _drift(**fields: Any) -> Callable[[dict[str, Any]], None]:
    """A ``[drift]`` table: a valid one with ``fields`` changed or added."""
    return _set("drift", {"reference": "drift/reference.json", "inputs": ["ink"], **fields})


def _variant(i: int) -> dict[str, Any]:
    return {"model": f"m{i}", "target": "onnx-cpu", "path": f"models/{i}.onnx"}


INVALID: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "name-uppercase": (_set("skill.name", "Face"), "name"),
    "name-underscore": (_set("skill.name", "face_detect"), "name"),
    "name-too-long": (_set("skill.name", "a" * 64), "name"),
    "name-missing": (_drop("skill.name"), "skill.name: missing"),
    "name-wrong-type": (_set("skill.name", 3), "skill.name: expected str"),
    "version-two-parts": (_set("skill.version", "1.0"), "version"),
    "version-leading-zero": (_set("skill.version", "01.0.0"), "version"),
    "version-build-metadata": (_set("skill.version", "1.0.0+abc"), "version"),
    "version-pre-leading-zero": (_set("skill.version", "1.0.0-rc.01"), "version"),
    "entrypoint-no-class": (_set("skill.entrypoint", "detector"), "entrypoint"),
    "entrypoint-leading-dot": (_set("skill.entrypoint", ".detector:C"), "entrypoint"),
    "entrypoint-dash": (_set("skill.entrypoint", "face-detector:C"), "entrypoint"),
    "entrypoint-empty-part": (_set("skill.entrypoint", "a..b:C"), "entrypoint"),
    "entrypoint-path": (_set("skill.entrypoint", "a/b:C"), "entrypoint"),
    "entrypoint-keyword": (_set("skill.entrypoint", "class:C"), "entrypoint"),
    "entrypoint-empty-class": (_set("skill.entrypoint", "detector:"), "entrypoint"),
    "description-too-long": (_set("skill.description", "x" * 5000), "description"),
    "unknown-skill-key": (_set("skill.author", "me"), "skill: unknown key(s): author"),
    "unknown-table": (_set("extra.key", "v"), "unknown key(s): extra"),
    # The drift reference is declared in [drift] only.
    "skill-reference-retired": (_set("skill.reference", "r.json"), "unknown key(s): reference"),
    "drift-not-a-table": (_set("drift", "drift/r.json"), "drift: expected dict"),
    "drift-no-reference": (_set("drift", {"inputs": []}), "drift.reference: missing"),
    "drift-traversal": (_drift(reference="../ref.json"), "drift: reference"),
    "drift-deep-traversal": (_drift(reference="drift/../../ref.json"), "drift: reference"),
    "drift-dot-part": (_drift(reference="drift/./r.json"), "drift: reference"),
    "drift-empty-part": (_drift(reference="drift//r.json"), "drift: reference"),
    "drift-absolute": (_drift(reference="/etc/r.json"), "drift: reference"),
    "drift-backslash": (_drift(reference="drift\\r.json"), "drift: reference"),
    "drift-control-char": (_drift(reference="drift/\x00r.json"), "drift: reference"),
    "drift-path-too-long": (_drift(reference="d/" * 130 + "r.json"), "drift: reference"),
    "drift-not-json": (_drift(reference="drift/reference.pkl"), "must be a .json"),
    "drift-reference-not-string": (_drift(reference=3), "drift.reference: expected str"),
    "drift-inputs-not-list": (_drift(inputs="ink"), "drift.inputs: expected list"),
    "drift-input-not-string": (_drift(inputs=[1]), "drift: inputs"),
    "drift-input-bad-name": (_drift(inputs=["Ink level"]), "drift: inputs"),
    "drift-input-too-long": (_drift(inputs=["i" * 33]), "drift: inputs"),
    "drift-input-duplicate": (_drift(inputs=["ink", "ink"]), "must be unique"),
    "drift-too-many-inputs": (_drift(inputs=[f"i{k}" for k in range(9)]), "at most 8"),
    "drift-unknown-key": (_drift(window=10), "drift: unknown key(s): window"),
    "model-path-outside-models": (_set("models.0.path", "d.onnx"), "models[0]: path"),
    "model-path-dotdot": (_set("models.0.path", "models/../skill.toml"), "models[0]: path"),
    "model-path-absolute": (_set("models.0.path", "/models/d.onnx"), "models[0]: path"),
    "model-path-backslash": (_set("models.0.path", "models\\d.onnx"), "models[0]: path"),
    "model-path-empty-part": (_set("models.0.path", "models//d.onnx"), "models[0]: path"),
    "model-unknown-target": (_set("models.0.target", "cuda"), "models[0]: target"),
    "model-bad-sha": (_set("models.0.sha256", "ABC"), "models[0]: sha256"),
    "model-negative-size": (_set("models.0.size", -1), "models[0]: size"),
    "model-bool-size": (_set("models.0.size", True), "models[0].size: expected int"),
    "model-bad-precision": (_set("models.0.precision", "fp64"), "models[0]: precision"),
    "model-bad-name": (_set("models.0.model", "Detector"), "models[0]: model"),
    "model-unknown-key": (_set("models.0.url", "http://x"), "models[0]: unknown key(s): url"),
    "model-missing-path": (lambda d: d["models"][0].pop("path"), "models[0].path: missing"),
    "too-many-variants": (_set("models", [_variant(i) for i in range(65)]), "models"),
    "duplicate-variant": (
        _set("models", [_variant(1), {**_variant(1), "path": "models/other.onnx"}]),
        "share model, target and precision",
    ),
    "tensor-bad-dtype": (_set("inputs.0.dtype", "float128"), "inputs[0]: dtype"),
    "tensor-zero-dim": (_set("inputs.0.shape", [1, 0]), "inputs[0]: shape"),
    "tensor-dim-below-minus-one": (_set("inputs.0.shape", [-2]), "inputs[0]: shape"),
    "tensor-rank-too-high": (_set("inputs.0.shape", [1] * 9), "inputs[0]: shape"),
    "tensor-dim-string": (_set("inputs.0.shape", ["n"]), "inputs[0]: shape"),
    "tensor-name-space": (_set("inputs.0.name", "an image"), "inputs[0]: name"),
    "too-many-tensors": (
        _set("outputs", [{"name": f"t{i}", "dtype": "int8", "shape": [1]} for i in range(65)]),
        "outputs",
    ),
    "duplicate-tensor": (
        _set("inputs", [{"name": "a", "dtype": "int8", "shape": [1]}] * 2),
        "inputs: tensor names must be unique",
    ),
    "resources-zero-memory": (_set("resources.memory_mb", 0), "resources: memory_mb"),
    "resources-timeout-string": (_set("resources.startup_timeout_s", "30"), "startup_timeout_s"),
    "resources-negative-timeout": (_set("resources.startup_timeout_s", -1.0), "startup_timeout_s"),
    "resources-unknown-key": (_set("resources.gpu", 1), "resources: unknown key(s): gpu"),
    "config-not-string": (_set("config.threshold", 0.5), "config.threshold"),
    "config-too-many": (_set("config", {f"k{i}": "v" for i in range(65)}), "config"),
    "inputs-not-array": (_set("inputs", "image"), "inputs: expected list"),
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_manifest_is_refused_naming_the_field(case: str) -> None:
    change, fragment = INVALID[case]
    doc = copy.deepcopy(base_doc())
    change(doc)
    with pytest.raises(ManifestError) as err:
        Manifest.from_toml(tomli_w.dumps(doc))
    assert fragment in str(err.value)


def test_text_over_cap_is_refused() -> None:
    text = tomli_w.dumps(base_doc()) + "#" * MAX_MANIFEST_BYTES
    with pytest.raises(ManifestError, match="larger than"):
        Manifest.from_toml(text)


def test_invalid_toml_is_refused() -> None:
    with pytest.raises(ManifestError, match="not valid TOML"):
        Manifest.from_toml('[skill\nname = "a"')


def test_missing_skill_table_is_refused() -> None:
    with pytest.raises(ManifestError, match=r"skill\.toml\.skill: missing"):
        Manifest.from_toml("[resources]\nmemory_mb = 10\n")


def test_direct_construction_validates() -> None:
    with pytest.raises(ManifestError, match="path"):
        ModelVariant("m", "onnx-cpu", "models/../../etc/passwd")
    with pytest.raises(ManifestError, match="memory_mb"):
        Resources(memory_mb=True)
    with pytest.raises(ManifestError, match="name"):
        Manifest(name="", version="1.0.0", entrypoint="m:C")


def test_version_order_follows_semver() -> None:
    ordered = [
        "0.9.9",
        "1.0.0-alpha",
        "1.0.0-alpha.1",
        "1.0.0-alpha.beta",
        "1.0.0-beta.2",
        "1.0.0-beta.11",
        "1.0.0-rc.1",
        "1.0.0",
        "1.0.1",
        "1.10.0",
        "2.0.0",
    ]
    shuffled = ordered[::-1]
    assert sorted(shuffled, key=parse_version) == ordered
    assert parse_version("1.2.3") == (1, 2, 3, "")
    assert parse_version("1.2.3-rc.1") == (1, 2, 3, "rc.1")
    assert parse_version("1.0.0") > parse_version("1.0.0-rc.1")
    assert parse_version("1.0.0-rc.1") <= parse_version("1.0.0")


# -- [[split]] and [[joint]] ------------------------------------------------------------

SPLIT_TOML = """
[[split]]
model = "classifier"
plan = "models/classifier/split.json"
codec = "int8"
deadline_ms = 250

[[joint]]
small = "digits-small"
big = "digits-big"
measure = "margin"
threshold = 0.2
"""


def split_manifest() -> Manifest:
    text = '[skill]\nname = "a"\nversion = "0.1.0"\nentrypoint = "m:C"\n' + SPLIT_TOML
    return Manifest.from_toml(text)


def test_split_and_joint_tables_round_trip() -> None:
    manifest = split_manifest()

    assert manifest.splits == (
        SplitSpec("classifier", "models/classifier/split.json", "int8", 250),
    )
    assert manifest.joints == (JointSpec("digits-small", "digits-big", "margin", 0.2, 1000),)
    assert manifest.split_for("classifier") is manifest.splits[0]
    assert manifest.split_for("digits-small") is None
    assert manifest.joint_for("digits-small") is manifest.joints[0]
    assert manifest.joint_for("classifier") is None
    again = Manifest.from_toml(manifest.to_toml())
    assert again == manifest and again.to_toml() == manifest.to_toml()
    assert hash(again) == hash(manifest)


def test_split_defaults() -> None:
    spec = SplitSpec("net", "models/net/split.json")
    joint = JointSpec("small", "big")
    assert (spec.codec, spec.deadline_ms) == ("fp16", 1000)
    assert (joint.measure, joint.threshold, joint.deadline_ms) == ("entropy", 0.5, 1000)
    assert isinstance(JointSpec("s", "b", threshold=1).threshold, float)


SPLIT_CASES: dict[str, tuple[str, str]] = {
    "split unknown key": ('[[split]]\nmodel = "m"\nplan = "models/m/s.json"\nextra = 1', "extra"),
    "split missing plan": ('[[split]]\nmodel = "m"', "plan"),
    "split bad model": ('[[split]]\nmodel = "Bad Name"\nplan = "models/m/s.json"', "model"),
    "split plan outside models": ('[[split]]\nmodel = "m"\nplan = "m/split.json"', "plan"),
    "split plan escapes": ('[[split]]\nmodel = "m"\nplan = "models/../s.json"', "plan"),
    "split plan not json": ('[[split]]\nmodel = "m"\nplan = "models/m/s.onnx"', "plan"),
    "split bad codec": (
        '[[split]]\nmodel = "m"\nplan = "models/m/s.json"\ncodec = "bf16"',
        "codec",
    ),
    "split zero deadline": (
        '[[split]]\nmodel = "m"\nplan = "models/m/s.json"\ndeadline_ms = 0',
        "deadline_ms",
    ),
    "split deadline as string": (
        '[[split]]\nmodel = "m"\nplan = "models/m/s.json"\ndeadline_ms = "5"',
        "deadline_ms",
    ),
    "split twice": (
        '[[split]]\nmodel = "m"\nplan = "models/m/s.json"\n'
        '[[split]]\nmodel = "m"\nplan = "models/m/t.json"',
        "twice",
    ),
    "joint unknown key": ('[[joint]]\nsmall = "s"\nbig = "b"\nextra = 1', "extra"),
    "joint same models": ('[[joint]]\nsmall = "s"\nbig = "s"', "big"),
    "joint bad measure": ('[[joint]]\nsmall = "s"\nbig = "b"\nmeasure = "vibes"', "measure"),
    "joint negative threshold": (
        '[[joint]]\nsmall = "s"\nbig = "b"\nthreshold = -1.0',
        "threshold",
    ),
    "joint nan threshold": ('[[joint]]\nsmall = "s"\nbig = "b"\nthreshold = nan', "threshold"),
    "joint bool threshold": ('[[joint]]\nsmall = "s"\nbig = "b"\nthreshold = true', "threshold"),
    "joint small twice": (
        '[[joint]]\nsmall = "s"\nbig = "b"\n[[joint]]\nsmall = "s"\nbig = "c"',
        "twice",
    ),
    "split and joint": (
        '[[split]]\nmodel = "s"\nplan = "models/s/p.json"\n[[joint]]\nsmall = "s"\nbig = "b"',
        "both",
    ),
    "split not a list": ('split = "x"', "split"),
}


@pytest.mark.parametrize("case", sorted(SPLIT_CASES))
def test_bad_split_and_joint_tables_are_refused(case: str) -> None:
    body, where = SPLIT_CASES[case]
    text = '[skill]\nname = "a"\nversion = "0.1.0"\nentrypoint = "m:C"\n' + body + "\n"
    with pytest.raises(ManifestError, match=where):
        Manifest.from_toml(text)


def test_too_many_splits_are_refused() -> None:
    specs = tuple(SplitSpec(f"m{i}", f"models/m{i}/split.json") for i in range(17))
    with pytest.raises(ManifestError, match="split"):
        Manifest(name="a", version="0.1.0", entrypoint="m:C", splits=specs)
    with pytest.raises(ManifestError, match="JointSpec"):
        Manifest(name="a", version="0.1.0", entrypoint="m:C", joints=("x",))  # type: ignore[arg-type]


def test_a_text_is_parsed_once_and_a_bad_one_refused_every_time() -> None:
    text = full_manifest().to_toml()
    first = Manifest.from_toml(text)
    # Shared: a manifest is immutable all the way down, so a second parse hands it back.
    assert Manifest.from_toml(text) is first
    assert first == full_manifest()
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.name = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        first.config["threshold"] = "0.9"  # type: ignore[index]
    bad = text.replace('version = "1.2.0-rc.1"', 'version = ""')
    for _ in range(2):  # a failure is never kept in place of a parse
        with pytest.raises(ManifestError, match="version"):
            Manifest.from_toml(bad)
