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
    assert "sent bytes" in result.output and "[[split]]" in result.output
    assert 'plan = "models/chain/split.json"' in result.output
    assert SplitPlan.load(tmp_path / "skill" / "models" / "chain" / "split.json").model == "chain"
    bad = CliRunner().invoke(app, [*args, "--codec", "bf16"])
    assert bad.exit_code == 2


def _outlier_model() -> bytes:
    """``x[4] → h = x[:3] → m = h[1:] → relu``: x and h carry a 10,000 beside two small logits.

    An int8 scale stretched by the outlier rounds the two logits together (the
    top-1 flips for about half the inputs); fp16 keeps them apart. ``m`` has no
    outlier, so int8 is safe there.
    """
    pick_h = np.eye(4, 3, dtype=np.float32)
    pick_m = np.eye(3, 2, k=-1, dtype=np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "ph"], ["h"]),
        helper.make_node("MatMul", ["h", "pm"], ["m"]),
        helper.make_node("Relu", ["m"], ["probs"]),
    ]
    graph = helper.make_graph(
        nodes,
        "outlier",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", 2])],
        [onnx.numpy_helper.from_array(pick_h, "ph"), onnx.numpy_helper.from_array(pick_m, "pm")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model.SerializeToString()


def _outlier_samples(count: int) -> tuple[np.ndarray, np.ndarray]:
    """Inputs whose two logits differ by at least 0.05, and their classes."""
    rng = np.random.default_rng(3)
    u = rng.uniform(0.1, 0.9, count)
    gap = rng.uniform(0.05, 0.1, count) * rng.choice([-1.0, 1.0], count)
    x = np.stack([np.full(count, 10_000.0), u, u + gap, np.zeros(count)], axis=1)
    return x.astype(np.float32), (gap > 0).astype(np.int64)


def test_codec_auto_gives_each_cut_the_smallest_codec_within_the_budget(tmp_path: Path) -> None:
    net = tmp_path / "outlier.onnx"
    net.write_bytes(_outlier_model())
    x, y = _outlier_samples(200)

    spec = add_split(tmp_path / "skill", "net", net, codec="auto", samples=x, labels=y)

    assert spec.codec == "auto"
    plan = SplitPlan.load(tmp_path / "skill" / spec.plan)
    cuts = {c.name: c for c in plan.cuts}
    assert [c.after for c in plan.cuts] == [-1, 0, 1]
    losses = {name: dict(c.loss_pt) for name, c in cuts.items()}
    # Where the outlier crosses, int8 costs tens of points and fp16 nothing.
    for name in ("input", plan.cuts[1].name):
        assert losses[name]["int8"] > 20.0 and losses[name]["fp16"] == 0.0
        assert cuts[name].codec == "fp16"
    last = plan.cuts[2]
    assert losses[last.name] == {"fp16": 0.0, "int8": 0.0} and last.codec == "int8"

    # A budget wide enough for the outlier's loss lets int8 through everywhere.
    add_split(tmp_path / "wide", "net", net, codec="auto", samples=x, labels=y, max_loss_pt=100.0)
    assert {c.codec for c in SplitPlan.load(tmp_path / "wide" / spec.plan).cuts} == {"int8"}
    # Samples with a fixed codec: the costs are kept, no codec is chosen.
    add_split(tmp_path / "fixed", "net", net, codec="fp16", samples=x)
    fixed = SplitPlan.load(tmp_path / "fixed" / spec.plan)
    assert all(c.codec is None and dict(c.loss_pt)["int8"] > 20.0 for c in fixed.cuts[:2])


def test_codec_auto_without_usable_samples_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    net = tmp_path / "outlier.onnx"
    net.write_bytes(_outlier_model())
    x, y = _outlier_samples(8)

    with pytest.raises(ConversionError, match="pass samples"):
        add_split(tmp_path / "skill", "net", net, codec="auto")
    with pytest.raises(ConversionError, match="shape"):
        add_split(tmp_path / "skill", "net", net, codec="auto", samples=x[:, :3])
    with pytest.raises(ConversionError, match="labels"):
        add_split(tmp_path / "skill", "net", net, codec="auto", samples=x, labels=y[:3])
    with pytest.raises(ConversionError, match="max_loss_pt"):
        add_split(tmp_path / "skill", "net", net, codec="auto", samples=x, max_loss_pt=-1.0)
    assert not (tmp_path / "skill" / "models").exists() or not any(
        (tmp_path / "skill" / "models").iterdir()
    )


def test_the_cli_chooses_codecs_from_samples_and_shows_them(tmp_path: Path) -> None:
    from typer.testing import CliRunner  # noqa: PLC0415

    from edgeskill.cli_model import app  # noqa: PLC0415

    net = tmp_path / "outlier.onnx"
    net.write_bytes(_outlier_model())
    x, y = _outlier_samples(64)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    args = ["split", str(net), "--skill-dir", str(tmp_path / "skill"), "--model", "net"]

    given = ["--samples", str(tmp_path / "x.npy"), "--labels", str(tmp_path / "y.npy")]
    result = CliRunner().invoke(app, [*args, "--codec", "auto", *given])

    assert result.exit_code == 0, result.output
    assert 'codec = "auto"' in result.output and "int8" in result.output
    plan = SplitPlan.load(tmp_path / "skill" / "models" / "net" / "split.json")
    assert [c.codec for c in plan.cuts] == ["fp16", "fp16", "int8"]
    (tmp_path / "bad.npy").write_bytes(b"not an array")
    bad_file = ["--samples", str(tmp_path / "bad.npy")]
    bad = CliRunner().invoke(app, [*args, "--codec", "auto", *bad_file])
    assert bad.exit_code == 2 and "not a readable .npy array" in bad.output
    missing = CliRunner().invoke(app, [*args, "--codec", "auto"])
    assert missing.exit_code == 2 and "pass samples" in missing.output
