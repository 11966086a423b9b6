"""``add_split``: segments and ``split.json`` that compose to the model, batchable if they can.

The chain (:mod:`tests.fakes.split_hub`) runs in milliseconds; the digits CNN
and EfficientNet-Lite0 (a DAG with residual adds, 224×224) are the real models
of issue 11, exported with torch once per session.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from cloud.hub import Hub
from cloud.split_build import BATCH_DIM, add_split
from converters.errors import ConversionError
from skills.errors import ManifestError
from skills.split_plan import SplitPlan
from tests.fakes.split_hub import chain_model
from tests.support.split_skill import (
    GROUP,
    SplitSkill,
    build_split_skill,
    head,
    outputs,
    publish,
    register,
    request,
    run_full,
)


def _run_all(folder: Path, plan: SplitPlan, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    env = dict(feeds)
    for segment in plan.segments:
        session = ort.InferenceSession(
            str(folder / segment.file), providers=["CPUExecutionProvider"]
        )
        feed = {n: env[n] for n in segment.inputs}
        env.update(zip(segment.outputs, session.run(list(segment.outputs), feed), strict=True))
    return {n: env[n] for n in plan.output_names}


def _batch_dims(folder: Path, plan: SplitPlan) -> list[bool]:
    """Per segment: whether every input and output has the symbolic batch dimension."""
    flags = []
    for segment in plan.segments:
        graph = onnx.load(str(folder / segment.file)).graph
        infos = [*graph.input, *graph.output]
        flags.append(all(i.type.tensor_type.shape.dim[0].dim_param == BATCH_DIM for i in infos))
    return flags


def test_the_chain_is_cut_into_batchable_segments(tmp_path: Path) -> None:
    net = tmp_path / "chain.onnx"
    net.write_bytes(chain_model())

    spec = add_split(tmp_path / "skill", "chain", net, k=6, codec="int8")

    assert (spec.model, spec.plan, spec.codec) == ("chain", "models/chain/split.json", "int8")
    folder = tmp_path / "skill" / "models" / "chain"
    plan = SplitPlan.load(folder / "split.json")
    assert plan.cuts[0].name == "input" and len(plan.middle_cuts) == len(plan.segments) - 1
    assert len(plan.hub_ms) == len(plan.segments) and all(t > 0 for t in plan.hub_ms)
    assert all(_batch_dims(folder, plan))
    x = np.random.default_rng(0).normal(size=(3, 16)).astype(np.float32)
    np.testing.assert_allclose(
        _run_all(folder, plan, {"x": x})["logits"], run_full(net, {"x": x})["logits"], rtol=1e-5
    )
    add_split(tmp_path / "skill", "chain", net, k=1, codec="fp32")  # replaces, all or nothing
    assert sorted(p.name for p in (tmp_path / "skill" / "models").iterdir()) == ["chain"]


def test_models_that_cannot_be_split_are_refused_and_nothing_is_written(tmp_path: Path) -> None:
    two_inputs = helper.make_model(
        helper.make_graph(
            [helper.make_node("Add", ["a", "b"], ["c"])],
            "two",
            [
                helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 4]),
                helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 4]),
            ],
            [helper.make_tensor_value_info("c", TensorProto.FLOAT, [1, 4])],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    path = tmp_path / "two.onnx"
    onnx.save_model(two_inputs, str(path))
    with pytest.raises(ConversionError, match="one float32 input"):
        add_split(tmp_path / "skill", "two", path)
    with pytest.raises(ConversionError, match="cannot load"):
        add_split(tmp_path / "skill", "two", tmp_path / "missing.onnx")
    with pytest.raises(ManifestError):
        add_split(tmp_path / "skill", "Bad Name", path)
    with pytest.raises(ManifestError):
        add_split(tmp_path / "skill", "two", path, codec="bf16")
    assert not (tmp_path / "skill" / "models").exists() or not any(
        (tmp_path / "skill" / "models").iterdir()
    )


def _served_matches_full(
    tmp_path: Path, skill: SplitSkill, x: np.ndarray, tolerance: float
) -> None:
    """Every cut, run as device head + hub tail through the core, gives the full model's output."""
    hub = Hub.init(tmp_path / "hub")
    hub.store.create_group(GROUP, "kind=camera")
    publish(hub, skill)
    (name,) = skill.plan.input_names
    (out,) = skill.plan.output_names
    want = run_full(skill.net, {name: x})[out]

    async def main() -> None:
        core = hub.core()
        await register(core, "cam-1")
        for cut in skill.plan.cuts:
            sent = head(skill, cut.name, {name: x})
            got = await core.session("cam-1").infer(
                request(skill, cut.name, sent, request_id=cut.name)
            )
            np.testing.assert_allclose(outputs(got)[out], want, rtol=tolerance, atol=tolerance)
        await core.close()

    try:
        asyncio.run(main())
    finally:
        hub.close()


@pytest.mark.slow
def test_the_digits_cnn_splits_and_every_cut_is_served(tmp_path: Path) -> None:
    from tests.support.skillkit import train_digits_onnx  # noqa: PLC0415 - torch

    trained = train_digits_onnx(tmp_path / "digits.onnx", epochs=1)
    skill = build_split_skill(tmp_path, trained.onnx_path)

    # Its 8x8 input is smaller than every activation, so no middle cut can beat hub-only
    # (choose_candidates keeps only shrinking cuts): the plan is the whole model.
    assert [c.name for c in skill.plan.cuts] == ["input"]
    assert all(_batch_dims(skill.folder, skill.plan))
    x = trained.data.test.x[:1].astype(np.float32)
    _served_matches_full(tmp_path, skill, x, 1e-4)


@pytest.fixture(scope="session")
def efficientnet_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """EfficientNet-Lite0 exported once per session (about 10 s)."""
    import torch  # noqa: PLC0415

    from converters.efficientnet import export_efficientnet_lite0  # noqa: PLC0415

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return export_efficientnet_lite0(tmp_path_factory.mktemp("efficientnet"))
    finally:
        torch.set_num_threads(threads)


@pytest.mark.slow
def test_efficientnet_lite0_splits_into_batchable_segments_served_from_the_bundle(
    tmp_path: Path, efficientnet_onnx: Path
) -> None:
    skill = build_split_skill(tmp_path, efficientnet_onnx, k=4, codec="fp16")

    assert len(skill.plan.middle_cuts) == 4
    assert all(c.nbytes < skill.plan.input_bytes for c in skill.plan.middle_cuts)
    assert any(len(c.tensors) > 1 for c in skill.plan.middle_cuts) or len(skill.plan.cuts) > 1
    assert all(_batch_dims(skill.folder, skill.plan))
    x = np.random.default_rng(1).normal(size=(1, 3, 224, 224)).astype(np.float32)
    _served_matches_full(tmp_path, skill, x, 1e-3)


def test_the_cli_writes_the_split_and_shows_the_cuts(tmp_path: Path) -> None:
    from typer.testing import CliRunner  # noqa: PLC0415

    from edgeskill.cli_model import app  # noqa: PLC0415

    net = tmp_path / "chain.onnx"
    net.write_bytes(chain_model())
    args = ["split", str(net), "--skill-dir", str(tmp_path / "skill"), "--model", "chain"]

    result = CliRunner().invoke(app, [*args, "--codec", "int8"])

    assert result.exit_code == 0, result.output
    assert "int8 bytes" in result.output and "[[split]]" in result.output
    assert 'plan = "models/chain/split.json"' in result.output
    assert SplitPlan.load(tmp_path / "skill" / "models" / "chain" / "split.json").model == "chain"
    bad = CliRunner().invoke(app, [*args, "--codec", "bf16"])
    assert bad.exit_code == 2
