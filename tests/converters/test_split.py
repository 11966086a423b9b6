"""Cut points, head/tail extraction and segments: head∘tail must equal the full model."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from converters.digits import DigitsData
from converters.errors import ConversionError
from converters.mobilenet import MobileNet
from converters.onnx_export import export_onnx
from converters.split import (
    Cut,
    GraphCuts,
    check_split,
    choose_candidates,
    enumerate_cuts,
    open_segments,
    profile_segments,
    run_segments,
    segments,
    split_at,
)
from converters.split_accuracy import Roundtrip, codec_costs
from skills import tensor_codec

ATOL = 1e-5


def _residual_model() -> onnx.ModelProto:
    """``y = (a + |−a|) * k`` with ``a = x @ W``; ``k`` is a Constant node placed first."""
    w = numpy_helper.from_array(np.eye(4, dtype=np.float32) * 2, "W")
    k = numpy_helper.from_array(np.full((1, 4), 3.0, np.float32), "kv")
    nodes = [
        helper.make_node("Constant", [], ["k"], value=k),
        helper.make_node("MatMul", ["x", "W"], ["a"]),
        helper.make_node("Neg", ["a"], ["b"]),
        helper.make_node("Abs", ["b"], ["c"]),
        helper.make_node("Add", ["a", "c"], ["d"]),
        helper.make_node("Mul", ["d", "k"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "residual",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        initializer=[w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def _input_skip_model() -> onnx.ModelProto:
    """``y = relu(x + (−x))``: the graph input itself crosses the first cut."""
    nodes = [
        helper.make_node("Neg", ["x"], ["b"]),
        helper.make_node("Add", ["x", "b"], ["c"]),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "skip",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def _random_inputs(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for info in model.graph.input:
        shape = [d.dim_value or 1 for d in info.type.tensor_type.shape.dim]
        feeds[info.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def _assert_every_cut_exact(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> int:
    graph_cuts = enumerate_cuts(model)
    assert graph_cuts.cuts
    full = open_segments(segments(model, []))
    expected = run_segments(full, segments(model, []), feeds)
    outputs = [o.name for o in model.graph.output]
    for cut in graph_cuts.cuts:
        head, tail = split_at(model, cut)
        env = run_segments(open_segments([head, tail]), [head, tail], feeds)
        for name in outputs:
            diff = float(np.max(np.abs(env[name] - expected[name])))
            assert diff <= ATOL, f"cut {cut.name}: {diff}"
    return len(graph_cuts.cuts)


def test_residual_block_has_two_tensors_inside_and_one_at_its_boundaries() -> None:
    graph_cuts = enumerate_cuts(_residual_model())

    assert [(c.position, c.tensors) for c in graph_cuts.cuts] == [
        (1, ("a",)),
        (2, ("a", "b")),
        (3, ("a", "c")),
        (4, ("d",)),
    ]
    assert [c.nbytes for c in graph_cuts.cuts] == [16, 32, 32, 16]
    assert [c.name for c in graph_cuts.cuts] == ["a", "a+b", "a+c", "d"]
    assert graph_cuts.cuts[1].shapes == ((1, 4), (1, 4))
    assert (graph_cuts.input_bytes, graph_cuts.output_bytes, graph_cuts.node_count) == (16, 16, 6)


def test_residual_splits_match_and_constants_go_with_their_user() -> None:
    model = _residual_model()
    feeds = _random_inputs(model)
    for cut in enumerate_cuts(model).cuts:
        head, tail = split_at(model, cut)
        assert check_split(model, head, tail, feeds) == 0.0
        assert set(tail.inputs) == set(cut.tensors)
    head, tail = split_at(model, enumerate_cuts(model).cuts[-1])
    assert "Constant" in {n.op_type for n in tail.model.graph.node}
    assert "Constant" not in {n.op_type for n in head.model.graph.node}


def test_graph_input_crossing_a_cut_is_passed_through_not_output_by_the_head() -> None:
    model = _input_skip_model()
    (cut,) = [c for c in enumerate_cuts(model).cuts if len(c.tensors) == 2]
    head, tail = split_at(model, cut)

    assert cut.tensors == ("b", "x")
    assert head.outputs == ("b",)
    assert set(tail.inputs) == {"b", "x"}
    assert check_split(model, head, tail, _random_inputs(model)) == 0.0


def test_segments_compose_to_the_full_model_at_every_split() -> None:
    model = _residual_model()
    feeds = _random_inputs(model, seed=1)
    cuts = list(enumerate_cuts(model).cuts)
    pieces = segments(model, cuts)
    sessions = open_segments(pieces)
    expected = run_segments(open_segments(segments(model, [])), segments(model, []), feeds)["y"]

    assert len(pieces) == len(cuts) + 1
    for i, cut in enumerate(cuts):
        device = run_segments(sessions, pieces, feeds, stop=i + 1)
        sent = {name: device[name] for name in cut.tensors}  # only the cut crosses
        hub = run_segments(sessions, pieces, sent, start=i + 1)
        np.testing.assert_array_equal(hub["y"], expected)


def test_cycle_and_misordered_cuts_are_refused() -> None:
    nodes = [helper.make_node("Neg", ["b"], ["a"]), helper.make_node("Neg", ["a"], ["b"])]
    graph = helper.make_graph(
        nodes,
        "cycle",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("b", TensorProto.FLOAT, [1])],
    )
    with pytest.raises(ConversionError, match="cycle"):
        enumerate_cuts(helper.make_model(graph))
    model = _residual_model()
    cuts = list(enumerate_cuts(model).cuts)
    with pytest.raises(ConversionError, match="increasing"):
        segments(model, [cuts[2], cuts[1]])


def _table(sizes: list[int], input_bytes: int) -> GraphCuts:
    cuts = tuple(Cut(f"c{i}", i, (f"t{i}",), ((n // 4,),), n) for i, n in enumerate(sizes))
    return GraphCuts(cuts, input_bytes, 4, len(sizes) + 1)


def test_choose_candidates_keeps_only_shrinking_cuts_evenly_spread() -> None:
    table = _table([200, 90, 120, 80, 80, 60, 300, 40, 30, 10], input_bytes=100)

    shrinking = ["c1", "c3", "c5", "c7", "c8", "c9"]
    assert [c.name for c in choose_candidates(table, 10)] == shrinking
    assert [c.name for c in choose_candidates(table, 3)] == ["c1", "c5", "c9"]
    assert [c.name for c in choose_candidates(table, 1)] == ["c9"]
    assert choose_candidates(table, 0) == []
    assert choose_candidates(_table([100, 200], input_bytes=100), 4) == []
    with pytest.raises(ConversionError):
        choose_candidates(table, -1)


def test_every_digits_cut_is_exact(digits_onnx: Path, digits: DigitsData) -> None:
    model = onnx.load(digits_onnx)
    assert _assert_every_cut_exact(model, {"image": digits.test.x[:8]}) == 10


@pytest.mark.slow
def test_every_mobilenet_cut_is_exact(tmp_path: Path, digits: DigitsData) -> None:
    torch.manual_seed(0)
    path = export_onnx(MobileNet().eval(), digits.test.x[:2], tmp_path / "mobilenet.onnx")
    model = onnx.load(path)

    assert _assert_every_cut_exact(model, {"image": digits.test.x[:4]}) >= 30


@pytest.mark.slow
def test_every_efficientnet_cut_is_exact(efficientnet_onnx: Path) -> None:
    model = onnx.load(efficientnet_onnx)
    feeds = {"image": np.random.default_rng(0).standard_normal((1, 3, 224, 224), np.float32)}
    started = time.perf_counter()

    count = _assert_every_cut_exact(model, feeds)

    elapsed = time.perf_counter() - started
    print(f"EfficientNet-Lite0: {count} cuts extracted and checked in {elapsed:.1f} s")
    cuts = enumerate_cuts(model).cuts
    assert count == len(cuts) >= 80
    assert max(len(c.tensors) for c in cuts) == 2  # inside a residual block


@pytest.mark.slow
def test_efficientnet_segments_at_candidates_compose_and_profile(efficientnet_onnx: Path) -> None:
    model = onnx.load(efficientnet_onnx)
    graph_cuts = enumerate_cuts(model)
    chosen = choose_candidates(graph_cuts, 5)
    feeds = {"image": np.random.default_rng(1).standard_normal((1, 3, 224, 224), np.float32)}
    pieces = segments(model, chosen)
    sessions = open_segments(pieces)
    expected = run_segments(sessions, pieces, feeds)["logits"]

    assert len(chosen) == 5
    assert all(c.nbytes < graph_cuts.input_bytes for c in chosen)
    assert [c.nbytes for c in chosen] == sorted((c.nbytes for c in chosen), reverse=True)
    for i, cut in enumerate(chosen):
        device = run_segments(sessions, pieces, feeds, stop=i + 1)
        hub = run_segments(sessions, pieces, {n: device[n] for n in cut.tensors}, start=i + 1)
        assert float(np.max(np.abs(hub["logits"] - expected))) <= ATOL
    times = profile_segments(sessions, pieces, feeds, repeats=3, warmup=1)
    assert len(times) == len(pieces)
    assert all(t > 0 for t in times)


def _roundtrip(codec: str) -> Roundtrip:
    def run(tensors: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], int]:
        data = tensor_codec.encode(tensors, codec)
        return tensor_codec.decode(data), len(data)

    return run


def test_codec_costs_on_digits(digits_onnx: Path, digits: DigitsData) -> None:
    model = onnx.load(digits_onnx)
    cuts = list(enumerate_cuts(model).cuts)
    codecs = {name: _roundtrip(name) for name in tensor_codec.CODECS}

    costs = codec_costs(model, digits.test.x, cuts, codecs, labels=digits.test.y)

    assert len(costs) == len(cuts) * 3
    by_codec = {name: [c for c in costs if c.codec == name] for name in tensor_codec.CODECS}
    assert all(c.accuracy_loss_pt == 0.0 and c.agreement == 1.0 for c in by_codec["fp32"])
    # the ratio includes each payload's header, which weighs most on the 64-value cuts
    assert all(0.5 < c.bytes_ratio < 0.6 for c in by_codec["fp16"])
    assert all(0.25 < c.bytes_ratio < 0.4 for c in by_codec["int8"])
    for c in by_codec["fp16"] + by_codec["int8"]:
        assert c.accuracy_loss_pt is not None and c.accuracy_loss_pt <= 1.0, c
        assert c.agreement >= 0.98, c
