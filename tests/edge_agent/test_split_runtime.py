"""The agent's half of split and joint inference, without a control process.

The coordinator's plan follows the link it learns; the broker refuses what is
not the skill's own and turns every hub failure into an answer; the device-side
paths (:class:`DeviceInference`) fall back with exactly one result; joint
routing follows the threshold; the telemetry window counts the paths.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_agent.sandbox.protocol import InferRecord, TailAnswer, TailRequest
from edge_agent.split.device import DeviceInference
from edge_agent.split.joint import confidence, is_hard
from edge_agent.split.link import LinkConfig, LinkEstimator, RequestSample
from edge_agent.split.planner import LinkEstimate
from edge_agent.split.routes import JointRoute, Shared, SplitCoordinator, SplitSettings
from edge_agent.split.runtime import SkillBroker, SplitRuntime
from edge_agent.workload import WindowStats
from skills.manifest import JointSpec, Manifest, SplitSpec
from skills.split_plan import SplitPlan
from skills.tensor_codec import decode_protos
from tests.fakes.split_hub import WEIGHTS, LocalTailHub, reference, write_split_model
from tests.fakes.split_plans import three_segment_plan

X = np.random.default_rng(5).normal(size=(1, 16)).astype(np.float32)


# -- the coordinator: costs and plan ----------------------------------------------------


PLAN = three_segment_plan(
    input_bytes=1_000_000,
    output_bytes=40,
    mid_bytes=60_000,
    late_bytes=4_000,
    hub_ms=0.5,
    device_ms=0.1,
)


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _coordinator(
    clock: _Clock, link: LinkEstimator | None = None, codec: str = "fp32"
) -> SplitCoordinator:
    shared = Shared(link or LinkEstimator(), threading.Lock(), SplitSettings(), clock)
    spec = SplitSpec(model="net", plan="models/net/split.json", codec=codec, deadline_ms=500)
    return SplitCoordinator("s", "1.0.0", spec, PLAN, shared)


def _traffic(route: SplitCoordinator, clock: _Clock, bandwidth: float, rtt_ms: float) -> None:
    """Two seconds of requests on a link of ``bandwidth`` bytes/s and ``rtt_ms``."""
    for _ in range(40):
        clock.now += 0.05
        route.link.observe_rtt(clock.now, rtt_ms)
        size = 60_000
        took = rtt_ms / 1000 + size / bandwidth
        route.succeeded(RequestSample(clock.now - took, clock.now, size, 40, 0.0))


def test_table_prices_cuts_from_the_profile_the_plan_and_the_codec() -> None:
    route = _coordinator(_Clock(), codec="fp16")
    route.set_profile([5.0, 5.0, 5.0])
    table = route.table()
    assert [c.name for c in table.cuts] == ["input", "mid", "late", "device"]
    assert [c.device_ms for c in table.cuts] == [0.0, 5.0, 10.0, 15.0]
    assert [c.hub_ms for c in table.cuts] == [1.5, 1.0, 0.5, 0.0]
    assert table.cuts[1].bytes_up == 30_000 + 8  # fp16 halves the activation
    assert table.cuts[-1].local
    with pytest.raises(ValueError, match="segments"):
        route.set_profile([1.0])


def test_under_codec_auto_each_cut_is_priced_and_sent_in_its_plan_codec() -> None:
    plan = dataclasses.replace(
        PLAN,
        cuts=(
            dataclasses.replace(PLAN.cuts[0], codec="fp16"),
            dataclasses.replace(PLAN.cuts[1], codec="int8"),
            PLAN.cuts[2],  # none chosen: fp16
        ),
    )
    shared = Shared(LinkEstimator(), threading.Lock(), SplitSettings(), _Clock())

    def route(codec: str) -> SplitCoordinator:
        spec = SplitSpec(model="net", plan="models/net/split.json", codec=codec)
        return SplitCoordinator("s", "1.0.0", spec, plan, shared)

    auto, fixed = route("auto"), route("fp32")
    assert [c.bytes_up for c in auto.table().cuts[:3]] == [500_008, 15_008, 2_008]
    assert [c.bytes_up for c in fixed.table().cuts[:3]] == [1_000_008, 60_008, 4_008]
    m = np.linspace(-1.0, 1.0, 8, dtype=np.float32).reshape(1, 8)
    (sent,) = auto.encode("mid", {"m": m})
    assert sent.dtype == "int8" and sent.name == "m"
    (late,) = auto.encode("late", {"l": m})
    assert late.dtype == "float16"
    (exact,) = fixed.encode("mid", {"m": m})  # a fixed manifest codec wins over the plan's
    assert exact.dtype == "float32"
    np.testing.assert_allclose(decode_protos([sent], ["m"])["m"], m, atol=2.0 / 255)


def test_cut_moves_when_the_link_changes_and_back() -> None:
    clock = _Clock()
    route = _coordinator(clock)
    route.set_profile([5.0, 5.0, 5.0])
    _traffic(route, clock, bandwidth=1.25e8, rtt_ms=1.0)  # 1 Gbit/s, 1 ms
    assert route.decide() == "mid"
    _traffic(route, clock, bandwidth=1.25e6, rtt_ms=50.0)  # 10 Mbit/s, 50 ms
    assert route.decide() == "device"
    _traffic(route, clock, bandwidth=1.25e8, rtt_ms=1.0)
    assert route.decide() == "mid"


def test_a_slower_device_moves_the_cut_toward_the_hub() -> None:
    clock = _Clock()
    route = _coordinator(clock)
    _traffic(route, clock, bandwidth=1.25e8, rtt_ms=1.0)
    route.set_profile([0.01, 0.01, 0.01])
    assert route.decide() == "device"
    route.set_profile([80.0, 80.0, 80.0])  # what a 16x slower device profiles
    assert route.decide() == "input"


def test_real_device_runs_slower_than_the_profile_move_the_cut_toward_the_hub() -> None:
    clock = _Clock()
    route = _coordinator(clock)
    _traffic(route, clock, bandwidth=1.25e8, rtt_ms=1.0)
    route.set_profile([0.6, 0.6, 0.6])  # profiled back to back, warm
    assert route.decide() == "device"
    for _ in range(20):  # real items take 3x as long on the device
        route.learn_device("device", 5.4)
    assert route.device_scale == pytest.approx(3.0, rel=0.01)
    assert route.table().cuts[-1].device_ms == pytest.approx(5.4, rel=0.01)
    assert route.decide() != "device"
    route.learn_device("input", 1.0)  # hub-only runs nothing here: nothing to learn
    route.learn_device("mid", float("nan"))
    assert route.device_scale == pytest.approx(3.0, rel=0.01)


def test_runtime_learns_device_times_from_the_records_of_its_own_version(tmp_path: Path) -> None:
    skill_dir, manifest = _skill(tmp_path)

    async def main() -> tuple[float, float]:
        runtime = SplitRuntime(lambda: None, link=_fast_link())
        proc = _Proc(skill_dir, manifest, {"chain": (1.0, 1.0, 1.0)})
        broker = runtime.attach("probe", "1.0.0", proc)  # type: ignore[arg-type]
        assert broker is not None
        slow = [InferRecord("chain", "device", "", False, device_ms=30.0)] * 10
        runtime.learn_device("probe", "2.0.0", slow)  # another version: not this broker's
        before = broker.splits["chain"].device_scale
        runtime.learn_device("probe", "1.0.0", slow)
        return before, broker.splits["chain"].device_scale

    before, after = asyncio.run(main())
    assert before == 1.0
    assert after > 5.0  # toward 10x the profile's 3 ms


def test_hub_reports_scale_hub_times_and_queueing() -> None:
    route = _coordinator(_Clock())
    for _ in range(30):
        route.learn_hub("mid", hub_ms=10.0, queue_ms=4.0)  # 10x the plan's 1.0 ms
    assert route.hub_scale == pytest.approx(10.0, rel=0.01)
    assert route.queue_ms == pytest.approx(4.0, rel=0.01)
    assert route.table().cuts[0].hub_ms == pytest.approx(15.0, rel=0.01)


def test_failures_back_off_to_the_device_then_probe_with_a_doubling_wait() -> None:
    clock = _Clock()
    route = _coordinator(clock)
    route.set_profile([5.0, 5.0, 5.0])
    _traffic(route, clock, bandwidth=1.25e8, rtt_ms=1.0)
    route.failed("link")
    assert route.decide() == "device"
    clock.now += 1.01  # the first back-off is 1 s: the next request probes
    assert route.decide() == "mid"
    route.failed("link")  # the probe failed: 2 s now
    clock.now += 1.5
    assert route.decide() == "device"
    clock.now += 0.6
    assert route.decide() == "mid"
    route.succeeded(RequestSample(clock.now - 0.002, clock.now, 60_000, 40))
    route.failed("timeout")  # a success reset the wait to 1 s
    clock.now += 1.01
    assert route.decide() == "mid"
    assert route.outcomes == {"ok": 41, "link": 2, "timeout": 1}


# -- the broker and the runtime, with a fake hub ----------------------------------------


def _manifest(deadline_ms: int = 500) -> Manifest:
    return Manifest(
        name="probe",
        version="1.0.0",
        entrypoint="probe:Probe",
        splits=(SplitSpec("chain", "models/chain/split.json", "fp32", deadline_ms),),
        joints=(JointSpec("small", "big", "entropy", 0.5, deadline_ms),),
    )


def _skill(tmp_path: Path, deadline_ms: int = 500) -> tuple[Path, Manifest]:
    """The chain split with a slow first hub segment, so the planner cuts after it."""
    skill_dir = tmp_path / "skill"
    write_split_model(skill_dir, hub_ms=(100.0, 0.05, 0.05))
    return skill_dir, _manifest(deadline_ms)


@dataclass
class _Proc:
    """What :meth:`SplitRuntime.attach` reads of a running control process."""

    skill_dir: Path
    manifest: Manifest
    profiles: dict[str, tuple[float, ...]] = field(default_factory=dict)
    broker: Any = None

    def attach(self, broker: Any) -> None:
        self.broker = broker


def _fast_link() -> LinkEstimator:
    return LinkEstimator(LinkConfig(prior=LinkEstimate(0.05, 1.25e9)))


def _run_with_broker(
    tmp_path: Path, hub: LocalTailHub, body: Callable[[SkillBroker], Any], deadline_ms: int = 500
) -> Any:
    skill_dir, manifest = _skill(tmp_path, deadline_ms)
    hub.plan_path = skill_dir / "models" / "chain" / "split.json"

    async def main() -> Any:
        runtime = SplitRuntime(lambda: hub, link=_fast_link())
        proc = _Proc(skill_dir, manifest, {"chain": (0.1, 50.0, 50.0)})
        broker = runtime.attach("probe", "1.0.0", proc)  # type: ignore[arg-type]
        assert broker is not None and proc.broker is broker
        return await asyncio.to_thread(body, broker)

    return asyncio.run(main())


def _request(
    model: str, split: str, tensors: Mapping[str, np.ndarray], item: int = 1
) -> TailRequest:
    return TailRequest(id=1, item=item, model=model, split=split, tensors=dict(tensors))


def test_broker_plans_and_runs_a_tail_on_the_hub(tmp_path: Path) -> None:
    hub = LocalTailHub()

    def body(broker: SkillBroker) -> tuple[dict[str, str], TailAnswer]:
        plan = broker.plan()
        h0 = np.maximum(X @ WEIGHTS[0], 0)
        return plan, broker.tail(_request("chain", "h0", {"h0": h0}), 5.0)

    plan, answer = _run_with_broker(tmp_path, hub, body)
    assert plan == {"chain": "h0", "small": "joint"}
    assert answer.outputs is not None
    np.testing.assert_allclose(answer.outputs["logits"], reference(X), rtol=1e-5)
    (sent,) = hub.requests
    assert (sent.skill, sent.version, sent.model, sent.split) == ("probe", "1.0.0", "chain", "h0")
    assert sent.deadline_ms == 500 and len(sent.request_id) == 32


@pytest.mark.parametrize(
    ("model", "split", "tensors", "reason"),
    [
        ("classifier", "input", {"x": X}, "no split or joint model"),  # another skill's model
        ("chain", "nowhere", {"x": X}, "has no cut"),
        ("chain", "input", {"h0": X}, "do not match the cut"),
        ("chain", "input", {"x": np.zeros((1, 2**25), np.float32)}, "cap"),
        ("small", "input", {"x": X}, "no split or joint model"),  # joint pairs go as 'joint'
    ],
)
def test_broker_refuses_what_is_not_its_own_plan(
    tmp_path: Path, model: str, split: str, tensors: dict[str, np.ndarray], reason: str
) -> None:
    hub = LocalTailHub()
    answer = _run_with_broker(tmp_path, hub, lambda b: b.tail(_request(model, split, tensors), 5))
    assert answer.outputs is None
    assert answer.error.startswith("refused") and reason in answer.error
    assert hub.requests == []


@pytest.mark.parametrize(("mode", "kind"), [("refuse", "refused"), ("drop", "link")])
def test_hub_failures_are_answers_and_back_off(tmp_path: Path, mode: str, kind: str) -> None:
    hub = LocalTailHub(mode=mode, delay_s=0.05)

    def body(broker: SkillBroker) -> tuple[TailAnswer, dict[str, str], TailAnswer]:
        first = broker.tail(_request("chain", "input", {"x": X}), 5.0)
        return first, broker.plan(), broker.tail(_request("chain", "input", {"x": X}), 5.0)

    first, plan, second = _run_with_broker(tmp_path, hub, body)
    assert first.outputs is None and first.plan == "device"
    assert plan == {"chain": "device", "small": "joint"}  # each route backs off on its own
    assert second.outputs is None and "backing off" in second.error
    assert len(hub.requests) == 1  # the back-off kept the second one off the hub


def test_pings_time_the_round_trip_and_teach_the_link_its_rtt(tmp_path: Path) -> None:
    hub = LocalTailHub(mode="slow", delay_s=0.08)
    skill_dir, manifest = _skill(tmp_path)
    hub.plan_path = skill_dir / "models" / "chain" / "split.json"

    async def main() -> tuple[float | None, float | None, list[float]]:
        runtime = SplitRuntime(lambda: hub, link=_fast_link())
        before = await runtime.ping()  # no skill splits yet: nothing to name, nothing sent
        runtime.attach("probe", "1.0.0", _Proc(skill_dir, manifest))  # type: ignore[arg-type]
        rtts = [await runtime.ping() for _ in range(8)]
        return before, runtime.link.estimate().rtt_ms, [r for r in rtts if r is not None]

    before, learned, rtts = asyncio.run(main())
    assert before is None
    assert len(rtts) == 8 and min(rtts) >= 80.0
    assert learned is not None and learned >= 70.0  # from the 0.05 ms prior
    assert {(r.split, len(r.inputs), r.skill) for r in hub.requests} == {("ping", 0, "probe")}


def test_the_ping_loop_sleeps_until_a_skill_splits_and_again_after(tmp_path: Path) -> None:
    hub = LocalTailHub(mode="slow", delay_s=0.0)
    skill_dir, manifest = _skill(tmp_path)
    hub.plan_path = skill_dir / "models" / "chain" / "split.json"
    asked: list[float] = []

    def transport() -> LocalTailHub:
        asked.append(time.monotonic())
        return hub

    async def main() -> tuple[int, int, int]:
        settings = SplitSettings(ping_interval_s=0.01)
        runtime = SplitRuntime(transport, settings=settings, link=_fast_link())
        loop = asyncio.create_task(runtime.ping_forever())
        await asyncio.sleep(0.2)  # nothing splits: not one wake-up that looks
        idle = len(asked)
        runtime.attach("probe", "1.0.0", _Proc(skill_dir, manifest))  # type: ignore[arg-type]
        deadline = time.monotonic() + 10
        while len(hub.requests) < 3:
            assert time.monotonic() < deadline, "no pings once a skill splits"
            await asyncio.sleep(0.01)
        runtime.detach("probe")
        await asyncio.sleep(0.05)  # a ping already asleep may still look once
        stopped = len(asked)
        await asyncio.sleep(0.2)
        loop.cancel()
        return idle, stopped, len(asked)

    idle, stopped, final = asyncio.run(main())
    assert idle == 0
    assert final == stopped


def test_a_failed_ping_teaches_nothing(tmp_path: Path) -> None:
    hub = LocalTailHub(mode="drop")
    skill_dir, manifest = _skill(tmp_path)

    async def main() -> tuple[float | None, float]:
        runtime = SplitRuntime(lambda: hub, link=_fast_link())
        runtime.attach("probe", "1.0.0", _Proc(skill_dir, manifest))  # type: ignore[arg-type]
        return await runtime.ping(), runtime.link.estimate().rtt_ms

    rtt, learned = asyncio.run(main())
    assert rtt is None and learned == pytest.approx(0.05)


def test_a_hub_that_hangs_is_cut_off_at_the_deadline(tmp_path: Path) -> None:
    hub = LocalTailHub(mode="hang")

    def body(broker: SkillBroker) -> tuple[TailAnswer, float, dict[str, int]]:
        started = time.monotonic()
        answer = broker.tail(_request("chain", "input", {"x": X}), 5.0)
        return answer, time.monotonic() - started, broker.splits["chain"].outcomes

    answer, took, outcomes = _run_with_broker(tmp_path, hub, body, deadline_ms=200)
    assert answer.outputs is None and "deadline" in answer.error
    assert 0.15 < took < 1.0
    assert outcomes == {"timeout": 1}


# -- the device side: path selection and fallback ----------------------------------------


class _Model:
    def __init__(self, fn: Callable[[np.ndarray], np.ndarray]) -> None:
        self.fn = fn
        self.output_names = ("logits",)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"logits": self.fn(feeds["x"])}


class _Runtime:
    def __init__(self, models: dict[str, _Model]) -> None:
        self.models = models

    def model(self, name: str) -> _Model:
        return self.models[name]


def _device(skill_dir: Path, manifest: Manifest, small: _Model | None = None) -> DeviceInference:
    runtime = _Runtime({"small": small or _Model(lambda x: x[:, :10])})
    return DeviceInference(skill_dir, manifest, runtime)  # type: ignore[arg-type]


def _bridge(broker: SkillBroker) -> Callable[[str, str, Mapping[str, np.ndarray]], TailAnswer]:
    def ask(model: str, split: str, tensors: Mapping[str, np.ndarray]) -> TailAnswer:
        return broker.tail(_request(model, split, tensors), 5.0)

    return ask


@pytest.mark.parametrize(
    ("plan", "path", "cut"),
    [
        ("h0", "split", "h0"),
        ("h1", "split", "h1"),
        ("input", "hub", "input"),
        ("device", "device", None),
    ],
)
def test_infer_runs_the_planned_path(tmp_path: Path, plan: str, path: str, cut: str | None) -> None:
    hub = LocalTailHub()

    def body(broker: SkillBroker) -> Any:
        device = _device(tmp_path / "skill", _manifest())
        return device.infer("chain", {"x": X}, plan={"chain": plan}, ask=_bridge(broker))

    result = _run_with_broker(tmp_path, hub, body)
    assert (result.path, result.cut, result.fallback) == (path, cut, False)
    np.testing.assert_allclose(result.outputs["logits"], reference(X), rtol=1e-5)
    assert [r.split for r in hub.requests] == ([] if cut is None else [cut])
    assert result.device_ms > 0  # the device's own time, what the agent learns from


@pytest.mark.parametrize("mode", ["drop", "refuse", "hang"])
def test_hub_lost_mid_request_gives_exactly_one_result_marked_fallback(
    tmp_path: Path, mode: str
) -> None:
    hub = LocalTailHub(mode=mode, delay_s=0.1)

    def body(broker: SkillBroker) -> Any:
        device = _device(tmp_path / "skill", _manifest())
        ask = _bridge(broker)
        return [
            device.infer("chain", {"x": X}, plan={"chain": "h1"}, ask=ask),
            device.infer("chain", {"x": X}, plan=broker.plan(), ask=ask),
        ]

    first, second = _run_with_broker(tmp_path, hub, body, deadline_ms=300)
    assert (first.path, first.cut, first.fallback) == ("device", None, True)
    np.testing.assert_allclose(first.outputs["logits"], reference(X), rtol=1e-5)
    assert (second.path, second.fallback) == ("device", False)  # backing off: not asked
    assert len(hub.requests) == 1


def test_no_hub_and_outside_an_item_everything_runs_on_the_device(tmp_path: Path) -> None:
    skill_dir, manifest = _skill(tmp_path)
    device = _device(skill_dir, manifest)
    result = device.infer("chain", {"x": X}, plan={"chain": "h0"}, ask=None)
    assert (result.path, result.fallback) == ("device", False)
    np.testing.assert_allclose(result.outputs["logits"], reference(X), rtol=1e-5)
    profile = device.profile(repeats=2)
    assert len(profile["chain"]) == 3 and all(t > 0 for t in profile["chain"])


# -- joint routing --------------------------------------------------------------------


def test_confidence_measures() -> None:
    certain = np.array([[10.0, 0.0, 0.0, 0.0]])
    unsure = np.array([[1.0, 1.0, 0.9, 1.0]])
    assert confidence(certain, "entropy") < 0.01 < 0.99 < confidence(unsure, "entropy")
    assert confidence(certain, "margin") > 0.99 and confidence(unsure, "margin") < 0.01
    probs = np.array([[0.7, 0.2, 0.1]])  # a distribution is taken as it is
    assert confidence(probs, "margin") == pytest.approx(0.5)
    batch = np.vstack([certain, unsure])  # the least confident row rules
    assert confidence(batch, "entropy") == pytest.approx(confidence(unsure, "entropy"))
    assert is_hard(0.6, "entropy", 0.5) and not is_hard(0.4, "entropy", 0.5)
    assert is_hard(0.4, "margin", 0.5) and not is_hard(0.6, "margin", 0.5)
    with pytest.raises(ValueError, match="unknown"):
        confidence(certain, "variance")


@pytest.mark.parametrize("measure", ["entropy", "margin"])
def test_joint_routes_hard_inputs_to_the_hub_by_threshold(tmp_path: Path, measure: str) -> None:
    asked: list[tuple[str, str]] = []

    def ask(model: str, split: str, tensors: Mapping[str, np.ndarray]) -> TailAnswer:
        asked.append((model, split))
        return TailAnswer({"big": np.array([[42.0]])})

    manifest = Manifest(
        name="probe",
        version="1.0.0",
        entrypoint="probe:Probe",
        joints=(JointSpec("small", "big", measure, 0.5),),
    )
    device = _device(tmp_path, manifest, _Model(lambda x: x))
    sharp = np.array([[20.0, 0.0, 0.0]], np.float32)
    flat = np.array([[1.0, 1.0, 0.95]], np.float32)
    easy = device.infer("small", {"x": sharp}, plan={"small": "joint"}, ask=ask)
    hard = device.infer("small", {"x": flat}, plan={"small": "joint"}, ask=ask)
    offline = device.infer("small", {"x": flat}, plan={"small": "device"}, ask=ask)
    assert easy.path == "joint-device" and easy.outputs["logits"][0, 0] == 20.0
    assert hard.path == "joint-hub" and hard.outputs["big"][0, 0] == 42.0
    assert offline.path == "joint-device" and not offline.fallback
    assert asked == [("small", "joint")]
    assert easy.confidence is not None and hard.confidence is not None

    def fail(model: str, split: str, tensors: Mapping[str, np.ndarray]) -> TailAnswer:
        return TailAnswer(None, "the link failed")

    fallen = device.infer("small", {"x": flat}, plan={"small": "joint"}, ask=fail)
    assert (fallen.path, fallen.fallback) == ("joint-device", True)
    assert fallen.outputs["logits"][0, 2] == pytest.approx(0.95)


def test_joint_tail_goes_to_the_big_model_with_the_input(tmp_path: Path) -> None:
    hub = LocalTailHub(big=lambda t: {"probs": np.ones((1, 3), np.float32) * t["x"].sum()})

    def body(broker: SkillBroker) -> TailAnswer:
        return broker.tail(_request("small", "joint", {"x": X}), 5.0)

    answer = _run_with_broker(tmp_path, hub, body)
    assert answer.outputs is not None
    assert answer.outputs["probs"][0, 0] == pytest.approx(float(X.sum()), rel=1e-5)
    (sent,) = hub.requests
    assert (sent.model, sent.split) == ("big", "joint")


def test_joint_route_backs_off() -> None:
    clock = _Clock()
    shared = Shared(LinkEstimator(), threading.Lock(), SplitSettings(), clock)
    route = JointRoute("s", "1.0.0", JointSpec("small", "big"), shared)
    assert route.decide() == "joint" and route.hub_model == "big"
    route.failed("refused")
    assert route.decide() == "device"
    clock.now += 1.01
    assert route.decide() == "joint"


# -- telemetry --------------------------------------------------------------------------


def test_window_counts_paths_fallbacks_upload_ratio_and_joint_accuracy() -> None:
    window = WindowStats("probe", "1.0.0")
    window.record({"label": 1}, 5.0, 1, (InferRecord("chain", "split", "h0", False),))
    window.record({"label": 1}, 5.0, 2, (InferRecord("chain", "device", "", True),))
    window.record({"label": 3}, 5.0, 3, (InferRecord("small", "joint-hub", "", False),))
    window.record({"label": 3}, 5.0, 4, (InferRecord("small", "joint-device", "", False),))
    window.record({"label": 5}, 5.0, 5, (InferRecord("small", "joint-device", "", False),))
    message = window.to_message(gauges={"split.link_rtt_ms": 3.0})
    metrics = dict(message.metrics)
    assert metrics["split.path.split"] == 1 and metrics["split.path.device"] == 1
    assert metrics["split.fallbacks"] == 1
    assert metrics["joint.upload_ratio"] == pytest.approx(1 / 3)
    assert metrics["joint.joint-hub.accuracy"] == 1.0
    assert metrics["joint.joint-device.accuracy"] == 0.5
    assert metrics["split.link_rtt_ms"] == 3.0 and metrics["events"] == 0


def test_runtime_metrics_report_the_link_and_the_cut(tmp_path: Path) -> None:
    skill_dir, manifest = _skill(tmp_path)

    async def main() -> dict[str, float]:
        runtime = SplitRuntime(lambda: None, link=_fast_link())
        proc = _Proc(skill_dir, manifest, {"chain": (0.1, 50.0, 50.0)})
        broker = runtime.attach("probe", "1.0.0", proc)  # type: ignore[arg-type]
        assert broker is not None
        broker.plan()
        assert runtime.metrics("probe", "0.9.0") == {}
        return runtime.metrics("probe", "1.0.0")

    metrics = asyncio.run(main())
    assert metrics["split.chain.cut_index"] == 1.0  # h0: after the hub-only cut
    assert metrics["split.chain.profiled"] == 1.0
    assert metrics["split.link_bandwidth_bps"] == pytest.approx(1.25e9)
    assert SplitPlan.load(skill_dir / "models" / "chain" / "split.json").model == "chain"


def test_split_segments_open_with_the_profiles_providers(tmp_path: Path) -> None:
    """As the runtime facade does: the target's providers, then the profile's, CPU last."""
    import onnxruntime as ort  # noqa: PLC0415

    extra = next((p for p in ort.get_available_providers() if p != "CPUExecutionProvider"), None)
    assert extra is not None, "this ONNX Runtime build has only the CPU provider"
    skill_dir, manifest = _skill(tmp_path)
    runtime = _Runtime({})
    device = DeviceInference(skill_dir, manifest, runtime, providers=(extra,))  # type: ignore[arg-type]
    for session in device.runner("chain")._sessions:
        assert session.get_providers() == [extra, "CPUExecutionProvider"]
    plain = DeviceInference(skill_dir, manifest, runtime)  # type: ignore[arg-type]
    assert plain.runner("chain")._sessions[0].get_providers() == ["CPUExecutionProvider"]
