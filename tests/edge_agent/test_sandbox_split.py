"""Split inference through a real control process: plans down, tails up, fallbacks, refusals."""

from __future__ import annotations

import asyncio
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_agent.sandbox import SkillProcess
from edge_agent.sandbox.protocol import MAX_TAILS_PER_ITEM, parse_infers
from edge_agent.split.link import LinkConfig, LinkEstimator
from edge_agent.split.planner import LinkEstimate
from edge_agent.split.runtime import SplitRuntime
from skills.manifest import JointSpec, Manifest, SplitSpec
from tests.fakes.split_hub import LocalTailHub, reference, write_split_model

X = np.random.default_rng(8).normal(size=(1, 16)).astype(np.float32)

CONTROL = """
import numpy as np
from skills.sdk import Skill


class SplitProbe(Skill):
    def setup(self, ctx):
        self.ctx = ctx
        self.warm = ctx.infer("chain", {"x": np.zeros((1, 16), np.float32)}).path

    def process(self, item):
        op = item.get("op", "infer")
        if op == "infer":
            r = self.ctx.infer(item.get("model", "chain"), {"x": item["x"]})
            return {"outputs": dict(r.outputs), "path": r.path, "cut": r.cut,
                    "fallback": r.fallback, "warm": self.warm}
        if op == "steal":  # hostile: the private channel, asking for what is not its own
            answer = self.ctx._ask(item["model"], item["split"], {item["tensor"]: item["x"]})
            return {"ok": answer.outputs is not None, "error": answer.error}
        if op == "flood":
            errors = [self.ctx._ask("chain", "input", {"x": item["x"]}).error for _ in range(20)]
            return {"errors": errors}
        raise KeyError(op)
"""


def split_skill(
    tmp_path: Path, deadline_ms: int = 1000, config: dict[str, str] | None = None
) -> SkillProcess:
    skill_dir = tmp_path / "splitprobe"
    (skill_dir / "control").mkdir(parents=True)
    (skill_dir / "control" / "split_probe.py").write_text(textwrap.dedent(CONTROL))
    write_split_model(skill_dir, hub_ms=(100.0, 0.05, 0.05))
    manifest = Manifest(
        name="splitprobe",
        version="0.1.0",
        entrypoint="split_probe:SplitProbe",
        splits=(SplitSpec("chain", "models/chain/split.json", "fp16", deadline_ms),),
        joints=(JointSpec("small", "big", "margin", 0.5, deadline_ms),),
    )
    (skill_dir / "skill.toml").write_text(manifest.to_toml())
    return SkillProcess(
        skill_dir,
        manifest,
        ["onnx-cpu"],
        config={"split.profile_repeats": "2", **(config or {})},
        log_path=tmp_path / "split.log",
    )


def with_hub(
    tmp_path: Path,
    hub: LocalTailHub,
    body: Callable[[SkillProcess, SplitRuntime], Any],
    *,
    deadline_ms: int = 1000,
    config: dict[str, str] | None = None,
) -> Any:
    """Start the skill, attach a split runtime (fast link to ``hub``), run ``body`` in a thread."""
    proc = split_skill(tmp_path, deadline_ms, config)
    hub.plan_path = proc.skill_dir / "models" / "chain" / "split.json"

    async def main() -> Any:
        link = LinkEstimator(LinkConfig(prior=LinkEstimate(0.05, 1.25e9)))
        runtime = SplitRuntime(lambda: hub, link=link)
        await asyncio.to_thread(proc.start)
        try:
            broker = runtime.attach("splitprobe", "0.1.0", proc)
            assert broker is not None
            # A device as slow as the hub's first segment: the planner cuts after it.
            broker.splits["chain"].set_profile([0.1, 50.0, 50.0])
            return await asyncio.to_thread(body, proc, runtime)
        finally:
            await asyncio.to_thread(proc.stop)

    return asyncio.run(main())


def test_profile_is_reported_at_setup_and_the_planned_cut_runs_split(tmp_path: Path) -> None:
    hub = LocalTailHub()

    def body(proc: SkillProcess, runtime: SplitRuntime) -> Any:
        result, _ = proc.process({"x": X})
        return proc.profiles, result, proc.drain_infers()

    profiles, result, infers = with_hub(tmp_path, hub, body)
    assert len(profiles["chain"]) == 3 and all(t > 0 for t in profiles["chain"])
    assert (result["path"], result["cut"], result["fallback"]) == ("split", "h0", False)
    assert result["warm"] == "device"  # setup has no item: nothing goes to the hub
    np.testing.assert_allclose(result["outputs"]["logits"], reference(X), rtol=1e-2)  # fp16 cut
    (sent,) = hub.requests
    assert sent.split == "h0" and sent.inputs[0].dtype == "float16"
    assert [[(r.model, r.path, r.cut, r.fallback) for r in item] for item in infers] == [
        [("chain", "split", "h0", False)]
    ]
    assert infers[0][0].device_ms > 0  # the head's time, measured in the control process


@pytest.mark.parametrize(
    ("reported", "kept"),
    [(4.5, 4.5), (3, 3.0), (-1.0, 0.0), (float("nan"), 0.0), ("9", 0.0), (True, 0.0), (1e12, 0.0)],
)
def test_a_reported_device_time_is_kept_only_when_believable(reported: object, kept: float) -> None:
    entry = {"model": "chain", "path": "split", "cut": "h0", "fallback": False}
    (record,) = parse_infers([{**entry, "device_ms": reported}])
    assert record.device_ms == kept


@pytest.mark.parametrize("mode", ["drop", "hang"])
def test_hub_gone_mid_request_one_result_marked_fallback_then_device_only(
    tmp_path: Path, mode: str
) -> None:
    hub = LocalTailHub(mode=mode, delay_s=0.2)

    def body(proc: SkillProcess, runtime: SplitRuntime) -> Any:
        started = time.monotonic()
        first, _ = proc.process({"x": X})
        took = time.monotonic() - started
        second, _ = proc.process({"x": X})
        return first, second, took, proc.drain_infers()

    first, second, took, infers = with_hub(tmp_path, hub, body, deadline_ms=400)
    assert (first["path"], first["fallback"]) == ("device", True)
    np.testing.assert_allclose(first["outputs"]["logits"], reference(X), rtol=1e-5)
    assert took < 2.0  # bounded by the deadline, not by the hub
    assert (second["path"], second["fallback"]) == ("device", False)  # backing off
    assert len(hub.requests) == 1
    assert [len(item) for item in infers] == [1, 1]  # exactly one result per call


def test_a_slowdown_is_emulated_and_reported(tmp_path: Path) -> None:
    hub = LocalTailHub()

    def body(proc: SkillProcess, runtime: SplitRuntime) -> Any:
        return proc.slowdown, proc.profiles["chain"]

    slowdown, profile = with_hub(tmp_path, hub, body, config={"split.device_slowdown": "4"})
    assert slowdown == 4.0 and len(profile) == 3


@pytest.mark.parametrize(
    ("model", "split", "tensor", "reason"),
    [
        ("classifier", "input", "x", "no split or joint model"),  # another skill's model
        ("chain", "h9", "x", "has no cut"),
        ("chain", "input", "secret", "do not match the cut"),
    ],
)
def test_a_hostile_control_process_is_refused(
    tmp_path: Path, model: str, split: str, tensor: str, reason: str
) -> None:
    hub = LocalTailHub()

    def body(proc: SkillProcess, runtime: SplitRuntime) -> Any:
        item = {"op": "steal", "model": model, "split": split, "tensor": tensor, "x": X}
        result, _ = proc.process(item)
        return result, proc.alive, proc.refused_tails, runtime.metrics("splitprobe", "0.1.0")

    result, alive, refused, metrics = with_hub(tmp_path, hub, body)
    assert not result["ok"] and result["error"].startswith("refused") and reason in result["error"]
    assert alive and refused == 0  # refused by the broker, which counts it
    assert metrics["split.tails_refused_locally_total"] == 1
    assert hub.requests == []


def test_tail_requests_per_item_are_capped(tmp_path: Path) -> None:
    hub = LocalTailHub()

    def body(proc: SkillProcess, runtime: SplitRuntime) -> Any:
        result, _ = proc.process({"op": "flood", "x": X})
        return result["errors"], proc.refused_tails

    errors, refused = with_hub(tmp_path, hub, body)
    assert errors[:MAX_TAILS_PER_ITEM] == [""] * MAX_TAILS_PER_ITEM
    assert all("tails per item" in e for e in errors[MAX_TAILS_PER_ITEM:])
    assert refused == 20 - MAX_TAILS_PER_ITEM
    assert len(hub.requests) == MAX_TAILS_PER_ITEM


def test_without_a_broker_tails_are_refused_and_everything_runs_on_the_device(
    tmp_path: Path,
) -> None:
    with split_skill(tmp_path) as proc:
        result, _ = proc.process({"x": X})
        stolen, _ = proc.process(
            {"op": "steal", "model": "chain", "split": "input", "tensor": "x", "x": X}
        )
    assert (result["path"], result["fallback"]) == ("device", False)
    np.testing.assert_allclose(result["outputs"]["logits"], reference(X), rtol=1e-5)
    assert "no split inference" in stolen["error"] and proc.refused_tails == 1
