"""Every library skill builds into a bundle from its installed packages; every model runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cloud.models.errors import FactoryError
from cloud.models.library import (
    LIBRARY,
    build_library_skill,
    build_skill_source,
    library_skills,
    reference_from_results,
)
from edgeskill.cli import app
from edgeskill.skill_runner import reference_runner
from skills.bundle import install_bundle, verify_tree
from skills.drift_spec import read_reference
from skills.errors import BundleError
from skills.model_check import check_bundle
from skills.split_plan import SplitPlan

#: Every library skill's drift reference: its input summaries and the classes its
#: reference inputs give (scikit-image's 16 photos; espeak-ng's lines in 0.5 s chunks;
#: 48 sentences).
REFERENCES = {
    "face-detect": (("brightness",), {"face", "none"}),
    "ocr": (("brightness",), {"text", "none"}),
    "voice-activity": (("level_db",), {"speech", "silence"}),
    "keyword-spot": (("level_db",), {"wake", "none"}),
    "text-embed": (
        ("tokens",),
        {"weather", "health", "technology", "money", "sport", "food", "travel", "home"},
    ),
}

EXPECTED = ["face-detect", "keyword-spot", "ocr", "text-embed", "voice-activity"]


def test_the_library_declares_its_models_in_sources() -> None:
    assert library_skills() == EXPECTED
    for name in EXPECTED:
        assert not (LIBRARY / name / "models").exists()  # never committed


@pytest.mark.slow
@pytest.mark.parametrize("name", EXPECTED)
def test_each_skill_builds_installs_and_verifies(tmp_path: Path, name: str) -> None:
    bundle = build_library_skill(
        LIBRARY / name, tmp_path / "dist", version="1.0.1", runner=reference_runner
    )
    assert bundle.name == f"{name}-1.0.1.skill"
    installed = install_bundle(bundle, tmp_path / "installed")
    assert installed.models and all(v.sha256 and v.size for v in installed.models)
    assert verify_tree(tmp_path / "installed").name == name
    assert (tmp_path / "installed" / "sources.toml").is_file()  # provenance ships along
    check_bundle(bundle)  # as the hub checks it on publishing: on sources.toml's sample shapes
    inputs, classes = REFERENCES[name]
    assert installed.drift is not None and installed.drift.inputs == inputs
    reference = read_reference(tmp_path / "installed", installed.drift)
    assert set(reference.class_weights()) == classes  # every class seen, no other
    if name in ("face-detect", "ocr"):
        # 16 photos: the astronaut's, the cameraman's (and, weakly, the cat's) face; the
        # page and text photos' lines
        assert sum(w for _, w in reference.classes) == 16
    if name == "keyword-spot":  # the wake word is said in three of the ten lines
        assert reference.class_weights()["wake"] == 3
    if name == "text-embed":
        assert sum(w for _, w in reference.classes) == 48  # one result a sentence


def test_a_declared_reference_needs_a_runner(tmp_path: Path) -> None:
    with pytest.raises(FactoryError, match="needs a runner"):
        build_library_skill(LIBRARY / "face-detect", tmp_path / "dist")
    with pytest.raises(BundleError, match="needs a runner"):  # as `skill build` reports it
        build_skill_source(LIBRARY / "face-detect", tmp_path / "dist")


def test_the_reference_is_the_answers_class_mix_confidence_and_summaries() -> None:
    answers = [
        {"label": "face", "confidence": 0.9, "summaries": {"brightness": 0.4}},
        {"label": "none", "confidence": 0.7, "summaries": {"brightness": 0.6}},
        {"label": "none", "confidence": 0.8, "summaries": {"brightness": 0.5}},
    ]
    reference = reference_from_results(answers, ["brightness"])
    assert reference.class_weights() == {"face": 1.0, "none": 2.0}
    assert reference.input("brightness").points == (0.4, 0.5, 0.6)
    with pytest.raises(FactoryError, match="summaries"):
        reference_from_results([{"label": "x", "confidence": 1.0}], ["brightness"])


def test_a_plain_folder_builds_as_skill_build_always_did(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match=r"skill\.toml"):
        build_skill_source(tmp_path, tmp_path / "dist")


@pytest.mark.slow
def test_skill_build_builds_a_library_folder_with_its_models_and_reference(
    tmp_path: Path,
) -> None:
    """``edgeskill skill build skills/library/NAME``, as the README says."""
    out = tmp_path / "dist"
    args = ["skill", "build", str(LIBRARY / "face-detect"), "--out", str(out)]
    built = CliRunner().invoke(app, args)
    assert built.exit_code == 0, built.output
    bundle = out / "face-detect-1.0.0.skill"
    assert f"built {bundle}" in " ".join(built.output.split())
    installed = install_bundle(bundle, tmp_path / "installed")
    paths = [v.path for v in installed.models]
    assert paths == ["models/detector.tflite", "models/detector.onnx"]  # copied and converted
    assert installed.drift is not None  # the reference came from running the skill
    assert sum(w for _, w in read_reference(tmp_path / "installed", installed.drift).classes) == 16
    assert not (LIBRARY / "face-detect" / "models").exists()  # the source folder is untouched


@pytest.mark.slow
def test_skill_build_exports_and_cuts_the_imagenet_folder(tmp_path: Path) -> None:
    out = tmp_path / "dist"
    args = ["skill", "build", str(LIBRARY / "imagenet"), "--out", str(out)]
    built = CliRunner().invoke(app, args)
    assert built.exit_code == 0, built.output
    installed = install_bundle(out / "imagenet-1.0.0.skill", tmp_path / "installed")
    plan = SplitPlan.load(tmp_path / "installed" / installed.splits[0].plan)
    assert plan.model == "classifier" and len(plan.segments) >= 2  # cut, which the folder is not
    # codec auto: each cut in the smallest codec its measured top-1 cost allowed
    assert installed.splits[0].codec == "auto"
    for cut in plan.cuts:
        losses = dict(cut.loss_pt)
        assert set(losses) == {"fp16", "int8"} and cut.codec in ("int8", "fp16", "fp32")
        assert cut.codec == ("int8" if losses["int8"] <= 0.5 else "fp16")
    assert plan.cuts[0].codec == "int8"  # the photo crosses as bytes, not as half floats
    for segment in plan.segments:
        assert (tmp_path / "installed" / "models" / "classifier" / segment.file).is_file()
    labels = (tmp_path / "installed" / "control" / "imagenet_labels.txt").read_text().splitlines()
    assert len(labels) == 1000
    assert not (LIBRARY / "imagenet" / "models").exists()
    # its drift reference: the skill's answers on scikit-image's 16 photos, run on the device
    assert installed.drift is not None and installed.drift.inputs == ("brightness",)
    reference = read_reference(tmp_path / "installed", installed.drift)
    weights = reference.class_weights()
    assert sum(weights.values()) == 16
    assert weights[str(labels.index("tiger cat"))] >= 1  # chelsea, the cat
    assert weights[str(labels.index("espresso"))] >= 1  # coffee


def test_skill_build_refuses_the_digits_folder_which_has_no_model(tmp_path: Path) -> None:
    out = tmp_path / "dist"
    built = CliRunner().invoke(app, ["skill", "build", str(LIBRARY / "digits"), "--out", str(out)])
    assert built.exit_code == 2, built.output
    message = " ".join(built.output.split())
    assert message.startswith("error: the library's digits skill ships no model")
    assert "edgeskill skill new my-digits --from digits" in message
    assert not out.exists()
