"""A split model laid out as a bundle ships it, and a fake hub that runs its tails locally.

:func:`write_split_model` builds a small chain-shaped ONNX model with
``onnx.helper``, cuts it with :mod:`converters.split` into segments and writes
``models/<model>/seg-NN.onnx`` and ``split.json`` (the :mod:`skills.split_plan`
contract). :class:`LocalTailHub` implements ``infer_tail`` as the hub would, with
ONNX Runtime in this process, and can refuse, hang, or lose the link mid-request.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from converters.split import enumerate_cuts, segments
from edge_agent.errors import InferRefusedError, TransportError
from edge_agent.split.segments import SegmentRunner
from protos import pb
from skills.split_plan import PING, SplitPlan
from skills.tensor_codec import decode_protos, encode_protos

RNG = np.random.default_rng(11)
#: The chain's layer widths: input 16, hidden 64 and 4, output 10 classes.
WIDTHS = (16, 64, 4, 10)
WEIGHTS = [
    (RNG.normal(size=(a, b)) / np.sqrt(a)).astype(np.float32) for a, b in itertools.pairwise(WIDTHS)
]


def chain_model() -> bytes:
    """``x → (MatMul, Relu) × 2 → MatMul → logits``, batch dimension symbolic."""
    nodes, inits, previous = [], [], "x"
    for index, weight in enumerate(WEIGHTS):
        inits.append(numpy_helper.from_array(weight, f"w{index}"))
        nodes.append(helper.make_node("MatMul", [previous, f"w{index}"], [f"mm{index}"]))
        previous = f"mm{index}"
        if index < len(WEIGHTS) - 1:
            nodes.append(helper.make_node("Relu", [previous], [f"h{index}"]))
            previous = f"h{index}"
    nodes.append(helper.make_node("Identity", [previous], ["logits"]))
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", WIDTHS[0]])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", WIDTHS[-1]])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model.SerializeToString()


def reference(x: np.ndarray) -> np.ndarray:
    """The chain in numpy."""
    out = x.astype(np.float32)
    for index, weight in enumerate(WEIGHTS):
        out = out @ weight
        if index < len(WEIGHTS) - 1:
            out = np.maximum(out, 0)
    return out


def write_split_model(
    skill_dir: Path,
    model: str = "chain",
    hub_ms: tuple[float, ...] | None = None,
) -> Path:
    """Write the chain's segments and ``split.json`` under ``models/<model>/``; its path.

    The cuts offered are ``input`` (hub only) and the two Relu outputs.
    """
    import onnx  # noqa: PLC0415

    full = onnx.load_from_string(chain_model())
    graph_cuts = enumerate_cuts(full)
    chosen = [c for c in graph_cuts.cuts if c.tensors in (("h0",), ("h1",))]
    pieces = segments(full, chosen)
    folder = skill_dir / "models" / model
    folder.mkdir(parents=True, exist_ok=True)
    segment_entries = []
    for index, piece in enumerate(pieces):
        name = f"seg-{index:02d}.onnx"
        (folder / name).write_bytes(piece.model.SerializeToString())
        segment_entries.append(
            {"file": name, "inputs": list(piece.inputs), "outputs": list(piece.outputs)}
        )
    cuts = [{"name": "input", "after": -1, "tensors": ["x"], "nbytes": graph_cuts.input_bytes}]
    cuts += [
        {"name": c.name, "after": i, "tensors": list(c.tensors), "nbytes": c.nbytes}
        for i, c in enumerate(chosen)
    ]
    plan = {
        "model": model,
        "input_names": ["x"],
        "output_names": ["logits"],
        "input_bytes": graph_cuts.input_bytes,
        "output_bytes": graph_cuts.output_bytes,
        "segments": segment_entries,
        "cuts": cuts,
        "hub_ms": list(hub_ms or (0.05,) * len(pieces)),
        "device_ms": [0.05] * len(pieces),
    }
    path = folder / "split.json"
    path.write_text(json.dumps(plan, indent=1))
    return path


@dataclass
class LocalTailHub:
    """``infer_tail`` run here: the hub's behaviour, scriptable.

    Attributes:
        plan_path: The split model's ``split.json`` (its segments lie beside it).
        mode: ``ok``, ``refuse``, ``hang`` (never answers), ``drop`` (the link goes
            away ``delay_s`` into the request), or ``slow`` (answers after ``delay_s``).
        delay_s: See ``mode``.
        hub_ms: The hub time it reports.
        big: The big model of a joint pair: inputs in, outputs out.
        requests: Every request received, in order.
    """

    plan_path: Path | None = None
    mode: str = "ok"
    delay_s: float = 0.0
    hub_ms: float = 1.0
    big: Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]] | None = None
    requests: list[pb.InferRequest] = field(default_factory=list)
    _runner: SegmentRunner | None = None

    def runner(self) -> SegmentRunner:
        """The split model's segments, loaded once."""
        if self._runner is None:
            assert self.plan_path is not None
            plan = SplitPlan.load(self.plan_path)
            root = self.plan_path.parent
            self._runner = SegmentRunner(plan, root, root=root)  # type: ignore[arg-type]
        return self._runner

    async def infer_tail(self, request: pb.InferRequest, timeout_s: float) -> pb.InferResponse:
        """Run the tail named by ``request`` (or fail as ``mode`` says).

        Raises:
            InferRefusedError: ``mode`` is ``refuse``.
            TransportError: ``mode`` is ``drop``.
        """
        self.requests.append(request)
        if request.split == PING and self.mode in ("ok", "slow"):  # as the hub: empty, at once
            await asyncio.sleep(self.delay_s)
            return pb.InferResponse(request_id=request.request_id)
        if self.mode == "refuse":
            raise InferRefusedError("the hub has no such tail")
        if self.mode == "hang":
            await asyncio.sleep(3600)
        if self.mode in ("drop", "slow"):
            await asyncio.sleep(self.delay_s)
        if self.mode == "drop":
            raise TransportError("connection reset by peer")
        outputs = self._run(request)
        names = sorted(outputs)
        protos = encode_protos(outputs, names, "fp32")
        for proto, name in zip(protos, names, strict=True):
            proto.name = name
        return pb.InferResponse(
            outputs=protos, hub_ms=self.hub_ms, queue_ms=0.0, request_id=request.request_id
        )

    def _run(self, request: pb.InferRequest) -> dict[str, np.ndarray]:
        names = [proto.name for proto in request.inputs]
        tensors = decode_protos(list(request.inputs), names)
        if request.split == "joint":
            assert self.big is not None
            return self.big(tensors)
        runner = self.runner()
        cut = next(c for c in runner.plan.cuts if c.name == request.split)
        return runner.outputs(runner.run(tensors, cut.after + 1))
