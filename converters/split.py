"""Cut an ONNX graph between device and hub: cut points, head/tail extraction, segments.

A **cut** is the set of tensors live between two consecutive nodes of a
topological order: produced by a node at or before the cut (or a graph input)
and consumed after it (or a graph output). Initializers and ``Constant`` outputs
never cross: both sides carry their own copy. In a chain a cut is one tensor;
inside a residual block it is two (the skip and the branch), which is the
separating set a min-cut over the DAG would find for graphs made of
blocks (DADS).

**Segments** partition a model at an ordered list of cuts, so one bundle can
ship one model and still allow several splits: the device runs segments
``0..i`` and sends cut ``i``'s tensors, the hub runs ``i+1..k``. Running them
needs only ONNX Runtime and a dict: each segment reads its inputs by name from
every tensor fed or computed so far and adds its outputs to it (a skip tensor
that crosses several cuts is produced once and stays in the dict).
"""

from __future__ import annotations

import copy
import heapq
import statistics
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import onnx

from converters.errors import ConversionError

if TYPE_CHECKING:
    import onnxruntime as ort

__all__ = [
    "Cut",
    "GraphCuts",
    "Segment",
    "check_split",
    "choose_candidates",
    "enumerate_cuts",
    "open_segments",
    "profile_segments",
    "run_segments",
    "segments",
    "split_at",
]

_MAX_NAME_CHARS = 64  # a cut's name travels in InferRequest.split


@dataclass(frozen=True)
class Cut:
    """One place the model can be split.

    Attributes:
        name: Stable name: the tensor names joined with ``+`` (or ``cut<position>``
            when that is too long).
        position: Index, in the topological order, of the last node before the cut.
        tensors: Names of the tensors that cross, sorted.
        shapes: Their shapes at the model's static input shape (symbolic dims as 1).
        nbytes: Bytes that cross uncompressed, at each tensor's own dtype.
    """

    name: str
    position: int
    tensors: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    nbytes: int


@dataclass(frozen=True)
class GraphCuts:
    """Every non-trivial cut of a model, in order, with the sizes at both ends.

    Attributes:
        cuts: The cuts, by increasing ``position``.
        input_bytes: Bytes of the graph inputs (what hub-only inference sends).
        output_bytes: Bytes of the graph outputs (what device-only inference keeps).
        node_count: Nodes in the graph.
    """

    cuts: tuple[Cut, ...]
    input_bytes: int
    output_bytes: int
    node_count: int


@dataclass(frozen=True)
class Segment:
    """A consecutive piece of a model.

    Attributes:
        model: A self-contained ONNX model.
        inputs: Tensors it reads (graph inputs of the piece).
        outputs: Tensors it adds (graph outputs of the piece).
    """

    model: onnx.ModelProto
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def _subgraph_reads(graph: onnx.GraphProto) -> Iterator[str]:
    # names a control-flow body reads from the enclosing scope
    produced = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    for node in graph.node:
        yield from (name for name in _reads(node) if name not in produced)
        produced.update(node.output)


def _reads(node: onnx.NodeProto) -> Iterator[str]:
    yield from (name for name in node.input if name)
    for attr in node.attribute:
        for graph in [attr.g] if attr.HasField("g") else attr.graphs:
            yield from _subgraph_reads(graph)


def _topological(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    # Kahn's algorithm, ties broken by file order, so a sorted graph keeps its order.
    producer = {out: i for i, node in enumerate(graph.node) for out in node.output if out}
    waits = [{producer[n] for n in _reads(node) if n in producer} for node in graph.node]
    users: list[list[int]] = [[] for _ in graph.node]
    for i, deps in enumerate(waits):
        for dep in deps:
            users[dep].append(i)
    ready = [i for i, deps in enumerate(waits) if not deps]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for user in users[i]:
            waits[user].discard(i)
            if not waits[user]:
                heapq.heappush(ready, user)
    if len(order) != len(graph.node):
        raise ConversionError("the graph has a cycle or reads a tensor nothing produces")
    return [graph.node[i] for i in order]


def _static_shapes(model: onnx.ModelProto) -> dict[str, tuple[tuple[int, ...], int]]:
    """``name -> (shape, itemsize)`` with every symbolic input dim set to 1."""
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    del fixed.graph.value_info[:]
    for info in [*fixed.graph.input, *fixed.graph.output]:
        for dim in info.type.tensor_type.shape.dim:
            if not dim.HasField("dim_value"):
                dim.dim_value = 1
    try:
        inferred = onnx.shape_inference.infer_shapes(fixed, data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as exc:
        raise ConversionError(f"shape inference failed: {exc}") from exc
    graph = inferred.graph
    shapes = {}
    for info in [*graph.input, *graph.value_info, *graph.output]:
        tensor = info.type.tensor_type
        dims = tensor.shape.dim
        if (
            tensor.elem_type
            and tensor.HasField("shape")
            and all(d.HasField("dim_value") for d in dims)
        ):
            itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).itemsize
            shapes[info.name] = (tuple(int(d.dim_value) for d in dims), itemsize)
    return shapes


def _nbytes(names: Sequence[str], shapes: Mapping[str, tuple[tuple[int, ...], int]]) -> int:
    total = 0
    for name in names:
        if name not in shapes:
            raise ConversionError(f"no static shape for tensor {name!r} (shape inference gave up)")
        shape, itemsize = shapes[name]
        total += int(np.prod(shape, dtype=np.int64)) * itemsize
    return total


def _live_sets(graph: onnx.GraphProto) -> list[tuple[int, tuple[str, ...]]]:
    nodes = _topological(graph)
    fixed = {t.name for t in graph.initializer}
    fixed |= {out for node in nodes if node.op_type == "Constant" for out in node.output}
    born = {i.name: -1 for i in graph.input if i.name not in fixed}
    last_use: dict[str, int] = {}
    for index, node in enumerate(nodes):
        born.update({out: index for out in node.output if out and out not in fixed})
        last_use.update(dict.fromkeys(_reads(node), index))
    last_use.update({o.name: len(nodes) for o in graph.output})
    sets = []
    for index in range(len(nodes)):
        live = sorted(n for n, b in born.items() if b <= index < last_use.get(n, -1))
        sets.append((index, tuple(live)))
    return sets


def _cut_name(position: int, tensors: Sequence[str]) -> str:
    joined = "+".join(tensors)
    return joined if len(joined) <= _MAX_NAME_CHARS else f"cut{position}"


def enumerate_cuts(model: onnx.ModelProto) -> GraphCuts:
    """The valid cut points of a model, in topological order.

    After each node the set of live tensors is a cut; equal sets are kept once
    (the first), and the sets equal to the graph inputs or outputs are left out
    (device-only and hub-only are the planner's own cases).

    Args:
        model: An ONNX model with static shapes apart from symbolic dims
            (taken as 1, normally the batch).

    Returns:
        The cuts and the input/output sizes.

    Raises:
        ConversionError: The graph is cyclic or a crossing tensor has no static shape.
    """
    graph = model.graph
    shapes = _static_shapes(model)
    inputs = tuple(sorted(i.name for i in graph.input))
    outputs = tuple(sorted(o.name for o in graph.output))
    seen = {inputs, outputs}
    cuts = []
    for position, live in _live_sets(graph):
        if not live or live in seen:
            continue
        seen.add(live)
        cut_shapes = tuple(shapes[n][0] if n in shapes else () for n in live)
        nbytes = _nbytes(live, shapes)
        cuts.append(Cut(_cut_name(position, live), position, live, cut_shapes, nbytes))
    return GraphCuts(
        cuts=tuple(cuts),
        input_bytes=_nbytes(inputs, shapes),
        output_bytes=_nbytes(outputs, shapes),
        node_count=len(graph.node),
    )


def _value_infos(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as exc:
        raise ConversionError(f"shape inference failed: {exc}") from exc
    graph = inferred.graph
    return {v.name: v for v in [*graph.value_info, *graph.input, *graph.output]}


def _extract(
    model: onnx.ModelProto,
    nodes: Sequence[onnx.NodeProto],
    available: Sequence[str],
    wanted: Sequence[str],
    infos: Mapping[str, onnx.ValueInfoProto],
) -> Segment:
    producer = {out: node for node in nodes for out in node.output if out}
    have = set(available)
    initializers = {t.name: t for t in model.graph.initializer}
    keep: set[int] = set()
    reads: list[str] = []
    stack = [name for name in wanted if name not in have]
    while stack:
        name = stack.pop()
        if name in have or name in initializers:
            continue
        if name not in producer:
            raise ConversionError(f"tensor {name!r} is not computable from the cut")
        node = producer[name]
        if id(node) not in keep:
            keep.add(id(node))
            stack.extend(_reads(node))
    kept = [node for node in nodes if id(node) in keep]
    made = {out for node in kept for out in node.output}
    for node in kept:
        reads.extend(n for n in _reads(node) if n in have and n not in made and n not in reads)
    outputs = [name for name in wanted if name not in have]
    graph = onnx.helper.make_graph(
        kept,
        model.graph.name,
        [_info(name, infos) for name in reads],
        [_info(name, infos) for name in outputs],
        initializer=[
            initializers[n]
            for n in dict.fromkeys(r for node in kept for r in _reads(node))
            if n in initializers
        ],
    )
    piece = onnx.helper.make_model(
        graph, opset_imports=model.opset_import, ir_version=model.ir_version
    )
    piece.functions.extend(model.functions)
    try:
        onnx.checker.check_model(piece)
    except onnx.checker.ValidationError as exc:
        raise ConversionError(f"extracted segment is not a valid model: {exc}") from exc
    return Segment(piece, tuple(reads), tuple(outputs))


def _info(name: str, infos: Mapping[str, onnx.ValueInfoProto]) -> onnx.ValueInfoProto:
    if name not in infos:
        raise ConversionError(f"no type known for tensor {name!r}")
    return copy.deepcopy(infos[name])


def segments(model: onnx.ModelProto, cuts: Sequence[Cut]) -> list[Segment]:
    """Partition a model at cuts, in order: ``len(cuts) + 1`` segments.

    Running segments ``0..i`` on the device and ``i+1..`` on the hub is the split
    at ``cuts[i]`` (see the module docstring for how tensors are passed).

    Args:
        model: The full model.
        cuts: Cuts of this model (from :func:`enumerate_cuts`), by increasing position.

    Returns:
        The segments; each is checked with ``onnx.checker``.

    Raises:
        ConversionError: The cuts are out of order or do not separate the graph.
    """
    positions = [cut.position for cut in cuts]
    if positions != sorted(set(positions)):
        raise ConversionError(f"cuts must have strictly increasing positions, got {positions}")
    nodes = _topological(model.graph)
    infos = _value_infos(model)
    boundaries = [
        *(cut.tensors for cut in cuts),
        tuple(o.name for o in model.graph.output),
    ]
    available = [i.name for i in model.graph.input]
    pieces = []
    for cut_index, wanted in enumerate(boundaries):
        # Nodes before the previous cut are visible too, but the walk back from
        # ``wanted`` stops at computed tensors, so it only re-enters them for
        # input-free nodes (``Constant``), which each segment then carries.
        stop = positions[cut_index] + 1 if cut_index < len(cuts) else len(nodes)
        pieces.append(_extract(model, nodes[:stop], available, wanted, infos))
        available = [*available, *pieces[-1].outputs]
    return pieces


def split_at(model: onnx.ModelProto, cut: Cut) -> tuple[Segment, Segment]:
    """The head (inputs → cut tensors) and tail (cut tensors → outputs) at one cut.

    A cut tensor that is a graph input is not an output of the head: the device
    sends it as it was fed.

    Raises:
        ConversionError: The cut does not separate the graph.
    """
    head, tail = segments(model, [cut])
    return head, tail


def open_segments(pieces: Sequence[Segment]) -> list[ort.InferenceSession]:
    """ONNX Runtime CPU sessions for segments.

    Raises:
        ConversionError: ONNX Runtime rejects a segment.
    """
    import onnxruntime as ort  # noqa: PLC0415

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sessions = []
    for index, piece in enumerate(pieces):
        try:
            data = piece.model.SerializeToString()
            sessions.append(
                ort.InferenceSession(data, sess_options=options, providers=["CPUExecutionProvider"])
            )
        except Exception as exc:  # onnxruntime raises its own untyped errors
            raise ConversionError(f"ONNX Runtime cannot load segment {index}: {exc}") from exc
    return sessions


def run_segments(
    sessions: Sequence[ort.InferenceSession],
    pieces: Sequence[Segment],
    tensors: Mapping[str, np.ndarray],
    start: int = 0,
    stop: int | None = None,
) -> dict[str, np.ndarray]:
    """Run segments ``start..stop-1`` and return every tensor fed or computed.

    Raises:
        ConversionError: A needed tensor is missing or inference failed.
    """
    env = dict(tensors)
    for index in range(start, len(pieces) if stop is None else stop):
        piece = pieces[index]
        missing = [name for name in piece.inputs if name not in env]
        if missing:
            raise ConversionError(f"segment {index} needs tensors {missing}")
        try:
            values = sessions[index].run(list(piece.outputs), {n: env[n] for n in piece.inputs})
        except Exception as exc:
            raise ConversionError(f"segment {index} failed in ONNX Runtime: {exc}") from exc
        env.update(zip(piece.outputs, (np.asarray(v) for v in values), strict=True))
    return env


def check_split(
    model: onnx.ModelProto, head: Segment, tail: Segment, inputs: Mapping[str, np.ndarray]
) -> float:
    """Largest absolute difference between head∘tail and the full model, in ONNX Runtime.

    Raises:
        ConversionError: A model does not load or run.
    """
    full, *pair = open_segments([Segment(model, (), ()), head, tail])
    expected = full.run(None, dict(inputs))
    env = run_segments(pair, [head, tail], inputs)
    diff = 0.0
    for info, want in zip(model.graph.output, expected, strict=True):
        got = env[info.name].astype(np.float64)
        diff = max(diff, float(np.max(np.abs(got - np.asarray(want))))) if got.size else diff
    return diff


def choose_candidates(graph_cuts: GraphCuts, k: int) -> list[Cut]:
    """Up to ``k`` cuts worth shipping, evenly spread over the graph.

    Only a cut that sends fewer bytes than the input and than every earlier cut
    can beat all earlier cuts (Neurosurgeon): a later cut with at least as many
    bytes costs at least as much device time and transfer and saves only hub
    time, which loses whenever the hub is not slower than the device per node.
    Of those, ``k`` are picked at evenly spaced ranks, always keeping the first
    and the smallest (last).

    Raises:
        ConversionError: ``k`` is negative.
    """
    if k < 0:
        raise ConversionError(f"k must be >= 0, got {k}")
    shrinking: list[Cut] = []
    smallest = graph_cuts.input_bytes
    for cut in graph_cuts.cuts:
        if cut.nbytes < smallest:
            shrinking.append(cut)
            smallest = cut.nbytes
    if len(shrinking) <= k:
        return shrinking
    if k == 1:
        return [shrinking[-1]]
    ranks = sorted({round(i * (len(shrinking) - 1) / (k - 1)) for i in range(k)})
    return [shrinking[r] for r in ranks]


def profile_segments(
    sessions: Sequence[ort.InferenceSession],
    pieces: Sequence[Segment],
    inputs: Mapping[str, np.ndarray],
    *,
    repeats: int = 20,
    warmup: int = 3,
) -> list[float]:
    """Median wall time of each segment alone, in milliseconds.

    Each segment is fed the tensors a full run gives it, so the sum over
    ``0..i`` is the device's time to reach cut ``i`` and the rest the hub's.

    Raises:
        ConversionError: ``repeats`` is not positive or inference failed.
    """
    if repeats < 1:
        raise ConversionError(f"repeats must be >= 1, got {repeats}")
    env = run_segments(sessions, pieces, inputs)
    times = []
    for session, piece in zip(sessions, pieces, strict=True):
        feed = {n: env[n] for n in piece.inputs}
        samples = []
        for i in range(warmup + repeats):
            started = time.perf_counter()
            session.run(list(piece.outputs), feed)
            if i >= warmup:
                samples.append(time.perf_counter() - started)
        times.append(statistics.median(samples) * 1000.0)
    return times
