"""The wheel locks are current: made from today's pins, with a wheel or a reason for each.

No network: regenerating the locks needs the package index (scripts/lock_wheels.py);
this compares the pins in pyproject.toml and the recipes with what each lock was made from.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

from edgeskill.firmware_recipes import (
    FIRMWARE_DIR,
    TARGETS,
    RecipeError,
    load_recipe,
    lock_problems,
    manylinux_tags,
    parse_lock,
    pins_for,
)


def lock_of(target: str):  # type: ignore[no-untyped-def]
    return parse_lock((FIRMWARE_DIR / "locks" / f"{target}.lock").read_text(), target)


@pytest.mark.parametrize("target", TARGETS)
def test_lock_is_current(target: str) -> None:
    recipe = load_recipe(target)
    problems = lock_problems(recipe, lock_of(target), pins_for(recipe))
    assert problems == [], "\n".join(problems)


@pytest.mark.parametrize("target", TARGETS)
def test_every_locked_wheel_is_for_the_targets_architecture(target: str) -> None:
    recipe = load_recipe(target)
    lock = lock_of(target)
    assert len(lock.wheels) > 20
    for wheel in lock.wheels:
        assert re.fullmatch(r"[0-9a-f]{64}", wheel.sha256), wheel
        assert wheel.filename.endswith(".whl")
        platform_tag = wheel.filename[:-4].split("-")[-1]
        assert platform_tag == "any" or recipe.arch in platform_tag, wheel.filename


def test_the_runtimes_each_target_needs_are_locked_or_said_missing() -> None:
    names = {t: {w.name: w.version for w in lock_of(t).wheels} for t in TARGETS}
    assert names["arm64-cpu"]["ai-edge-litert"] == "2.3.0"
    assert names["arm64-cpu"]["onnxruntime"] == "1.32.0"
    assert names["x86-gateway"]["openvino"] == "2026.4.1"
    assert names["ascend310"]["onnxruntime-cann"] == "1.24.4"
    assert "onnxruntime" not in names["ascend310"]  # instead of it, never both
    assert names["jetson"]["onnxruntime-gpu"] == "1.31.1"
    assert "onnxruntime" not in names["jetson"]
    # TensorRT is an sdist on the index (its wheels come with JetPack): said so, clearly.
    missing = lock_of("jetson").missing
    assert "tensorrt==11.4.0.106" in missing
    assert "no wheel on the package index for linux aarch64" in missing["tensorrt==11.4.0.106"]


def test_a_changed_pin_makes_the_lock_stale() -> None:
    recipe = load_recipe("arm64-cpu")
    pins = pins_for(recipe)
    pins["numpy"] = "9.9.9"
    problems = lock_problems(recipe, lock_of("arm64-cpu"), pins)
    assert any("pins changed" in p for p in problems)
    assert any("numpy==9.9.9 has no wheel" in p for p in problems)
    moved = dataclasses.replace(recipe, pins=("onnxruntime-cann==1.99.0",))
    assert "onnxruntime-cann" in pins_for(moved)


def test_recipes_refuse_bad_targets_and_pins(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(RecipeError, match="unknown target"):
        load_recipe("toaster")
    bad = tmp_path / "arm64-cpu"
    bad.mkdir()
    text = (FIRMWARE_DIR / "arm64-cpu" / "recipe.toml").read_text()
    (bad / "recipe.toml").write_text(text.replace("pins = []", 'pins = ["tensorrt>=10"]'))
    with pytest.raises(RecipeError, match="exact name==version"):
        load_recipe("arm64-cpu", tmp_path)


def test_manylinux_tags_go_down_to_2014() -> None:
    tags = manylinux_tags("aarch64", "2.36")
    assert tags[0] == "manylinux_2_36_aarch64" and tags[-2] == "manylinux_2_17_aarch64"
    assert tags[-1] == "manylinux2014_aarch64"
