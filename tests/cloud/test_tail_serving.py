"""The hub serves tails from the signed bundle: entitled devices only, batched, deduplicated.

A real hub home (SQLite store, TUF repository) with the ``splitter`` skill
published and deployed; requests go through the core's device session, as
both transport servers send them (the transports are tested in
``tests/integration/test_infer_tail.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from cloud.hub import Hub
from cloud.hubcore import HubCore
from cloud.tail_batching import BatchSettings
from cloud.tail_serving import TailRefusedError, TailServer, TailSettings
from protos import make_envelope, pb
from tests.fakes.split_hub import chain_model, reference
from tests.support.split_skill import (
    GROUP,
    SKILL,
    SplitSkill,
    build_split_skill,
    head,
    outputs,
    publish,
    register,
    request,
    run_full,
)
from tests.support.tiny_models import digits_like_onnx

X = np.random.default_rng(3).normal(size=(1, 16)).astype(np.float32)
IMAGE = np.random.default_rng(4).normal(size=(1, 1, 8, 8)).astype(np.float32)


@pytest.fixture(scope="module")
def skill(tmp_path_factory: pytest.TempPathFactory) -> SplitSkill:
    work = tmp_path_factory.mktemp("splitter")
    net = work / "chain.onnx"
    net.write_bytes(chain_model())
    return build_split_skill(work, net, big=digits_like_onnx(work / "big.onnx", input_name="image"))


@pytest.fixture
def hub(tmp_path: Path, skill: SplitSkill) -> Iterator[Hub]:
    opened = Hub.init(tmp_path / "hub")
    opened.store.create_group(GROUP, "kind=camera")
    publish(opened, skill)
    yield opened
    opened.close()


def serving(hub: Hub, **settings: object) -> HubCore:
    """The hub's core, its tail server tuned by ``settings`` (batching ones go to BatchSettings)."""
    core = hub.core()
    batching = {k: v for k, v in settings.items() if k in BatchSettings.__dataclass_fields__}
    rest = {k: v for k, v in settings.items() if k not in batching}
    tuned = replace(TailSettings(batching=BatchSettings(**batching)), **rest)  # type: ignore[arg-type]
    core.tails = TailServer(hub.trust, core.tail_target, tuned)
    return core


def run(main: Callable[[], object]) -> None:
    asyncio.run(main())  # type: ignore[arg-type]


def test_every_tail_gives_what_the_full_model_gives(hub: Hub, skill: SplitSkill) -> None:
    async def main() -> None:
        core = serving(hub)
        await register(core, "cam-1")
        session = core.session("cam-1")
        for cut in skill.plan.cuts:
            sent = head(skill, cut.name, {"x": X})
            got = await session.infer(request(skill, cut.name, sent, request_id=cut.name))
            np.testing.assert_allclose(outputs(got)["logits"], reference(X), rtol=1e-5, atol=1e-5)
            assert got.request_id == cut.name and got.hub_ms > 0 and got.queue_ms >= 0
        joint = await session.infer(request(skill, "joint", {"image": IMAGE}, model="big"))
        assert skill.big is not None
        np.testing.assert_allclose(
            outputs(joint)["scores"], run_full(skill.big, {"image": IMAGE})["scores"], rtol=1e-6
        )
        assert core.tails.counts["ok"] == len(skill.plan.cuts) + 1
        await core.close()

    run(main)


def test_devices_not_entitled_are_refused(hub: Hub, skill: SplitSkill) -> None:
    async def main() -> None:
        core = serving(hub)
        await register(core, "gw-1", kind="gateway")  # not in the group the skill went to
        ask = request(skill, "input", {"x": X})
        for device, code in (("gw-1", "permission-denied"), ("ghost", "permission-denied")):
            with pytest.raises(TailRefusedError) as refused:
                await core.session(device).infer(ask)
            assert refused.value.code == code
        other = replace(skill, version="9.9.9")
        await register(core, "cam-1")
        with pytest.raises(TailRefusedError, match="not deployed") as refused:
            await core.session("cam-1").infer(request(other, "input", {"x": X}))
        assert refused.value.code == "permission-denied"
        assert core.tails.batcher.passes == 0
        await core.close()

    run(main)


def test_a_device_reporting_the_version_running_is_entitled(hub: Hub, skill: SplitSkill) -> None:
    async def main() -> None:
        core = serving(hub)
        await register(core, "gw-1", kind="gateway")  # outside the deployment's group
        with pytest.raises(TailRefusedError, match="not deployed"):
            await core.session("gw-1").infer(request(skill, "input", {"x": X}, request_id="a"))
        running = pb.SkillStatus(name=SKILL, version=skill.version, state="running")
        report = make_envelope("gw-1", reported=pb.ReportedState(generation=1, skills=[running]))
        await core.handle("gw-1", report)
        got = await core.session("gw-1").infer(request(skill, "input", {"x": X}, request_id="b"))
        np.testing.assert_allclose(outputs(got)["logits"], reference(X), rtol=1e-5, atol=1e-5)
        await core.close()

    run(main)


def test_the_first_load_of_a_tail_is_bounded_by_the_deadline(hub: Hub, skill: SplitSkill) -> None:
    async def main() -> None:
        core = serving(hub)
        await register(core, "cam-1")
        session = core.session("cam-1")
        await session.infer(request(skill, "input", {"x": X}, request_id="warm"))  # entitled
        hurried = request(skill, "joint", {"image": IMAGE}, model="big", request_id="j1")
        hurried.deadline_ms = 1  # the big model is not loaded yet: loading takes longer
        with pytest.raises(TailRefusedError, match="still loading") as refused:
            await session.infer(hurried)
        assert refused.value.code == "deadline-exceeded"
        patient = request(skill, "joint", {"image": IMAGE}, model="big", request_id="j2")
        got = await session.infer(patient)  # the load went on; this one is served
        assert skill.big is not None
        want = run_full(skill.big, {"image": IMAGE})["scores"]
        np.testing.assert_allclose(outputs(got)["scores"], want, rtol=1e-6)
        await core.close()

    run(main)


def test_a_tampered_bundle_on_the_hubs_disk_is_never_served(hub: Hub, skill: SplitSkill) -> None:
    (target,) = hub.trust.targets()
    path = hub.home / "trust" / target.path
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same length, other content
    path.chmod(0o644)
    path.write_bytes(bytes(data))

    async def main() -> None:
        core = serving(hub)
        await register(core, "cam-1")
        for attempt in range(2):  # the verdict is remembered: the second is not re-read
            with pytest.raises(TailRefusedError, match="no verified tail") as refused:
                await core.session("cam-1").infer(
                    request(skill, "input", {"x": X}, request_id=f"t{attempt}")
                )
            assert refused.value.code == "not-found"
        assert core.tails.counts["tampered"] == 1
        assert core.tails.batcher.passes == 0
        await core.close()

    run(main)


def test_requests_from_many_devices_run_in_fewer_batches(hub: Hub, skill: SplitSkill) -> None:
    devices = [f"cam-{i}" for i in range(12)]
    inputs = {
        d: np.random.default_rng(i).normal(size=(1, 16)).astype(np.float32)
        for i, d in enumerate(devices)
    }

    async def main() -> None:
        core = serving(hub, max_wait_ms=50.0, max_batch=8)
        for device in devices:
            await register(core, device)
        await core.session(devices[0]).infer(request(skill, "input", {"x": X}, request_id="warm"))
        before = sum(core.tails.batcher.batch_sizes.values())
        answers = await asyncio.gather(
            *(
                core.session(d).infer(request(skill, "input", {"x": inputs[d]}, request_id="same"))
                for d in devices
            )
        )
        for device, answer in zip(devices, answers, strict=True):
            np.testing.assert_allclose(
                outputs(answer)["logits"], reference(inputs[device]), rtol=1e-5, atol=1e-5
            )
        sizes = core.tails.batcher.batch_sizes
        batches = sum(sizes.values()) - before
        assert batches < len(devices)
        assert max(sizes) == 8  # a full batch left without waiting for the timer
        assert max(a.queue_ms for a in answers) < 2000
        await core.close()

    run(main)


def test_a_resent_request_gets_the_first_answer_without_a_second_run(
    hub: Hub, skill: SplitSkill
) -> None:
    async def main() -> None:
        core = serving(hub)
        await register(core, "cam-1")
        await register(core, "cam-2")
        ask = request(skill, "input", {"x": X}, request_id="once")
        first, again = await asyncio.gather(
            core.session("cam-1").infer(ask), core.session("cam-1").infer(ask)
        )
        later = await core.session("cam-1").infer(ask)
        assert first == again == later
        assert core.tails.batcher.passes == 1
        assert core.tails.counts["duplicate"] == 2
        other = await core.session("cam-2").infer(ask)  # another device's id space
        assert core.tails.batcher.passes == 2 and other.request_id == "once"
        await core.close()

    run(main)


def _edit(change: Callable[[pb.InferRequest], None]) -> Callable[[SplitSkill], pb.InferRequest]:
    def make(skill: SplitSkill) -> pb.InferRequest:
        ask = request(skill, "input", {"x": X}, request_id="bad")
        change(ask)
        return ask

    return make


def _set_input(**fields: object) -> Callable[[pb.InferRequest], None]:
    def change(ask: pb.InferRequest) -> None:
        del ask.inputs[:]
        ask.inputs.append(pb.TensorProto(**fields))  # type: ignore[arg-type]

    return change


HOSTILE: dict[str, tuple[Callable[[SplitSkill], pb.InferRequest], str]] = {
    "bad skill name": (_edit(lambda r: setattr(r, "skill", "../etc")), "invalid-argument"),
    "bad version": (_edit(lambda r: setattr(r, "version", "1")), "invalid-argument"),
    "no request id": (_edit(lambda r: setattr(r, "request_id", "")), "invalid-argument"),
    "long split": (_edit(lambda r: setattr(r, "split", "c" * 300)), "invalid-argument"),
    "unknown model": (_edit(lambda r: setattr(r, "model", "other")), "not-found"),
    "unknown cut": (_edit(lambda r: setattr(r, "split", "nowhere")), "not-found"),
    "joint on a split model": (_edit(lambda r: setattr(r, "split", "joint")), "not-found"),
    "other tensor": (
        _edit(_set_input(name="h0", dtype="float32", shape=[1, 16], data=b"\0" * 64)),
        "invalid-argument",
    ),
    "wrong shape": (
        _edit(_set_input(name="x", dtype="float32", shape=[1, 15], data=b"\0" * 60)),
        "invalid-argument",
    ),
    "rank": (
        _edit(_set_input(name="x", dtype="float32", shape=[16], data=b"\0" * 64)),
        "invalid-argument",
    ),
    "too many rows": (
        _edit(_set_input(name="x", dtype="float32", shape=[65, 16], data=b"\0" * 65 * 64)),
        "invalid-argument",
    ),
    "data short": (
        _edit(_set_input(name="x", dtype="float32", shape=[1, 16], data=b"\0" * 63)),
        "invalid-argument",
    ),
    "huge shape": (
        _edit(_set_input(name="x", dtype="float32", shape=[2**40, 2**40], data=b"")),
        "invalid-argument",
    ),
    "unknown dtype": (
        _edit(_set_input(name="x", dtype="float64", shape=[1, 16], data=b"\0" * 128)),
        "invalid-argument",
    ),
    "int8 without scale": (
        _edit(_set_input(name="x", dtype="int8", shape=[1, 16], data=b"\0" * 16)),
        "invalid-argument",
    ),
    "too many tensors": (
        _edit(lambda r: r.inputs.extend([r.inputs[0]] * 70)),
        "invalid-argument",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_requests_are_refused_and_change_nothing(
    hub: Hub, skill: SplitSkill, case: str
) -> None:
    make, code = HOSTILE[case]

    async def main() -> None:
        core = serving(hub)
        await register(core, "cam-1")
        with pytest.raises(TailRefusedError) as refused:
            await core.session("cam-1").infer(make(skill))
        assert refused.value.code == code
        assert core.tails.batcher.passes == 0 and core.tails.batcher.queued == 0
        good = await core.session("cam-1").infer(request(skill, "input", {"x": X}))
        np.testing.assert_allclose(outputs(good)["logits"], reference(X), rtol=1e-5, atol=1e-5)
        await core.close()

    run(main)


def test_oversized_and_garbage_payloads_are_refused(hub: Hub) -> None:
    async def main() -> None:
        core = serving(hub)
        await register(core, "cam-1")
        for payload in (b"\xff" * 10, b"\0" * (1024 * 1024)):
            with pytest.raises(TailRefusedError) as refused:
                await core.session("cam-1").infer_payload(payload)
            assert refused.value.code == "invalid-argument"
        await core.close()

    run(main)


def test_over_the_queue_cap_is_refused_at_once_and_deadlines_hold(
    hub: Hub, skill: SplitSkill
) -> None:
    async def main() -> None:
        core = serving(hub, max_wait_ms=400.0, max_queued=1)
        await register(core, "cam-1")
        session = core.session("cam-1")
        first = asyncio.create_task(session.infer(request(skill, "input", {"x": X})))
        await asyncio.sleep(0)  # let it queue (no fixed wait: one loop turn)
        while core.tails.batcher.queued == 0:
            await asyncio.sleep(0.001)
        with pytest.raises(TailRefusedError) as refused:
            await session.infer(request(skill, "input", {"x": X}, request_id="r2"))
        assert refused.value.code == "resource-exhausted"
        assert (await first).request_id == "r1"
        late = request(skill, "input", {"x": X}, request_id="r3", deadline_ms=50)
        with pytest.raises(TailRefusedError) as refused:
            await session.infer(late)
        assert refused.value.code == "deadline-exceeded"
        assert core.tails.batcher.queued == 0  # the late one withdrew from its batch
        await core.close()

    run(main)
