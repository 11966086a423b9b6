"""The split planner: known optima on built cost tables and graphs, and its properties."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_agent.split.graph import (
    CostGraph,
    Node,
    Tensor,
    cut_cost,
    head_for_cut,
    is_downward_closed,
    optimum,
    table_from_graph,
)
from edge_agent.split.planner import (
    CostTable,
    CutCost,
    Hysteresis,
    LinkEstimate,
    estimate,
    plan,
    slow_down,
)

IMAGE = 224 * 224 * 3  # a raw uint8 frame
LOGITS = 4000
TABLE = CostTable(
    "net",
    (
        CutCost("hub-only", 0.0, 10.0, IMAGE, LOGITS),
        CutCost("pool2", 20.0, 5.0, 2000, LOGITS),
        CutCost("device-only", 100.0, 0.0, 0, 0),
    ),
)
GIGABIT = LinkEstimate(rtt_ms=1.0, bandwidth_bps=125e6)
TEN_MBIT = LinkEstimate(rtt_ms=20.0, bandwidth_bps=1.25e6)
ONE_MBIT = LinkEstimate(rtt_ms=100.0, bandwidth_bps=125e3)


def test_hub_only_wins_on_a_fast_link_with_a_slow_device() -> None:
    assert plan(TABLE, GIGABIT).cut == 0


def test_device_only_wins_on_a_slow_link() -> None:
    decision = plan(TABLE, ONE_MBIT)
    assert decision.cut == 2
    assert decision.expected_ms == 100.0
    assert decision.estimates[2].transfer_ms == 0.0


def test_a_middle_cut_wins_where_its_activation_is_small() -> None:
    decision = plan(TABLE, TEN_MBIT)
    assert decision.cut == 1
    # 20 ms head + 20 ms RTT + (2000 + 4000) B at 1.25 MB/s + 5 ms tail
    assert decision.expected_ms == pytest.approx(20 + 20 + 4.8 + 5)


def test_queueing_at_the_hub_pushes_work_back_to_the_device() -> None:
    assert plan(TABLE, GIGABIT, queue_ms=0.0).cut == 0
    assert plan(TABLE, GIGABIT, queue_ms=200.0).cut == 2


def test_an_unreachable_hub_leaves_device_only_even_against_hysteresis() -> None:
    decision = plan(TABLE, GIGABIT, current=0, hub_reachable=False)
    assert decision.cut == 2
    assert decision.switched
    assert math.isinf(decision.estimates[0].total_ms)


def test_a_slower_device_moves_work_to_the_hub() -> None:
    assert plan(TABLE, TEN_MBIT).cut == 1
    assert plan(slow_down(TABLE, 16.0), TEN_MBIT).cut == 0
    assert slow_down(TABLE, 4.0).cuts[1].device_ms == 80.0


def test_hysteresis_keeps_the_cut_for_a_small_gain_but_not_for_a_real_change() -> None:
    near = LinkEstimate(rtt_ms=20.0, bandwidth_bps=1.0e6)  # pool2 still best, by little
    assert plan(TABLE, near, current=2).cut == 1  # 100 ms -> ~51 ms: a real gain
    close = CostTable("net", (CutCost("a", 50.0, 0.0, 1, 0), CutCost("b", 52.0, 0.0, 0, 0)))
    decision = plan(close, LinkEstimate(0.0, 1e6), current=1)
    assert decision.best == 0
    assert decision.cut == 1  # 2 ms saved of 52: under 10 %
    assert not decision.switched


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="current cut"):
        plan(TABLE, GIGABIT, current=3)
    with pytest.raises(ValueError, match="device-only"):
        CostTable("x", (CutCost("hub-only", 0.0, 1.0, 10, 1),))
    with pytest.raises(ValueError, match="bandwidth_bps"):
        LinkEstimate(1.0, 0.0)
    with pytest.raises(ValueError, match="queue_ms"):
        plan(TABLE, GIGABIT, queue_ms=-1.0)
    with pytest.raises(ValueError, match="device_ms"):
        CutCost("x", math.nan, 0.0, 0, 0)


# A residual block: stem -> conv1 (expands) -> conv2 (projects) -> add(conv2, stem) -> head.
# The skip tensor `a` is alive across the whole block.
SKIP_GRAPH = CostGraph(
    nodes=(
        Node("stem", 5.0, 0.5),
        Node("conv1", 5.0, 0.5),
        Node("conv2", 5.0, 0.5),
        Node("add", 0.1, 0.01),
        Node("head", 50.0, 1.0),
    ),
    tensors=(
        Tensor("x", IMAGE, None, ("stem",)),
        Tensor("a", 16000, "stem", ("conv1", "add")),
        Tensor("b", 64000, "conv1", ("conv2",)),
        Tensor("c", 2000, "conv2", ("add",)),
        Tensor("d", 2000, "add", ("head",)),
        Tensor("y", 40, "head", (), output=True),
    ),
)
TEN_MBIT_FAST_RTT = LinkEstimate(rtt_ms=10.0, bandwidth_bps=1.25e6)


def test_a_cut_inside_a_residual_block_also_sends_the_skip_tensor() -> None:
    inside = cut_cost(SKIP_GRAPH, head_for_cut(SKIP_GRAPH, ["c"]))
    assert inside.bytes_up == 2000 + 16000
    after = cut_cost(SKIP_GRAPH, head_for_cut(SKIP_GRAPH, ["d"]))
    assert after.bytes_up == 2000
    assert after.bytes_down == 40


def test_the_planner_cuts_after_the_block_not_inside_it() -> None:
    table = table_from_graph(SKIP_GRAPH, "resnet", [["a"], ["b"], ["c"], ["d"]])
    assert [c.name for c in table.cuts] == ["hub-only", "a", "b", "c", "d", "device-only"]
    decision = plan(table, TEN_MBIT_FAST_RTT)
    assert table.cuts[decision.cut].name == "d"
    # Had the skip tensor been forgotten, the cut inside the block would have looked best.
    inside = table.cuts[table.index("c")]
    naive = estimate(
        CutCost("c-naive", inside.device_ms, inside.hub_ms, 2000, 40), TEN_MBIT_FAST_RTT
    )
    assert naive.total_ms < decision.expected_ms
    best = optimum(SKIP_GRAPH, TEN_MBIT_FAST_RTT)
    assert best.device_nodes == {"stem", "conv1", "conv2", "add"}
    assert best.total_ms == pytest.approx(decision.expected_ms)


def test_graph_errors() -> None:
    with pytest.raises(ValueError, match="cycle"):
        CostGraph(
            (Node("p", 1, 1), Node("q", 1, 1)),
            (Tensor("t", 1, "p", ("q",)), Tensor("u", 1, "q", ("p",))),
        )
    with pytest.raises(ValueError, match="unknown node"):
        CostGraph((Node("p", 1, 1),), (Tensor("t", 1, "p", ("zz",)),))
    with pytest.raises(ValueError, match="depend on"):
        cut_cost(SKIP_GRAPH, {"conv1"})
    with pytest.raises(ValueError, match="unknown tensor"):
        head_for_cut(SKIP_GRAPH, ["nope"])


# --- properties -----------------------------------------------------------------------

times = st.floats(0.0, 200.0, allow_nan=False)
sizes = st.integers(0, 2_000_000)
links = st.builds(
    LinkEstimate,
    rtt_ms=st.floats(0.0, 300.0),
    bandwidth_bps=st.floats(1e3, 1e9),
    down_bandwidth_bps=st.none() | st.floats(1e3, 1e9),
)
queues = st.floats(0.0, 100.0)


@st.composite
def tables(draw: st.DrawFn) -> CostTable:
    middle = draw(
        st.lists(st.builds(CutCost, st.just("m"), times, times, sizes, sizes), max_size=12)
    )
    first = CutCost("hub-only", 0.0, draw(times), draw(sizes), draw(sizes))
    last = CutCost("device-only", draw(times), 0.0, 0, 0)
    return CostTable("model", (first, *middle, last))


@settings(max_examples=300)
@given(tables(), links, queues)
def test_without_a_current_cut_the_cheapest_wins(
    table: CostTable, link: LinkEstimate, queue: float
) -> None:
    decision = plan(table, link, queue)
    totals = [estimate(cut, link, queue).total_ms for cut in table.cuts]
    assert decision.cut == decision.best
    assert decision.expected_ms == min(totals)
    assert not decision.switched


@settings(max_examples=300)
@given(tables(), links, queues, st.data(), st.floats(0.0, 0.5), st.floats(0.0, 20.0))
def test_hysteresis_never_switches_for_a_gain_below_its_margins(
    table: CostTable,
    link: LinkEstimate,
    queue: float,
    data: st.DataObject,
    relative: float,
    absolute: float,
) -> None:
    current = data.draw(st.integers(0, len(table.cuts) - 1))
    margins = Hysteresis(relative, absolute)
    decision = plan(table, link, queue, current=current, hysteresis=margins)
    held = decision.estimates[current].total_ms
    gain = held - decision.best_ms
    if decision.switched:
        assert decision.cut == decision.best
        assert gain >= absolute
        assert gain >= relative * held
    else:
        assert decision.cut == current
        if decision.best != current:
            assert gain < absolute or gain < relative * held


@st.composite
def dags(draw: st.DrawFn, max_nodes: int = 8) -> CostGraph:
    count = draw(st.integers(1, max_nodes))
    names = [f"n{i}" for i in range(count)]
    nodes = tuple(Node(name, draw(times), draw(times)) for name in names)
    readers: dict[int, set[int]] = {i: set() for i in range(-1, count)}
    for i in range(count):
        feeds = draw(st.sets(st.integers(-1, i - 1), min_size=1, max_size=3))
        for source in feeds:
            readers[source].add(i)
    sinks = [i for i in range(count) if not readers[i]]
    outputs = set(sinks) | draw(st.sets(st.integers(0, count - 1), max_size=2))
    tensors = tuple(
        Tensor(
            f"t{source}",
            draw(sizes),
            None if source < 0 else names[source],
            tuple(names[r] for r in sorted(readers[source])),
            output=source in outputs,
        )
        for source in range(-1, count)
    )
    return CostGraph(nodes, tensors)


def _brute_force(graph: CostGraph, link: LinkEstimate, queue: float) -> float:
    names = [n.name for n in graph.nodes]
    best = math.inf
    for mask in itertools.product((False, True), repeat=len(names)):
        head = {name for name, here in zip(names, mask, strict=True) if here}
        if is_downward_closed(graph, head):
            best = min(best, estimate(cut_cost(graph, head), link, queue).total_ms)
    return best


@settings(max_examples=300, deadline=None)
@given(dags(), links, queues)
def test_min_cut_optimum_equals_brute_force_and_beats_every_candidate(
    graph: CostGraph, link: LinkEstimate, queue: float
) -> None:
    best = optimum(graph, link, queue)
    assert is_downward_closed(graph, best.device_nodes)
    exact = _brute_force(graph, link, queue)
    assert best.total_ms == pytest.approx(exact, rel=1e-9, abs=1e-6)
    candidates = plan(table_from_graph(graph, "g"), link, queue)
    assert best.total_ms <= candidates.best_ms + 1e-6


@settings(max_examples=200, deadline=None)
@given(dags(max_nodes=12))
def test_prefix_table_matches_pricing_each_prefix(graph: CostGraph) -> None:
    table = table_from_graph(graph, "g")
    order = graph.order
    assert len(table.cuts) == len(order) + 1
    for length, cut in enumerate(table.cuts):
        direct = cut_cost(graph, order[:length], cut.name)
        assert cut.bytes_up == direct.bytes_up
        assert cut.bytes_down == direct.bytes_down
        assert cut.device_ms == pytest.approx(direct.device_ms)
        assert cut.hub_ms == pytest.approx(direct.hub_ms)
    assert table.cuts[-1].local
