"""Cost graphs of DAG-shaped models: candidate cuts priced from them, and the exact optimum.

A :class:`CostGraph` holds, per operator node, the device's and the hub's time,
and per tensor its size, producer and consumers. A partition puts a
**downward-closed** set of nodes on the device (every node the device runs has
all its inputs computed on the device too: the head runs first, then the tail,
with one transfer between). The tensors that cross are those made on the device
(or the raw input) and read by some hub node — so a cut inside a residual block
also sends the block's skip tensor. Results made on the hub come back down.

:func:`table_from_graph` turns candidate cuts (the tensor sets the converters
ship, or every prefix of a topological order) into a
:class:`~edge_agent.split.planner.CostTable` for :func:`~edge_agent.split.planner.plan`.
:func:`optimum` finds the best of *all* valid partitions for a link, as DADS
(Hu et al., INFOCOM 2019) does, with a minimum s-t cut: source = device,
sink = hub; node ``v`` gets ``s -> v`` (its hub time, paid when it lands on the
hub side) and ``v -> t`` (its device time); a tensor gets an edge from its
producer weighted by its transfer time (through an extra vertex when it has
several consumers, so it is paid once); infinite edges from each consumer back
to its producer forbid partitions that are not downward-closed. The RTT and the
hub's queue are paid once by any partition that uses the hub, which a cut
cannot express, so the min-cut's answer is compared with device-only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from edge_agent.split._maxflow import FlowNetwork
from edge_agent.split.planner import (
    CostTable,
    CutCost,
    Estimate,
    LinkEstimate,
    estimate,
)

__all__ = [
    "CostGraph",
    "Node",
    "Partition",
    "Tensor",
    "cut_cost",
    "head_for_cut",
    "is_downward_closed",
    "optimum",
    "table_from_graph",
]

HUB_ONLY = "hub-only"
DEVICE_ONLY = "device-only"


@dataclass(frozen=True)
class Node:
    """One operator, with its time on the device and on the hub (ms).

    Raises:
        ValueError: a time is negative or not finite.
    """

    name: str
    device_ms: float
    hub_ms: float

    def __post_init__(self) -> None:
        for label, value in (("device_ms", self.device_ms), ("hub_ms", self.hub_ms)):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"node {self.name}: {label} must be finite and >= 0")


@dataclass(frozen=True)
class Tensor:
    """One tensor: its size as sent, who makes it and who reads it.

    Attributes:
        name: The tensor's name.
        nbytes: Its size on the wire (after the cut's codec).
        producer: The node that makes it; ``None`` for a model input (on the device).
        consumers: The nodes that read it.
        output: Whether it is a model output (it must end up on the device).

    Raises:
        ValueError: the size is negative.
    """

    name: str
    nbytes: int
    producer: str | None
    consumers: tuple[str, ...] = ()
    output: bool = False

    def __post_init__(self) -> None:
        if self.nbytes < 0:
            raise ValueError(f"tensor {self.name}: nbytes must be >= 0")


@dataclass(frozen=True)
class CostGraph:
    """A model as a DAG of costed nodes joined by sized tensors.

    Raises:
        ValueError: no nodes, duplicate names, a tensor names an unknown node, a node
            reads its own output, or the graph has a cycle.
    """

    nodes: tuple[Node, ...]
    tensors: tuple[Tensor, ...]
    _index: dict[str, int] = field(init=False, repr=False, compare=False)
    _order: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _producer: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _consumers: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.nodes:
            raise ValueError("a cost graph needs at least one node")
        index = {node.name: i for i, node in enumerate(self.nodes)}
        if len(index) != len(self.nodes):
            raise ValueError("node names must be unique")
        if len({t.name for t in self.tensors}) != len(self.tensors):
            raise ValueError("tensor names must be unique")
        producer: list[int] = []
        consumers: list[tuple[int, ...]] = []
        for tensor in self.tensors:
            for name in (tensor.producer, *tensor.consumers):
                if name is not None and name not in index:
                    raise ValueError(f"tensor {tensor.name} names unknown node {name!r}")
            made_by = -1 if tensor.producer is None else index[tensor.producer]
            readers = tuple(sorted({index[c] for c in tensor.consumers}))
            if made_by in readers:
                raise ValueError(f"node {tensor.producer} reads its own tensor {tensor.name}")
            producer.append(made_by)
            consumers.append(readers)
        object.__setattr__(self, "_index", index)
        object.__setattr__(self, "_producer", tuple(producer))
        object.__setattr__(self, "_consumers", tuple(consumers))
        object.__setattr__(self, "_order", self._topological_order())

    def _topological_order(self) -> tuple[int, ...]:
        """Kahn's order, declaration order among ready nodes.

        Raises:
            ValueError: the graph has a cycle.
        """
        successors: list[set[int]] = [set() for _ in self.nodes]
        for made_by, readers in zip(self._producer, self._consumers, strict=True):
            if made_by >= 0:
                successors[made_by].update(readers)
        waiting = [0] * len(self.nodes)
        for following in successors:
            for node in following:
                waiting[node] += 1
        ready = [i for i, count in enumerate(waiting) if count == 0]
        order: list[int] = []
        while ready:
            ready.sort(reverse=True)
            node = ready.pop()
            order.append(node)
            for after in successors[node]:
                waiting[after] -= 1
                if waiting[after] == 0:
                    ready.append(after)
        if len(order) != len(self.nodes):
            raise ValueError("the cost graph has a cycle")
        return tuple(order)

    @property
    def order(self) -> tuple[str, ...]:
        """The node names in a topological order (inputs first)."""
        return tuple(self.nodes[i].name for i in self._order)

    def slowed_down(self, factor: float) -> CostGraph:
        """This graph on a device ``factor`` times slower (every device time multiplied).

        Raises:
            ValueError: ``factor`` is not positive and finite.
        """
        if not (math.isfinite(factor) and factor > 0):
            raise ValueError(f"factor must be finite and > 0, got {factor!r}")
        nodes = tuple(replace(n, device_ms=n.device_ms * factor) for n in self.nodes)
        return CostGraph(nodes, self.tensors)

    def _mask(self, device_nodes: Iterable[str]) -> list[bool]:
        """A per-node flag: on the device.

        Raises:
            ValueError: an unknown node name.
        """
        mask = [False] * len(self.nodes)
        for name in device_nodes:
            if name not in self._index:
                raise ValueError(f"unknown node {name!r}")
            mask[self._index[name]] = True
        return mask


@dataclass(frozen=True)
class Partition:
    """Where each node runs, its costs and its expected latency on a link.

    Attributes:
        device_nodes: The nodes on the device (the rest run on the hub).
        cost: The partition's link-independent costs.
        estimate: Its expected latency.
    """

    device_nodes: frozenset[str]
    cost: CutCost
    estimate: Estimate

    @property
    def total_ms(self) -> float:
        """The expected end-to-end latency."""
        return self.estimate.total_ms


def is_downward_closed(graph: CostGraph, device_nodes: Iterable[str]) -> bool:
    """Whether every node in ``device_nodes`` reads only tensors made on the device.

    Raises:
        ValueError: an unknown node name.
    """
    mask = graph._mask(device_nodes)
    return all(
        made_by < 0 or mask[made_by] or not any(mask[c] for c in readers)
        for made_by, readers in zip(graph._producer, graph._consumers, strict=True)
    )


def cut_cost(graph: CostGraph, device_nodes: Iterable[str], name: str = "") -> CutCost:
    """The costs of running ``device_nodes`` on the device and the rest on the hub.

    Raises:
        ValueError: an unknown node, or the set is not downward-closed.
    """
    nodes = frozenset(device_nodes)
    if not is_downward_closed(graph, nodes):
        raise ValueError("the device's nodes must include every node they depend on")
    mask = graph._mask(nodes)
    device_ms = sum(n.device_ms for n, here in zip(graph.nodes, mask, strict=True) if here)
    hub_ms = sum(n.hub_ms for n, here in zip(graph.nodes, mask, strict=True) if not here)
    up = down = 0
    for tensor, made_by, readers in zip(
        graph.tensors,
        graph._producer,
        graph._consumers,
        strict=True,
    ):
        on_device = made_by < 0 or mask[made_by]
        if on_device and any(not mask[c] for c in readers):
            up += tensor.nbytes
        if tensor.output and not on_device:
            down += tensor.nbytes
    return CutCost(name, device_ms, hub_ms, up, down, remote=not all(mask))


def head_for_cut(graph: CostGraph, tensors: Iterable[str]) -> frozenset[str]:
    """The nodes the device must run to compute ``tensors``: their producers and ancestors.

    Raises:
        ValueError: an unknown tensor name.
    """
    by_name = {t.name: i for i, t in enumerate(graph.tensors)}
    producer_of = graph._producer
    feeding: list[list[int]] = [[] for _ in graph.nodes]
    for made_by, readers in zip(producer_of, graph._consumers, strict=True):
        if made_by >= 0:
            for reader in readers:
                feeding[reader].append(made_by)
    stack: list[int] = []
    for name in tensors:
        if name not in by_name:
            raise ValueError(f"unknown tensor {name!r}")
        if producer_of[by_name[name]] >= 0:
            stack.append(producer_of[by_name[name]])
    seen: set[int] = set()
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            stack.extend(feeding[node])
    return frozenset(graph.nodes[i].name for i in seen)


def table_from_graph(
    graph: CostGraph, model: str, cuts: Sequence[Iterable[str]] | None = None
) -> CostTable:
    """Candidate cuts of ``graph`` priced as a :class:`CostTable`.

    Args:
        graph: The model's cost graph.
        model: The table's model name.
        cuts: Each candidate as the set of tensor names it cuts at (the device computes
            them and everything they need). ``None`` takes every prefix of a topological
            order instead (the Neurosurgeon candidates; on a chain, every cut).

    Returns:
        The table: hub-only first, then the candidates in the order given (duplicates
        dropped), device-only last.

    Raises:
        ValueError: an unknown tensor name.
    """
    if cuts is None:
        return _prefix_table(graph, model)
    everything = frozenset(n.name for n in graph.nodes)
    heads: list[tuple[str, frozenset[str]]] = [(HUB_ONLY, frozenset())]
    for tensors in cuts:
        names = sorted(set(tensors))
        head = head_for_cut(graph, names)
        if head != everything and all(head != seen for _, seen in heads):
            heads.append(("+".join(names), head))
    heads.append((DEVICE_ONLY, everything))
    return CostTable(model, tuple(cut_cost(graph, head, name) for name, head in heads))


def _prefix_table(graph: CostGraph, model: str) -> CostTable:
    """Every prefix of the topological order as a cut, priced incrementally in O(V + E)."""
    order = graph._order
    producer_of, readers_of = graph._producer, graph._consumers
    made: list[list[int]] = [[] for _ in graph.nodes]
    read: list[list[int]] = [[] for _ in graph.nodes]
    outside = [len(readers) for readers in readers_of]  # readers still on the hub
    up = down = 0
    for t, (tensor, made_by) in enumerate(zip(graph.tensors, producer_of, strict=True)):
        if made_by < 0:
            up += tensor.nbytes if outside[t] else 0
        else:
            made[made_by].append(t)
            down += tensor.nbytes if tensor.output else 0
        for reader in readers_of[t]:
            read[reader].append(t)
    hub_left = [0.0] * (len(order) + 1)
    for position in range(len(order) - 1, -1, -1):
        hub_left[position] = hub_left[position + 1] + graph.nodes[order[position]].hub_ms
    device_ms = 0.0
    cuts = [CutCost(HUB_ONLY, 0.0, hub_left[0], up, down, remote=bool(order))]
    for position, node in enumerate(order, start=1):
        device_ms += graph.nodes[node].device_ms
        for t in read[node]:
            outside[t] -= 1
            if outside[t] == 0:
                up -= graph.tensors[t].nbytes
        for t in made[node]:
            up += graph.tensors[t].nbytes if outside[t] else 0
            down -= graph.tensors[t].nbytes if graph.tensors[t].output else 0
        name = DEVICE_ONLY if position == len(order) else f"after {graph.nodes[node].name}"
        remote = position < len(order)
        cuts.append(CutCost(name, device_ms, hub_left[position], up, down, remote=remote))
    return CostTable(model, tuple(cuts))


def optimum(
    graph: CostGraph,
    link: LinkEstimate,
    queue_ms: float = 0.0,
    *,
    hub_reachable: bool = True,
) -> Partition:
    """The best of all downward-closed partitions of ``graph`` on ``link`` (exact).

    Args:
        graph: The model's cost graph.
        link: The link estimate.
        queue_ms: The hub's queueing delay.
        hub_reachable: ``False`` leaves only device-only.

    Returns:
        The cheapest partition; device-only on a tie.

    Raises:
        ValueError: ``queue_ms`` is negative or not finite.
    """
    everything = frozenset(n.name for n in graph.nodes)
    local = _priced(graph, everything, link, queue_ms, hub_reachable)
    if not hub_reachable:
        return local
    head = _min_cut_head(graph, link)
    if head == everything:
        return local
    split = _priced(graph, head, link, queue_ms, hub_reachable)
    return split if split.total_ms < local.total_ms else local


def _priced(
    graph: CostGraph,
    head: frozenset[str],
    link: LinkEstimate,
    queue_ms: float,
    hub_reachable: bool,
) -> Partition:
    """``head`` on the device, with its costs and estimate."""
    cost = cut_cost(graph, head)
    return Partition(head, cost, estimate(cost, link, queue_ms, hub_reachable=hub_reachable))


def _min_cut_head(graph: CostGraph, link: LinkEstimate) -> frozenset[str]:
    """The device side of a minimum cut of the DADS network (RTT and queue left out)."""
    source, sink, first = 0, 1, 2
    extra = sum(1 for readers in graph._consumers if len(readers) > 1)
    network = FlowNetwork(first + len(graph.nodes) + extra)
    for i, node in enumerate(graph.nodes):
        # Both sides pay at least the smaller time: leave it out (the partition is the same)
        # and half of these edges vanish, with the augmenting paths through them.
        common = min(node.hub_ms, node.device_ms)
        network.add_edge(source, first + i, node.hub_ms - common)
        network.add_edge(first + i, sink, node.device_ms - common)
    spare = first + len(graph.nodes)
    up_ms, down_ms = 1000.0 / link.bandwidth_bps, 1000.0 / link.down_bps
    for tensor, made_by, readers in zip(
        graph.tensors,
        graph._producer,
        graph._consumers,
        strict=True,
    ):
        tail = source if made_by < 0 else first + made_by
        if tensor.output and made_by >= 0:
            network.add_edge(source, tail, tensor.nbytes * down_ms)
        for reader in readers:
            if made_by >= 0:
                network.add_edge(first + reader, tail, math.inf)
        if len(readers) == 1:
            network.add_edge(tail, first + readers[0], tensor.nbytes * up_ms)
        elif len(readers) > 1:
            network.add_edge(tail, spare, tensor.nbytes * up_ms)
            for reader in readers:
                network.add_edge(spare, first + reader, math.inf)
            spare += 1
    _, side = network.min_cut(source, sink)
    return frozenset(
        graph.nodes[i - first].name for i in side if first <= i < first + len(graph.nodes)
    )
