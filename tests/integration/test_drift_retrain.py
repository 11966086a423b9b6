"""A drift incident retrained for real: the factory's job, the shifted hold-out, the canary.

An in-process hub trains the digits CNN (few epochs), builds, signs and
deploys digits 1.0.0 as ``edgeskill demo`` does. Cameras then see inverted
digits (a shift the model never saw) and upload them as drift samples with
their labels, through the session core as devices do. The drift loop's steps
run for real: a job on the original digits plus the shifted samples, the new
model against the running one on the shifted hold-out, the next patch version
built and published, and a canary deployment of it gated on accuracy.
The canary's rollout itself is the rollout engine's (tested elsewhere); this
test stops once the canary deployment exists.
"""

from __future__ import annotations

import asyncio
import io
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pytest

from cloud.drift import FleetDrift, OpenIncident, Stage
from cloud.drift_loop import DriftLoop
from cloud.drift_retrain import LIBRARY, Retrainer
from cloud.hub import Hub
from cloud.hubcore import HubCore
from cloud.service import FleetService
from protos import make_envelope, pb
from protos.envelope import now_ms
from skills.tensor_codec import encode_protos

EPOCHS = 2
RETRAIN_EPOCHS = 4


def build_running_version(fleet: FleetService, work: Path) -> None:
    from cloud.models.bundles import package_skill  # noqa: PLC0415
    from cloud.models.worker import run_worker  # noqa: PLC0415
    from converters.pipeline import CompressOptions  # noqa: PLC0415

    factory = fleet.models
    dataset = factory.add_builtin_dataset("digits")
    job = factory.submit_training(dataset.id, epochs=EPOCHS, model_name="digits-cnn")
    with redirect_stdout(io.StringIO()):
        run_worker(fleet.home, job.id)
    model = factory.tables.get_model(factory.tables.get_job(job.id).model_name)
    factory.compress(model.id, ["int8"], options=CompressOptions(tflite=False, latency=False))
    artifacts = [factory.convert(model.id, "onnx-cpu", variant=v) for v in ("float", "int8")]
    fleet.skills.publish(package_skill(factory, LIBRARY / "digits", "1.0.0", artifacts, work))


def shifted_samples(core: HubCore, count: int, *, labelled: bool = True) -> None:
    """Cameras upload inverted digits with their true labels (or none), as agents would."""
    from converters.digits import digits_arrays  # noqa: PLC0415

    x, y = digits_arrays()
    rng = np.random.default_rng(0)
    picks = rng.choice(len(y), size=count, replace=False)

    async def send() -> None:
        for start in range(0, count, 32):
            samples = [
                pb.DriftSample(
                    input=encode_protos({"image": 1.0 - x[i : i + 1]}, ["image"], "fp32")[0],
                    predicted=0,
                    confidence=0.3,
                    label=int(y[i]) if labelled else -1,
                    seen_at_ms=now_ms(),  # after the world changed: what retraining takes
                )
                for i in picks[start : start + 32]
            ]
            body = pb.DriftSamples(skill="digits", version="1.0.0", samples=samples)
            session = core.session("cam-1")
            [ack] = await session.receive(
                make_envelope("cam-1", drift_samples=body).SerializeToString()
            )
            assert ack.HasField("ack")

    asyncio.run(send())


@pytest.mark.timeout(300)
def test_shifted_samples_retrain_beat_the_running_model_and_go_out_as_a_canary(
    tmp_path: Path,
) -> None:
    hub = Hub.init(tmp_path / "hub", insecure=True)
    fleet = FleetService(hub)
    try:
        build_running_version(fleet, tmp_path / "dist")
        for i in range(3):
            hub.store.register_device(f"cam-{i}", {"kind": "camera"}, {}, now_ms=1)
        fleet.groups.create("cams", "kind=camera")
        fleet.deployments.create("digits", "1.0.0", "cams")
        shifted_samples(hub.core(), 192)
        fleet.drift.set_settings("cams", retrain_samples=100)
        numbers = FleetDrift(1, 3, 3, 3, 1.0, 0.9, None, 0)
        opened = fleet.drift.open(
            OpenIncident("digits", "1.0.0", "cams", "3 of 3 drifting", ("cam-0",), numbers)
        )
        assert opened is not None
        loop = DriftLoop(fleet, Retrainer(fleet, epochs=RETRAIN_EPOCHS))
        assert loop.step(opened.id) is Stage.RETRAINING
        assert loop.step(opened.id) is Stage.BUILT, fleet.drift.show(opened.id).state.outcome
        assert loop.step(opened.id) is Stage.CANARY
        got = fleet.drift.show(opened.id)
        detail, s = got.detail, got.state
        assert detail["labels"] == "device" and detail["holdout"] == 48
        assert detail["accuracy_after"] > detail["accuracy_before"] + 0.2, detail
        assert s.skill_version == "1.0.1"
        lineage = fleet.models.lineage(s.model_id or 0)
        assert lineage.job is not None and lineage.job.id == s.job_id
        assert any(("digits", "1.0.1") in a.skills for a in lineage.artifacts)
        dep = fleet.deployments.get(s.deployment_id or 0)
        assert (dep.version, dep.group, dep.strategy) == ("1.0.1", "cams", "canary")
        events = [e.message for e in hub.store.events(kind="drift") if "incident" in e.message]
        assert [m.split(": ")[1] for m in events] == ["opened", "retraining", "built", "canary"]
        print(detail)
    finally:
        hub.close()


@pytest.mark.timeout(300)
def test_unlabelled_samples_are_labelled_by_the_groups_teacher_and_dropped_without_one(
    tmp_path: Path,
) -> None:
    from cloud.drift_retrain import _predict  # noqa: PLC0415

    hub = Hub.init(tmp_path / "hub", insecure=True)
    fleet = FleetService(hub)
    try:
        build_running_version(fleet, tmp_path / "dist")
        hub.store.register_device("cam-1", {"kind": "camera"}, {}, now_ms=1)
        fleet.groups.create("cams", "kind=camera")
        fleet.deployments.create("digits", "1.0.0", "cams")
        shifted_samples(hub.core(), 64, labelled=False)
        numbers = FleetDrift(1, 3, 3, 3, 1.0, 0.9, None, 0)
        opened = fleet.drift.open(
            OpenIncident("digits", "1.0.0", "cams", "3 of 3 drifting", ("cam-0",), numbers)
        )
        assert opened is not None
        retrainer, incident = Retrainer(fleet), fleet.drift.show(opened.id).state
        alone = retrainer.usable(incident, fleet.drift.settings("cams"))
        assert len(alone.ids) == 0  # no label came back and no teacher: nothing to train on
        fleet.drift.set_settings("cams", teacher="digits-cnn")  # any registered model
        taught = retrainer.usable(incident, fleet.drift.settings("cams"))
        assert len(taught.ids) == 64 and taught.teacher_labelled == 64
        teacher = fleet.models.tables.get_model("digits-cnn")
        onnx = fleet.models.export_blob(teacher.onnx_sha256, tmp_path / "teacher.onnx")
        np.testing.assert_array_equal(taught.y, _predict(onnx, taught.x))
    finally:
        hub.close()
