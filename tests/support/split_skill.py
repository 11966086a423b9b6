"""A skill with a split model and a joint pair, published on a hub, for tail-serving tests.

The split model ``net`` is whatever ONNX file the test gives (the chain of
:mod:`tests.fakes.split_hub`, the digits CNN); the joint pair runs a tiny
digits-shaped classifier on the device (``small``) and ``big`` on the hub.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from cloud.hub import Hub
from cloud.hubcore import HubCore
from cloud.service import FleetService
from cloud.split_build import add_split
from protos import make_envelope, pb
from protos.envelope import now_ms
from skills.bundle import build_bundle
from skills.manifest import JointSpec, Manifest, ModelVariant, SplitSpec
from skills.split_plan import SplitPlan
from skills.tensor_codec import decode_protos, encode_protos
from tests.support.tiny_models import digits_like_onnx

SKILL = "splitter"
GROUP = "cameras"


@dataclass(frozen=True)
class SplitSkill:
    """A published split skill and what a test compares against."""

    bundle: Path
    version: str
    plan: SplitPlan
    net: Path  # the full split model
    big: Path | None  # the joint pair's big model
    folder: Path  # the segments and split.json, as built
    spec: SplitSpec  # its [[split]] declaration


def build_split_skill(
    work: Path,
    net: Path,
    *,
    big: Path | None = None,
    version: str = "1.0.0",
    codec: str = "fp32",
    k: int = 6,
    samples: np.ndarray | None = None,
) -> SplitSkill:
    """Build the ``splitter`` bundle: ``net`` split (and a joint pair when ``big`` is given).

    ``samples`` measure each codec's cost at each cut (needed for ``codec="auto"``).
    """
    src = work / f"src-{version}"
    shutil.rmtree(src, ignore_errors=True)
    (src / "control").mkdir(parents=True)
    (src / "control" / "probe.py").write_text("class Probe:\n    pass\n")
    spec = add_split(src, "net", net, k=k, codec=codec, samples=samples)
    models: list[ModelVariant] = []
    joints: tuple[JointSpec, ...] = ()
    if big is not None:
        digits_like_onnx(src / "models" / "small.onnx", input_name="image")
        shutil.copyfile(big, src / "models" / "big.onnx")
        models = [
            ModelVariant("small", "onnx-cpu", "models/small.onnx"),
            ModelVariant("big", "onnx-cpu", "models/big.onnx"),
        ]
        joints = (JointSpec("small", "big", "entropy", 0.5, 2000),)
    manifest = Manifest(
        name=SKILL,
        version=version,
        entrypoint="probe:Probe",
        models=tuple(models),
        splits=(spec,),
        joints=joints,
    )
    (src / "skill.toml").write_text(manifest.to_toml())
    bundle = build_bundle(src, work / "dist")
    plan = SplitPlan.load(src / spec.plan)
    return SplitSkill(bundle, version, plan, net, big, src / "models" / "net", spec)


def publish(hub: Hub, skill: SplitSkill, *, deploy: bool = True) -> None:
    """Publish the bundle on ``hub`` and, with ``deploy``, roll it out to ``cameras``."""
    FleetService(hub).skills.publish(skill.bundle)
    if deploy:
        hub.store.create_deployment(SKILL, skill.version, GROUP, now_ms=now_ms())


async def register(core: HubCore, device_id: str, kind: str = "camera") -> None:
    """Register a device with the core directly (no transport)."""
    await core.register(make_envelope(device_id, register=pb.Register(labels={"kind": kind})))


def request(
    skill: SplitSkill,
    split: str,
    tensors: dict[str, np.ndarray],
    *,
    request_id: str = "r1",
    model: str = "net",
    codec: str = "fp32",
    deadline_ms: int = 10_000,
) -> pb.InferRequest:
    """An inference request for ``skill``'s version."""
    return pb.InferRequest(
        model=model,
        split=split,
        inputs=encode_protos(tensors, sorted(tensors), codec),
        skill=SKILL,
        version=skill.version,
        request_id=request_id,
        deadline_ms=deadline_ms,
    )


def outputs(response: pb.InferResponse) -> dict[str, np.ndarray]:
    """The response's tensors by name."""
    names = [p.name for p in response.outputs]
    return decode_protos(list(response.outputs), names)


def run_full(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The whole model run locally in ONNX Runtime."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


def head(skill: SplitSkill, cut: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What the device sends for ``cut``: its segments run locally, the cut's tensors kept."""
    info = skill.plan.cut(cut)
    env = dict(feeds)
    for segment in skill.plan.segments[: info.after + 1]:
        path = str(skill.folder / segment.file)
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        values = session.run(list(segment.outputs), {n: env[n] for n in segment.inputs})
        env.update(zip(segment.outputs, values, strict=True))
    return {n: np.asarray(env[n], np.float32) for n in info.tensors}
