"""The built-in ``imagenet`` skill's control code, with a stand-in for ``ctx.infer``.

Its numpy preprocessing must give the model what the hub's (PIL) preprocessing
gives it; it reports where each call ran; bad images fail the item only.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from skills.manifest import Manifest
from skills.sdk import InferResult

IMAGENET = Path(__file__).resolve().parents[2] / "skills" / "library" / "imagenet"
RNG = np.random.default_rng(3)


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "imagenet_skill_under_test", IMAGENET / "control" / "imagenet_skill.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    saved, sys.dont_write_bytecode = sys.dont_write_bytecode, True  # keep the source clean
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = saved
    return module


class _Context:
    """Answers ``infer`` with logits peaking at class 281, as if split at ``mean``."""

    def __init__(self, skill_dir: Path, config: Mapping[str, str]) -> None:
        self.config = config
        self.skill_dir = skill_dir
        self.logger = logging.getLogger("test.imagenet")
        self.feeds: list[Mapping[str, np.ndarray]] = []

    def infer(self, model: str, feeds: Mapping[str, np.ndarray]) -> InferResult:
        assert model == "classifier"
        self.feeds.append(feeds)
        logits = np.zeros((1, 1000), np.float32)
        logits[0, 281] = 5.0
        return InferResult({"logits": logits}, "split", "mean")

    def model(self, name: str) -> Any:
        raise AssertionError("a split model goes through ctx.infer")

    def emit(self, result: Mapping[str, Any]) -> None:
        raise AssertionError("the skill emits nothing")


def test_the_manifest_declares_the_classifier_split() -> None:
    manifest = Manifest.from_toml((IMAGENET / "skill.toml").read_text(encoding="utf-8"))
    spec = manifest.split_for("classifier")
    assert spec is not None and spec.plan == "models/classifier/split.json"
    assert (IMAGENET / "control" / f"{manifest.entry_module}.py").is_file()


@pytest.mark.parametrize("shape", [(300, 451, 3), (512, 512, 3), (230, 1000, 3), (40, 30, 3)])
def test_numpy_preprocessing_matches_the_hubs_within_one_grey_level(
    shape: tuple[int, int, int],
) -> None:
    from converters.efficientnet import preprocess  # noqa: PLC0415 - the hub's, with PIL

    smooth = np.cumsum(RNG.integers(0, 3, size=shape), axis=1) % 256  # photo-like gradients
    image = smooth.astype(np.uint8)
    ours = _module().preprocess(image)
    assert ours.shape == (1, 3, 224, 224) and ours.dtype == np.float32
    assert np.abs(ours - preprocess(image)).max() * 128 <= 1.0 + 1e-4


def test_a_photo_or_a_preprocessed_input_is_classified_with_its_path(tmp_path: Path) -> None:
    (tmp_path / "control").mkdir()
    names = [f"name {i}" for i in range(1000)]
    (tmp_path / "control" / "imagenet_labels.txt").write_text("\n".join(names), encoding="utf-8")
    ctx = _Context(tmp_path, {"log_results": "true"})
    skill = _module().ImagenetSkill()
    skill.setup(ctx)
    photo = RNG.integers(0, 256, size=(240, 320, 3), dtype=np.uint8)
    ready = RNG.normal(size=(3, 224, 224)).astype(np.float32)
    for image in (photo, ready):
        result = skill.process({"image": image, "scaled": True})
        assert result["label"] == 281 and result["class"] == "name 281"
        assert result["confidence"] == pytest.approx(np.exp(5) / (np.exp(5) + 999))
        assert (result["path"], result["cut"], result["fallback"]) == ("split", "mean", False)
    assert [f["image"].shape for f in ctx.feeds] == [(1, 3, 224, 224)] * 2
    np.testing.assert_array_equal(ctx.feeds[1]["image"][0], ready)


def test_without_the_labels_file_classes_are_numbered(tmp_path: Path) -> None:
    skill = _module().ImagenetSkill()
    skill.setup(_Context(tmp_path, {}))
    result = skill.process({"image": np.zeros((1, 3, 224, 224), np.float32)})
    assert result["class"] == "class 281"


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ({}, "no 'image'"),
        ({"image": np.zeros((10, 10, 2), np.uint8)}, "uint8 photo"),
        ({"image": np.zeros((224, 224, 3), np.float64)}, "float32"),
        ({"image": np.zeros((224, 3, 224), np.float32)}, r"\[1, 3, 224, 224\]"),
        ({"image": np.full((1, 3, 224, 224), np.nan, np.float32)}, "NaN"),
        ({"image": np.zeros((9000, 2, 3), np.uint8)}, "outside"),
    ],
)
def test_bad_images_fail_the_item(tmp_path: Path, item: dict[str, Any], message: str) -> None:
    skill = _module().ImagenetSkill()
    skill.setup(_Context(tmp_path, {}))
    with pytest.raises(ValueError, match=message):
        skill.process(item)


def test_a_bad_log_results_setting_fails_setup(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="log_results"):
        _module().ImagenetSkill().setup(_Context(tmp_path, {"log_results": "yes"}))
