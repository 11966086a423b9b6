"""Feeding inputs to running skills and counting what comes out.

A source is where a device's inputs come from: a camera or a microphone in
the field; here a replay file of samples (and labels, where they are known).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_agent.errors import AgentError
from protos import pb
from protos.envelope import now_ms

if TYPE_CHECKING:
    import numpy as np

    from edge_agent.sandbox.protocol import InferRecord

#: The joint-inference paths whose accuracy is reported apart.
_JOINT_PATHS = ("joint-device", "joint-hub")

MAX_SOURCE_BYTES = 256 * 1024 * 1024


@dataclass
class ReplaySource:
    """Samples (``x``) and optional labels (``y``) from an ``.npz`` file."""

    x: np.ndarray
    y: np.ndarray | None

    @classmethod
    def load(cls, path: Path) -> ReplaySource:
        """Read a replay file.

        Raises:
            AgentError: missing, too large, or without an ``x`` array.
        """
        import numpy as np  # noqa: PLC0415 - an idle agent (no source) runs without numpy

        try:
            if path.stat().st_size > MAX_SOURCE_BYTES:
                raise AgentError(f"source {path} is larger than {MAX_SOURCE_BYTES} bytes")
            with np.load(path, allow_pickle=False) as data:
                x = np.asarray(data["x"])
                y = np.asarray(data["y"]) if "y" in data.files else None
        except (OSError, KeyError, ValueError) as exc:
            raise AgentError(f"cannot read source {path}: {exc}") from exc
        if y is not None and len(y) != len(x):
            raise AgentError(f"source {path}: {len(x)} samples but {len(y)} labels")
        return cls(x=x, y=y)

    def __len__(self) -> int:
        return len(self.x)

    def item(self, i: int) -> tuple[dict[str, Any], int | None]:
        """The ``i``-th input item and its label, if known."""
        label = None if self.y is None else int(self.y[i])
        return {"image": self.x[i], "scaled": True}, label


@dataclass
class WindowStats:
    """Inference counters of one skill version over one telemetry window.

    ``inferences`` counts every item given to the skill, ``errors`` those it
    raised on (so the error rate is ``errors / inferences``). Split and joint
    inference add, per window, the ``ctx.infer`` calls by path
    (``split.path.<path>``), those the device finished after a hub failure
    (``split.fallbacks``), the joint upload ratio (``joint.upload_ratio``: calls
    sent to the hub's big model over all joint calls) and, where labels come
    back, each joint path's accuracy (``joint.<path>.accuracy``, an item counting
    for the path of its joint calls when they all took one).
    """

    skill: str
    version: str
    started_ms: int = field(default_factory=now_ms)
    inferences: int = 0
    labelled: int = 0
    correct: int = 0
    events: int = 0
    errors: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    paths: dict[str, int] = field(default_factory=dict)
    fallbacks: int = 0
    joint_labelled: dict[str, int] = field(default_factory=dict)
    joint_correct: dict[str, int] = field(default_factory=dict)

    def record(
        self,
        result: Any,
        latency_ms: float,
        label: int | None,
        infers: Sequence[InferRecord] = (),
    ) -> None:
        """Count one inference and the ``ctx.infer`` calls it made."""
        self.inferences += 1
        self.latencies_ms.append(latency_ms)
        correct = None
        if label is not None and isinstance(result, dict) and "label" in result:
            self.labelled += 1
            correct = int(result["label"]) == label
            self.correct += int(correct)
        for record in infers:
            self.paths[record.path] = self.paths.get(record.path, 0) + 1
            self.fallbacks += int(record.fallback)
        joint = {r.path for r in infers if r.path in _JOINT_PATHS}
        if correct is not None and len(joint) == 1:
            (path,) = joint
            self.joint_labelled[path] = self.joint_labelled.get(path, 0) + 1
            self.joint_correct[path] = self.joint_correct.get(path, 0) + int(correct)

    def split_metrics(self) -> dict[str, float]:
        """The window's split and joint counters, for the telemetry metrics map."""
        if not self.paths:
            return {}
        metrics = {f"split.path.{path}": float(n) for path, n in sorted(self.paths.items())}
        metrics["split.fallbacks"] = float(self.fallbacks)
        joint_calls = sum(self.paths.get(path, 0) for path in _JOINT_PATHS)
        if joint_calls:
            metrics["joint.upload_ratio"] = self.paths.get("joint-hub", 0) / joint_calls
        for path, labelled in self.joint_labelled.items():
            metrics[f"joint.{path}.labelled"] = float(labelled)
            metrics[f"joint.{path}.accuracy"] = self.joint_correct.get(path, 0) / labelled
        return metrics

    def record_error(self) -> None:
        """Count one item the skill raised on: an inference that gave no answer."""
        self.inferences += 1
        self.errors += 1

    def add_events(self, count: int) -> None:
        """Count ``count`` events the skill emitted (``ctx.emit``) in this window."""
        self.events += count

    def to_message(
        self, dropped: int = 0, gauges: Mapping[str, float] | None = None
    ) -> pb.Telemetry:
        """The window as a wire message; ``gauges`` (split link and cut state) join its metrics."""
        p50, p95, p99 = percentiles(self.latencies_ms or [0.0], (50, 95, 99))
        return pb.Telemetry(
            skill=self.skill,
            version=self.version,
            inferences=self.inferences,
            labelled=self.labelled,
            correct=self.correct,
            latency_p50_ms=p50,
            latency_p99_ms=p99,
            latency_p95_ms=p95,
            errors=self.errors,
            window_start_ms=self.started_ms,
            window_end_ms=now_ms(),
            dropped_messages=dropped,
            metrics={**(gauges or {}), **self.split_metrics(), "events": float(self.events)},
        )


def percentiles(values: Sequence[float], qs: Sequence[float]) -> list[float]:
    """The ``qs`` percentiles (0..100) of ``values``, interpolated linearly between ranks.

    The same answers as numpy's default ``percentile``, without numpy's per-call
    cost: a window usually holds a handful of latencies, and a fleet of agents
    closes thousands of windows a minute.
    """
    ordered = sorted(values)
    last = len(ordered) - 1
    found = []
    for q in qs:
        rank = last * q / 100.0
        low = int(rank)
        high = min(low + 1, last)
        found.append(ordered[low] + (ordered[high] - ordered[low]) * (rank - low))
    return found


def pace(started: float, count: int, rate_hz: float) -> float:
    """Seconds to sleep so that ``count`` items since ``started`` keep to ``rate_hz``."""
    if rate_hz <= 0:
        return 0.0
    return max(0.0, started + count / rate_hz - time.monotonic())
