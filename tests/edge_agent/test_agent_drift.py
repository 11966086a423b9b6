"""Drift statistics from a running skill to the hub: per window, once each, across restarts.

A real hub serves in this process (``Hub.serve`` on the test's event loop,
gRPC on loopback, its rollout loop deploying), and real agents built by
:func:`edge_agent.wiring.build_agent` install the skill through TUF and send
their telemetry windows through their durable outbox. The skill either is a
fake whose answers are read off each frame (so the stream drifts exactly as
the test says) or the built-in digits skill in its sandbox with the digits CNN
and the drift reference the hub's model factory builds for it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cloud.drift.aggregate import DriftWindow
from cloud.hub import Hub
from cloud.models.references import held_out_reference
from cloud.service import FleetService
from cloud.store.records import TelemetryRecord
from edge_agent.agent import Agent
from edge_agent.config import AgentConfig
from edge_agent.drift import PSI_MAJOR
from edge_agent.outbox import Outbox
from edge_agent.sandbox.launcher import SkillLauncher, make_launcher
from edge_agent.wiring import build_agent
from edge_agent.workload import ReplaySource
from skills.drift_reference import DriftReference, build_reference
from tests.fakes.fake_launcher import PROFILE, FakeLauncher
from tests.support import async_wait_until, free_port, wait_for_port
from tests.support.skillkit import LIBRARY, VariantFile, build_skill, train_digits_onnx

TIMEOUT_S = 60.0


# --- an in-process hub and its agents ----------------------------------------------------


@contextlib.asynccontextmanager
async def serving(hub: Hub) -> AsyncIterator[None]:
    """The hub serving on this event loop until the block ends."""
    stop = asyncio.Event()
    task = asyncio.create_task(hub.serve(stop))
    try:
        port = int(hub.config.grpc_bind.rsplit(":", 1)[1])
        await asyncio.to_thread(wait_for_port, port)
        yield
    finally:
        stop.set()
        await task


def open_hub(tmp_path: Path, bundle: Path) -> Hub:
    """A hub with ``bundle`` (digits 1.0.0) published and deployed to the cameras."""
    hub = Hub.init(tmp_path / "hub", grpc_bind=f"127.0.0.1:{free_port()}", insecure=True)
    fleet = FleetService(hub)
    fleet.skills.publish(bundle)
    fleet.groups.create("cameras", "kind=camera")
    fleet.deployments.create("digits", "1.0.0", "cameras")
    return hub


def new_agent(
    hub: Hub, tmp_path: Path, source: ReplaySource, launcher: SkillLauncher, **settings: Any
) -> Agent:
    config = AgentConfig(
        hub_url=f"grpc://{hub.config.grpc_bind}",
        device_id="cam-1",
        state_dir=tmp_path / "agent",
        labels={"kind": "camera"},
        trusted_root=tmp_path / "hub" / "trust" / "metadata" / "root.json",
        reconcile_interval_s=0.5,
        insecure=True,
        **settings,
    )
    return build_agent(config, PROFILE, launcher=launcher, source=source)


def windows(hub: Hub) -> list[TelemetryRecord]:
    """The device's telemetry windows the hub stored, in the order the device sent them."""
    return sorted(hub.store.telemetry_for("cam-1"), key=lambda t: t.metrics["seq"])


# --- a stream that drifts as the test says -----------------------------------------------


def outputs(rng: np.random.Generator, n: int, *, shifted: bool) -> dict[str, np.ndarray]:
    """A 3-class classifier's answers: right 90% (60% shifted), confident (unsure shifted)."""
    truth = rng.choice(3, n, p=[0.2, 0.3, 0.5] if shifted else [0.5, 0.3, 0.2])
    wrong = rng.random(n) < (0.4 if shifted else 0.1)
    return {
        "truth": truth,
        "predicted": np.where(wrong, (truth + 1) % 3, truth),
        "confidence": rng.beta(2, 2, n) if shifted else rng.beta(8, 1, n),
        "brightness": rng.normal(0.6 if shifted else 0.3, 0.05, n),
    }


def frames(parts: list[dict[str, np.ndarray]]) -> ReplaySource:
    """Frames that carry the answers in their first pixels, and the true labels."""
    joined = {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}
    x = np.zeros((len(joined["truth"]), 8, 8), dtype=np.float32)
    x[:, 0, 0] = joined["predicted"]
    x[:, 0, 1] = joined["confidence"]
    x[:, 0, 2] = joined["brightness"]
    return ReplaySource(x=x, y=joined["truth"].astype(np.int64))


def read_off(item: Mapping[str, Any]) -> dict[str, Any]:
    """The fake skill: the answer written into the frame."""
    pixels = np.asarray(item["image"])
    return {
        "label": int(pixels[0, 0]),
        "confidence": float(pixels[0, 1]),
        "summaries": {"brightness": float(pixels[0, 2])},
    }


def synthetic_reference() -> DriftReference:
    data = outputs(np.random.default_rng(0), 20_000, shifted=False)
    return build_reference(
        data["predicted"], data["confidence"], {"brightness": data["brightness"]}
    )


def committed_windows(state: Path) -> int:
    """Telemetry windows waiting in a stopped agent's outbox."""
    with Outbox(state / "outbox.db") as box:
        return sum(1 for e in box.pending(limit=1000) if e.kind == "telemetry")


def answered(agent: Agent) -> int:
    """Results the agent counted (an item cut off by a stop is not one)."""
    return agent.inference_counts.snapshot().get(("digits", "1.0.0"), 0)


def by_part(stored: list[TelemetryRecord], runs: list[int], part: int) -> list[list[float]]:
    """The windows' metrics split by the part of the stream they lie wholly in.

    Each run feeds the stream in order from its start, so the windows of a run
    (``runs`` holds each run's result count) cover consecutive ranges of items.
    """
    parts: list[list[float]] = [[], []]
    start, run = 0, 0
    for window in stored:
        end = start + window.inferences
        first, last = start // part, (end - 1) // part
        if first == last and window.inferences >= 50:  # small windows are noise
            parts[first].append(window.metrics["drift.psi_confidence"])
        start = end
        if start == runs[run]:
            start, run = 0, run + 1
    return parts


@pytest.mark.slow
def test_drift_windows_reach_the_hub_exactly_once_across_an_agent_restart(
    tmp_path: Path,
) -> None:
    bundle = build_skill(
        LIBRARY / "digits", "1.0.0", [], tmp_path / "dist", reference=synthetic_reference()
    )
    hub = open_hub(tmp_path, bundle)
    rng = np.random.default_rng(1)
    source = frames([outputs(rng, 400, shifted=False), outputs(rng, 400, shifted=True)])
    settings = {"source_rate_hz": 400.0, "telemetry_window_s": 0.25}
    runs: list[int] = []

    async def run(agent: Agent, until: int) -> None:
        stop = asyncio.Event()
        running = asyncio.create_task(agent.run(stop))
        await async_wait_until(lambda: answered(agent) >= until, TIMEOUT_S, f"{until} answers")
        stop.set()
        await running
        runs.append(answered(agent))

    async def main() -> None:
        async with serving(hub):
            # Stopped mid-stream: its last window is in its outbox only, sent by the next run.
            await run(
                new_agent(hub, tmp_path, source, FakeLauncher(answer=read_off), **settings), 600
            )
            assert committed_windows(tmp_path / "agent") >= 1
            # The same state folder again: the skill starts again and the stream replays.
            second = new_agent(hub, tmp_path, source, FakeLauncher(answer=read_off), **settings)
            stop = asyncio.Event()
            running = asyncio.create_task(second.run(stop))
            await async_wait_until(lambda: answered(second) == len(source), TIMEOUT_S, "all")
            total = runs[0] + len(source)

            def all_stored() -> bool:
                return sum(w.inferences for w in windows(hub)) == total

            await async_wait_until(all_stored, TIMEOUT_S, "every window at the hub")
            await async_wait_until(lambda: len(second.outbox) == 0, TIMEOUT_S, "the acks")
            stop.set()
            await running
            runs.append(answered(second))

    try:
        asyncio.run(main())
        stored = windows(hub)
    finally:
        hub.close()
    seqs = [int(w.metrics["seq"]) for w in stored]
    assert seqs == list(range(1, len(stored) + 1))  # every window once: no gap, no repeat
    assert all(w.metrics["drift.n"] == w.inferences == w.labelled for w in stored)
    assert sum(w.metrics["drift.n"] for w in stored) == sum(runs)
    assert all(w.metrics["drift.accuracy"] == w.correct / w.labelled for w in stored)
    for w in stored:  # what the hub's drift policy reads out of each window
        drift = DriftWindow.from_metrics("cam-1", w.skill, w.version, "cameras", 1, w.metrics)
        assert drift is not None and drift.n == w.inferences and drift.labelled == w.labelled
    stable, shifted = by_part(stored, runs, 400)
    assert stable and shifted
    assert max(stable) < 0.3 and min(shifted) > 1.0
    assert max(w.metrics["drift.ks.brightness"] for w in stored) > 0.9
    assert any(w.metrics["drift.alarms"] > 0 for w in stored)


# --- the built-in digits skill, its model and the factory's reference --------------------


def noisy(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Digits under heavy sensor noise, still in [0, 1]."""
    return np.clip(x + rng.normal(0.0, 0.4, x.shape), 0.0, 1.0).astype(np.float32)


def rotated(x: np.ndarray) -> np.ndarray:
    """Digits seen by a camera mounted a quarter turn off."""
    return np.ascontiguousarray(np.rot90(x, 1, axes=(-2, -1)))


@pytest.mark.slow
def test_the_digits_skill_reports_psi_near_zero_on_its_data_and_high_on_shifted_digits(
    tmp_path: Path,
) -> None:
    trained = train_digits_onnx(tmp_path / "digits.onnx", epochs=3)
    reference = held_out_reference(trained.onnx_path, trained.data)  # as the factory builds it
    model = VariantFile("onnx-cpu", "fp32", trained.onnx_path)
    bundle = build_skill(
        LIBRARY / "digits", "1.0.0", [model], tmp_path / "dist", reference=reference
    )
    hub = open_hub(tmp_path, bundle)
    # The held-out digits twice per part, so each part holds whole windows of ~250.
    test = trained.data.test
    images, labels = np.concatenate([test.x[:, 0]] * 2), np.tile(test.y, 2)
    parts = {"clean": images, "noisy": noisy(images, np.random.default_rng(2))}
    parts["rotated"] = rotated(images)
    source = ReplaySource(x=np.concatenate(list(parts.values())), y=np.tile(labels, len(parts)))
    launcher = make_launcher(PROFILE.targets, PROFILE.precisions, tmp_path / "logs")

    async def main() -> None:
        async with serving(hub):
            agent = new_agent(
                hub, tmp_path, source, launcher, source_rate_hz=500.0, telemetry_window_s=0.5
            )
            stop = asyncio.Event()
            running = asyncio.create_task(agent.run(stop))

            def all_stored() -> bool:
                return sum(w.inferences for w in windows(hub)) == len(source)

            await async_wait_until(all_stored, 2 * TIMEOUT_S, "every window at the hub")
            stop.set()
            await running

    try:
        asyncio.run(main())
        stored = windows(hub)
    finally:
        hub.close()
    assert all(w.errors == 0 and w.metrics["drift.n"] == w.inferences for w in stored)
    per_part: dict[str, list[dict[str, float]]] = {name: [] for name in parts}
    start = 0
    for window in stored:  # the items were fed in order: each window covers a range of them
        end = start + window.inferences
        names = {list(parts)[i // len(images)] for i in (start, end - 1)}
        if len(names) == 1 and window.inferences >= 100:  # wholly inside one part, not tiny
            per_part[names.pop()].append(window.metrics)
        start = end
    assert all(per_part.values()), {name: len(w) for name, w in per_part.items()}
    for metrics in per_part["clean"]:  # as validated: PSI near zero, brightness as ever
        assert metrics["drift.psi_class"] < 0.15 and metrics["drift.psi_confidence"] < 0.15
        assert metrics["drift.ks_p.brightness"] > 1e-3
        assert metrics["drift.accuracy"] > 0.8
    for metrics in per_part["noisy"]:  # unsure answers on brighter frames
        assert metrics["drift.psi_confidence"] > PSI_MAJOR
        assert metrics["drift.ks.brightness"] > 0.4 and metrics["drift.ks_p.brightness"] < 1e-6
    for metrics in per_part["rotated"]:  # confident, wrong, and one class for many digits
        assert metrics["drift.psi_class"] > 1.0
        assert metrics["drift.accuracy"] < 0.3
