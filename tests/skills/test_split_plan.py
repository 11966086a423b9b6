"""``split.json``: parsed and checked like any input from outside, and written back unchanged."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from skills.errors import BundleError
from skills.split_plan import HUB_ONLY, MAX_PLAN_BYTES, MAX_SEGMENTS, SplitPlan, SplitPlanError


def plan_doc() -> dict[str, Any]:
    """A chain of three segments: x -> a -> b -> y, with a skip of ``a`` into the last."""
    return {
        "model": "net",
        "input_names": ["x"],
        "output_names": ["y"],
        "input_bytes": 64,
        "output_bytes": 40,
        "segments": [
            {"file": "seg-00.onnx", "inputs": ["x"], "outputs": ["a"]},
            {"file": "seg-01.onnx", "inputs": ["a"], "outputs": ["b"]},
            {"file": "seg-02.onnx", "inputs": ["a", "b"], "outputs": ["y"]},
        ],
        "cuts": [
            {"name": "input", "after": -1, "tensors": ["x"], "nbytes": 64},
            {"name": "a", "after": 0, "tensors": ["a"], "nbytes": 32},
            {"name": "a+b", "after": 1, "tensors": ["a", "b"], "nbytes": 48},
        ],
        "hub_ms": [1.0, 2.0, 0.5],
        "device_ms": [1.0, 2.0, 0.5],
    }


def test_round_trip_and_cut_lookup() -> None:
    plan = SplitPlan.from_json(json.dumps(plan_doc()))

    assert SplitPlan.from_json(plan.to_json()) == plan
    assert [c.name for c in plan.cuts] == [HUB_ONLY, "a", "a+b"]
    assert [c.after for c in plan.middle_cuts] == [0, 1]
    assert plan.cut("a+b").tensors == ("a", "b")
    assert plan.cut("input").nbytes == 64
    with pytest.raises(SplitPlanError, match="no cut"):
        plan.cut("nope")
    assert isinstance(SplitPlanError("x"), BundleError)


def test_a_cut_may_carry_its_chosen_codec_and_measured_losses() -> None:
    doc = plan_doc()
    doc["cuts"][1] |= {"codec": "int8", "loss_pt": {"fp16": 0.0, "int8": 0.25}}

    plan = SplitPlan.from_json(json.dumps(doc))

    assert plan.cut("a").codec == "int8"
    assert dict(plan.cut("a").loss_pt) == {"fp16": 0.0, "int8": 0.25}
    assert plan.cut("a+b").codec is None and plan.cut("a+b").loss_pt == ()
    assert SplitPlan.from_json(plan.to_json()) == plan
    assert "codec" not in json.loads(plan.to_json())["cuts"][2]


def test_the_hub_only_cut_is_implicit() -> None:
    doc = plan_doc()
    doc["cuts"] = doc["cuts"][1:]

    plan = SplitPlan.from_json(json.dumps(doc))

    assert plan.cuts[0].name == HUB_ONLY and plan.cuts[0].after == -1
    assert plan.cuts[0].tensors == ("x",) and plan.cuts[0].nbytes == 64
    assert plan == SplitPlan.from_json(json.dumps(plan_doc()))


def test_load_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "split.json"
    path.write_text(json.dumps(plan_doc()))
    assert SplitPlan.load(path).model == "net"
    path.write_bytes(b"\xff\xfe{}")
    with pytest.raises(SplitPlanError, match="UTF-8"):
        SplitPlan.load(path)
    with pytest.raises(SplitPlanError, match="cannot be read"):
        SplitPlan.load(tmp_path / "missing.json")


def _set(path: str, value: object) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target: Any = doc
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        target[int(last) if last.isdigit() else last] = value

    return change


HOSTILE: dict[str, Callable[[dict[str, Any]], None]] = {
    "unknown key": _set("extra", 1),
    "missing key": lambda d: d.pop("hub_ms"),
    "model not a string": _set("model", 7),
    "model too long": _set("model", "m" * 257),
    "control character": _set("model", "a\nb"),
    "no inputs": _set("input_names", []),
    "repeated outputs": _set("output_names", ["y", "y"]),
    "negative bytes": _set("input_bytes", -1),
    "bool bytes": _set("output_bytes", True),
    "huge bytes": _set("output_bytes", 1 << 50),
    "no segments": _set("segments", []),
    "too many segments": _set(
        "segments", [{"file": "s.onnx", "inputs": ["x"], "outputs": ["y"]}] * (MAX_SEGMENTS + 1)
    ),
    "absolute file": _set("segments.0.file", "/etc/passwd.onnx"),
    "file escapes": _set("segments.0.file", "../../x.onnx"),
    "not onnx": _set("segments.0.file", "seg.py"),
    "backslash": _set("segments.0.file", "a\\b.onnx"),
    "shared file": _set("segments.1.file", "seg-00.onnx"),
    "segment extra key": _set("segments.0.extra", 1),
    "reads unknown tensor": _set("segments.1.inputs", ["zz"]),
    "output never made": _set("output_names", ["zz"]),
    "cut out of order": _set("cuts.1.after", 1),
    "cut missing": lambda d: d["cuts"].pop(),
    "cut after past the end": _set("cuts.2.after", 300),
    "cut sends unmade tensor": _set("cuts.1.tensors", ["b"]),
    "cut drops the skip": _set("cuts.2.tensors", ["b"]),
    "input cut renamed": _set("cuts.0.name", "start"),
    "input cut wrong tensors": _set("cuts.0.tensors", ["a"]),
    "middle cut called input": _set("cuts.1.name", "input"),
    "middle cut called ping": _set("cuts.1.name", "ping"),
    "repeated cut names": _set("cuts.2.name", "a"),
    "times short": _set("hub_ms", [1.0]),
    "time negative": _set("device_ms", [1.0, -2.0, 0.5]),
    "time nan": _set("hub_ms", [1.0, float("nan"), 0.5]),
    "time string": _set("hub_ms", [1.0, "2", 0.5]),
    "top not an object": lambda d: d.clear(),
    "cut not an object": _set("cuts.1", ["a"]),
    "unknown codec": _set("cuts.1.codec", "bf16"),
    "codec not a string": _set("cuts.1.codec", 8),
    "losses not an object": _set("cuts.1.loss_pt", [0.0]),
    "no losses": _set("cuts.1.loss_pt", {}),
    "loss of an unknown codec": _set("cuts.1.loss_pt", {"int4": 1.0}),
    "loss over 100": _set("cuts.1.loss_pt", {"int8": 101.0}),
    "negative loss": _set("cuts.1.loss_pt", {"int8": -1.0}),
    "loss not a number": _set("cuts.1.loss_pt", {"int8": "0"}),
    "loss nan": _set("cuts.1.loss_pt", {"int8": float("nan")}),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_bad_plans_are_refused(case: str) -> None:
    doc = copy.deepcopy(plan_doc())
    HOSTILE[case](doc)
    text = json.dumps(doc) if doc else "[]"
    with pytest.raises(SplitPlanError):
        SplitPlan.from_json(text)


@pytest.mark.parametrize(
    "text",
    ["", "{", "null", "[" * 100_000, "x" * (MAX_PLAN_BYTES + 1), '{"model": NaN}'],
    ids=["empty", "truncated", "null", "deep", "too big", "nan"],
)
def test_text_that_is_not_a_plan_is_refused(text: str) -> None:
    with pytest.raises(SplitPlanError):
        SplitPlan.from_json(text)
