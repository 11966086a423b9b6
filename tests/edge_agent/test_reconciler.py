"""The reconciler against real bundles, a real install store and real control processes; no hub.

The hub's side is a fetch function that maps target names to local bundles, so
each pass of the level-triggered loop can be driven and inspected directly.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edge_agent.installs import InstallStore
from edge_agent.reconciler import Reconciler
from edge_agent.sandbox.launcher import make_launcher
from protos import pb
from skills.errors import FetchError, TrustError
from tests.support import async_wait_until
from tests.support.skillkit import LIBRARY, VariantFile, build_skill

BROKEN = """
from skills.sdk import Skill


class DigitsSkill(Skill):
    def setup(self, ctx):
        raise RuntimeError("sensor offline")

    def process(self, item):
        return {}
"""


def tiny_onnx(path: Path) -> Path:
    w = np.random.default_rng(0).normal(size=(64, 10)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Flatten", ["image"], ["flat"]),
            helper.make_node("MatMul", ["flat", "w"], ["logits"]),
        ],
        "tiny",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, path)
    return path


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    work = tmp_path_factory.mktemp("reconciler-bundles")
    models = [VariantFile("onnx-cpu", "fp32", tiny_onnx(work / "tiny.onnx"))]
    broken_src = work / "broken"
    shutil.copytree(LIBRARY / "digits", broken_src, ignore=shutil.ignore_patterns("__pycache__"))
    (broken_src / "control" / "digits_skill.py").write_text(BROKEN)
    return {
        "digits/1.0.0": build_skill(LIBRARY / "digits", "1.0.0", models, work / "dist"),
        "digits/2.0.0": build_skill(LIBRARY / "digits", "2.0.0", models, work / "dist"),
        "digits/2.1.0": build_skill(LIBRARY / "digits", "2.1.0", models, work / "dist"),
        "digits/3.0.0": build_skill(broken_src, "3.0.0", models, work / "dist"),
    }


class Hub:
    """Serves bundles by target name; can be told to fail."""

    def __init__(self, bundles: dict[str, Path]) -> None:
        self.bundles = bundles
        self.fail: Exception | None = None
        self.calls: list[str] = []

    def fetch(self, target: str) -> Path:
        self.calls.append(target)
        if self.fail is not None:
            raise self.fail
        return self.bundles[target]


def desired(
    generation: int, *versions: str, config: dict[str, str] | None = None
) -> pb.DesiredState:
    msg = pb.DesiredState(generation=generation)
    for v in versions:
        msg.skills.add(name="digits", version=v, target_name=f"digits/{v}", config=config or {})
    return msg


def make(
    tmp_path: Path, hub: Hub, clock: list[float] | None = None, keep_versions: int = 2
) -> Reconciler:
    now = clock if clock is not None else [0.0]
    return Reconciler(
        InstallStore(tmp_path / "installs"),
        hub.fetch,
        make_launcher(["onnx-cpu"], (), tmp_path / "logs"),
        lambda: None,
        clock=lambda: now[0],
        keep_versions=keep_versions,
    )


def state(rec: Reconciler) -> tuple[str, str, str]:
    s = rec.states["digits"]
    return s.version, s.state, s.desired_version


def test_install_upgrade_and_remove(tmp_path: Path, bundles: dict[str, Path]) -> None:
    hub = Hub(bundles)
    rec = make(tmp_path, hub)

    async def scenario() -> None:
        await rec.reconcile(desired(1, "1.0.0"))
        assert state(rec) == ("1.0.0", "running", "1.0.0")
        first = rec.running()["digits"]
        result, _ms = first.process({"image": np.zeros((8, 8)), "scaled": True})
        assert 0 <= result["label"] <= 9

        await rec.reconcile(desired(1, "1.0.0"))  # level-triggered: nothing to do, nothing fetched
        assert hub.calls == ["digits/1.0.0"]

        await rec.reconcile(desired(2, "2.0.0"))
        assert state(rec) == ("2.0.0", "running", "2.0.0")
        assert not first.alive
        assert rec.report(2).skills[0].previous_version == "1.0.0"

        await rec.reconcile(desired(3))
        assert "digits" not in rec.states and rec.running() == {}
        assert rec.installs.current("digits") is None
        await rec.shutdown()

    asyncio.run(scenario())


def test_failed_health_check_rolls_back_and_is_not_retried(
    tmp_path: Path, bundles: dict[str, Path]
) -> None:
    hub = Hub(bundles)
    rec = make(tmp_path, hub)

    async def scenario() -> None:
        await rec.reconcile(desired(1, "1.0.0"))
        await rec.reconcile(desired(2, "3.0.0"))
        version, st, want = state(rec)
        assert (version, st, want) == ("1.0.0", "rolled_back", "3.0.0")
        assert "sensor offline" in rec.states["digits"].error
        assert rec.installs.current("digits").version == "1.0.0"  # type: ignore[union-attr]
        assert rec.running()["digits"].alive
        calls = len(hub.calls)
        await rec.reconcile(desired(2, "3.0.0"))  # same generation: not tried again
        assert len(hub.calls) == calls
        await rec.shutdown()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    "error", [TrustError("rollback attack: timestamp v2 < v3"), FetchError("hub gone")]
)
def test_fetch_failures_keep_the_running_version_and_retry_later(
    tmp_path: Path, bundles: dict[str, Path], error: Exception
) -> None:
    hub = Hub(bundles)
    clock = [0.0]
    rec = make(tmp_path, hub, clock)

    async def scenario() -> None:
        await rec.reconcile(desired(1, "1.0.0"))
        hub.fail = error
        await rec.reconcile(desired(2, "2.0.0"))
        assert state(rec) == ("1.0.0", "failed", "2.0.0")
        assert str(error) in rec.states["digits"].error
        assert rec.running()["digits"].alive
        await rec.reconcile(desired(2, "2.0.0"))  # inside the backoff: no new attempt
        assert hub.calls.count("digits/2.0.0") == 1

        hub.fail = None
        clock[0] += 2.0  # still inside the first backoff (3 s)
        await rec.reconcile(desired(2, "2.0.0"))
        assert hub.calls.count("digits/2.0.0") == 1
        clock[0] += 2.0  # past it
        await rec.reconcile(desired(2, "2.0.0"))
        assert state(rec) == ("2.0.0", "running", "2.0.0")
        await rec.shutdown()

    asyncio.run(scenario())


def test_unknown_desired_state_keeps_installed_skills_running(
    tmp_path: Path, bundles: dict[str, Path]
) -> None:
    hub = Hub(bundles)
    rec = make(tmp_path, hub)

    async def scenario() -> None:
        await rec.reconcile(desired(1, "1.0.0"))
        await rec.shutdown()
        again = make(tmp_path, hub)  # a restart with no word from the hub yet
        await again.reconcile(None)
        assert again.running()["digits"].alive
        await again.shutdown()

    asyncio.run(scenario())


# min_confidence 1.0 makes the digits skill emit an event for every item: a config
# that can be seen from outside the process.
EVERY_ITEM = {"min_confidence": "1.0"}


def test_rollback_restarts_the_previous_version_with_the_hubs_config(
    tmp_path: Path, bundles: dict[str, Path]
) -> None:
    hub = Hub(bundles)
    rec = make(tmp_path, hub)

    async def scenario() -> None:
        await rec.reconcile(desired(1, "1.0.0", config=EVERY_ITEM))
        await rec.reconcile(desired(2, "3.0.0", config=EVERY_ITEM))
        assert state(rec) == ("1.0.0", "rolled_back", "3.0.0")
        proc = rec.running()["digits"]
        proc.process({"image": np.zeros((8, 8))})
        events = proc.drain_events()
        assert [e["kind"] for e in events] == ["low_confidence"]
        await rec.shutdown()

    asyncio.run(scenario())


def test_versions_beyond_the_kept_number_are_pruned(
    tmp_path: Path, bundles: dict[str, Path]
) -> None:
    hub = Hub(bundles)
    rec = make(tmp_path, hub, keep_versions=2)
    skill_dir = tmp_path / "installs" / "skills" / "digits"

    def on_disk() -> list[str]:
        return sorted(p.name for p in skill_dir.iterdir())

    async def scenario() -> None:
        await rec.reconcile(desired(1, "1.0.0"))
        await rec.reconcile(desired(2, "2.0.0"))
        assert on_disk() == ["1.0.0", "2.0.0", "current", "previous"]
        await rec.reconcile(desired(3, "2.1.0"))
        assert state(rec) == ("2.1.0", "running", "2.1.0")
        assert on_disk() == ["2.0.0", "2.1.0", "current", "previous"]
        await rec.shutdown()
        lean = make(tmp_path, hub, keep_versions=1)
        await lean.reconcile(desired(3, "2.1.0"))
        assert on_disk() == ["2.1.0", "current"]
        await lean.shutdown()

    asyncio.run(scenario())


def test_a_crashed_skill_is_restarted_on_the_next_pass(
    tmp_path: Path, bundles: dict[str, Path]
) -> None:
    hub = Hub(bundles)
    rec = make(tmp_path, hub)

    async def scenario() -> None:
        await rec.reconcile(desired(1, "1.0.0", config=EVERY_ITEM))
        first = rec.running()["digits"]
        first.stop()
        assert rec.running() == {}
        await rec.reconcile(desired(1, "1.0.0", config=EVERY_ITEM))
        second = rec.running()["digits"]
        assert second is not first
        assert state(rec) == ("1.0.0", "running", "1.0.0")
        assert hub.calls == ["digits/1.0.0"]
        await rec.shutdown()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("error", "event"),
    [
        (TrustError("hash mismatch (tampered or corrupt file)"), ("install-refused", "trust")),
        (FetchError("not connected to the hub"), None),  # the network's fault: no event
    ],
)
def test_a_refused_bundle_is_reported_as_a_security_event(
    tmp_path: Path, bundles: dict[str, Path], error: Exception, event: tuple[str, str] | None
) -> None:
    hub = Hub(bundles)
    events: list[tuple[str, str, str, str]] = []
    rec = make(tmp_path, hub)
    rec.on_event = lambda kind, reason, detail, subject: events.append(
        (kind, reason, detail, subject)
    )

    async def scenario() -> None:
        await rec.reconcile(desired(1, "1.0.0"))
        hub.fail = error
        await rec.reconcile(desired(2, "2.0.0"))
        assert state(rec) == ("1.0.0", "failed", "2.0.0")
        await rec.shutdown()

    asyncio.run(scenario())
    refused = [(k, r, s) for k, r, _d, s in events if k == "install-refused"]
    assert refused == ([(*event, "digits 2.0.0")] if event else [])


def test_a_version_taken_back_while_it_downloads_leaves_the_running_one_reported_running(
    tmp_path: Path, bundles: dict[str, Path]
) -> None:
    # A staged rollout rolled back while a canary device was still fetching the new
    # version: nothing is left to do, but the report must say the device is back.
    hub = Hub(bundles)
    release = threading.Event()
    served = hub.fetch

    def slow_fetch(target: str) -> Path:
        if target == "digits/2.0.0":
            release.wait(30)
        return served(target)

    rec = make(tmp_path, hub)
    rec.fetch_target = slow_fetch

    async def scenario() -> None:
        await rec.reconcile(desired(1, "1.0.0"))
        upgrade = asyncio.create_task(rec.reconcile(desired(2, "2.0.0")))
        await async_wait_until(lambda: state(rec) == ("1.0.0", "installing", "2.0.0"), 10, "fetch")
        back = asyncio.create_task(rec.reconcile(desired(3, "1.0.0")))
        await async_wait_until(
            lambda: state(rec) == ("1.0.0", "running", "1.0.0"), 10, "reported running again"
        )
        release.set()
        await upgrade
        await back
        await rec.reconcile(desired(3, "1.0.0"))
        assert state(rec) == ("1.0.0", "running", "1.0.0")  # the late download changes nothing
        assert rec.running()["digits"].alive
        await rec.shutdown()

    asyncio.run(scenario())
