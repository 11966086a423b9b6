"""The Skill SDK, and the built-in digits skill's control code run in-process against it."""

from __future__ import annotations

import importlib.util
import logging
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from skills.manifest import Manifest
from skills.sdk import INFER_PATHS, InferResult, Model, Skill, SkillContext

DIGITS = Path(__file__).resolve().parents[2] / "skills" / "library" / "digits"
WEIGHTS = np.random.default_rng(11).normal(size=(64, 10)).astype(np.float32)


class LinearModel:
    """A numpy stand-in honouring the model contract: image [N,1,8,8] -> logits [N,10]."""

    name = "classifier"
    target = "onnx-cpu"
    backend = "numpy"
    input_names: tuple[str, ...] = ("image",)
    output_names: tuple[str, ...] = ("logits",)

    def __init__(self) -> None:
        self.feeds: list[np.ndarray] = []

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        image = feeds["image"]
        self.feeds.append(image)
        return {"logits": image.reshape(len(image), 64) @ WEIGHTS}


class Context:
    def __init__(self, config: Mapping[str, str], model: Model) -> None:
        self.config = config
        self.skill_dir = DIGITS
        self.logger = logging.getLogger("test.digits")
        self.events: list[Mapping[str, Any]] = []
        self._model = model
        self.asked: list[str] = []

    def model(self, name: str) -> Model:
        self.asked.append(name)
        return self._model

    def emit(self, result: Mapping[str, Any]) -> None:
        self.events.append(result)

    def infer(self, model: str, feeds: Mapping[str, np.ndarray]) -> InferResult:
        return InferResult(self.model(model).run(feeds), "device")


def load_digits_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "digits_skill_under_test", DIGITS / "control" / "digits_skill.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    saved, sys.dont_write_bytecode = sys.dont_write_bytecode, True  # keep the source folder clean
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = saved
    return module


def started_digits(config: Mapping[str, str]) -> tuple[Skill, Context, LinearModel]:
    model = LinearModel()
    ctx = Context(config, model)
    skill = load_digits_module().DigitsSkill()
    skill.setup(ctx)
    return skill, ctx, model


def expected(pixels01: np.ndarray) -> tuple[int, float]:
    logits = pixels01.reshape(64).astype(np.float64) @ WEIGHTS.astype(np.float64)
    probabilities = np.exp(logits - logits.max())
    probabilities /= probabilities.sum()
    return int(probabilities.argmax()), float(probabilities.max())


def test_skill_needs_setup_and_process_and_has_a_noop_teardown() -> None:
    class Incomplete(Skill):
        def setup(self, ctx: SkillContext) -> None:
            pass

    with pytest.raises(TypeError, match="process"):
        Incomplete()  # type: ignore[abstract]

    class Echo(Skill):
        def setup(self, ctx: SkillContext) -> None:
            self.prefix = ctx.config["prefix"]

        def process(self, item: Mapping[str, Any]) -> Mapping[str, Any]:
            return {"text": self.prefix + item["text"]}

    echo = Echo()
    echo.setup(Context({"prefix": ">"}, LinearModel()))
    assert echo.process({"text": "hi"}) == {"text": ">hi"}
    echo.teardown()  # the default hook exists and does nothing


def test_digits_scales_raw_and_prescaled_images_to_the_model_contract() -> None:
    skill, ctx, model = started_digits({})
    raw = np.random.default_rng(5).integers(0, 17, size=(8, 8))
    label, confidence = expected(raw / 16.0)
    for image, scaled in (
        (raw, False),
        (raw.ravel().tolist(), False),
        (raw.tolist(), False),
        ((raw / 16.0).ravel(), True),
    ):
        item = {"image": image, "scaled": True} if scaled else {"image": image}
        result = skill.process(item)
        assert result == {
            "label": label,
            "confidence": pytest.approx(confidence, rel=1e-5),
            "summaries": {"brightness": pytest.approx(raw.mean() / 16.0, rel=1e-5)},
        }
        assert isinstance(result["label"], int) and isinstance(result["confidence"], float)
    assert ctx.asked == ["classifier"]
    for feed in model.feeds:
        assert feed.dtype == np.float32 and feed.shape == (1, 1, 8, 8)
        assert feed.min() >= 0.0 and feed.max() <= 1.0
    assert ctx.events == []


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ({}, "no 'image'"),
        ({"image": [1, 2, 3]}, "expected 64"),
        ({"image": np.full(64, 17.0)}, r"\[0, 16\]"),
        ({"image": np.full(64, 2.0), "scaled": True}, r"\[0, 1\]"),
        ({"image": [float("nan")] * 64}, "NaN"),
        ({"image": ["a"] * 64}, "not numeric"),
    ],
)
def test_digits_rejects_malformed_images(item: dict[str, Any], message: str) -> None:
    skill, _, model = started_digits({})
    with pytest.raises(ValueError, match=message):
        skill.process(item)
    assert model.feeds == []


def test_digits_emits_an_event_below_min_confidence() -> None:
    skill, ctx, _ = started_digits({"min_confidence": "1.0"})
    result = skill.process({"image": np.zeros(64)})
    assert ctx.events == [
        {
            "kind": "low_confidence",
            "label": result["label"],
            "confidence": result["confidence"],
            "min_confidence": 1.0,
        }
    ]
    quiet, quiet_ctx, _ = started_digits({"min_confidence": "0"})
    quiet.process({"image": np.zeros(64)})
    assert quiet_ctx.events == []


@pytest.mark.parametrize("value", ["1.5", "-0.1", "nan", "high"])
def test_digits_setup_rejects_a_bad_min_confidence(value: str) -> None:
    with pytest.raises(ValueError):
        started_digits({"min_confidence": value})


def test_digits_manifest_parses_and_names_its_entrypoint() -> None:
    manifest = Manifest.from_toml((DIGITS / "skill.toml").read_text(encoding="utf-8"))
    assert (manifest.name, manifest.version) == ("digits", "1.0.0")
    assert manifest.entrypoint == "digits_skill:DigitsSkill"
    assert (DIGITS / "control" / f"{manifest.entry_module}.py").is_file()
    assert [(t.name, t.dtype, t.shape) for t in manifest.inputs] == [
        ("image", "float32", (-1, 1, 8, 8))
    ]
    assert {t.name for t in manifest.outputs} == {"label", "confidence"}


def test_sdk_imports_only_numpy() -> None:
    code = (
        "import sys, skills.sdk\n"
        "ours = {'edge_agent', 'cloud', 'converters', 'onnxruntime', 'torch'} & set(sys.modules)\n"
        "print(sorted(ours))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"


def test_infer_result_names_its_path() -> None:
    logits = {"logits": np.zeros((1, 10), np.float32)}
    assert INFER_PATHS == ("device", "split", "hub", "joint-device", "joint-hub")
    result = InferResult(logits, "split", cut="h0")
    assert (result.path, result.cut, result.fallback, result.confidence) == (
        "split",
        "h0",
        False,
        None,
    )
    fallen = InferResult(logits, "device", fallback=True)
    assert fallen.fallback and fallen.cut is None
    with pytest.raises(ValueError, match="unknown inference path"):
        InferResult(logits, "cloud")


def test_a_context_with_infer_is_a_skill_context() -> None:
    ctx: SkillContext = Context({}, LinearModel())
    result = ctx.infer("classifier", {"image": np.zeros((1, 1, 8, 8), np.float32)})
    assert result.path == "device" and result.outputs["logits"].shape == (1, 10)
