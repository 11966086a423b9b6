"""A split model's segments, run on this device with ONNX Runtime.

A bundle ships a split model once, as consecutive segments (``seg-00.onnx``,
``seg-01.onnx``, …) next to its ``split.json`` (:mod:`skills.split_plan`).
Running segments ``0..i`` on the device and ``i+1..`` on the hub is the split
at a cut whose ``after`` is ``i``. Each segment reads its inputs by name from
every tensor fed or computed so far and adds its outputs, so a skip tensor
that crosses several cuts is computed once and stays available.

The runner also profiles the segments (each timed alone, fed what a full run
gives it) for the planner's device costs, and can emulate a slower device by
sleeping after each segment for ``slowdown - 1`` times its run time, so both
the measured latency and the profile are those of the slower device.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from edge_agent.errors import RuntimeBackendError
from edge_agent.profile import session_providers

__all__ = ["CutLike", "PlanLike", "SegmentLike", "SegmentRunner"]

_CPU = "CPUExecutionProvider"
_DTYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}


class SegmentLike(Protocol):
    """What the runner reads of a ``split.json`` segment."""

    @property
    def file(self) -> str: ...
    @property
    def inputs(self) -> Sequence[str]: ...
    @property
    def outputs(self) -> Sequence[str]: ...


class CutLike(Protocol):
    """What the agent reads of a ``split.json`` cut (``after = -1``: hub only)."""

    @property
    def name(self) -> str: ...
    @property
    def after(self) -> int: ...
    @property
    def tensors(self) -> Sequence[str]: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def codec(self) -> str | None: ...


class PlanLike(Protocol):
    """What the agent reads of a split plan (:class:`skills.split_plan.SplitPlan`)."""

    @property
    def model(self) -> str: ...
    @property
    def input_names(self) -> Sequence[str]: ...
    @property
    def output_names(self) -> Sequence[str]: ...
    @property
    def input_bytes(self) -> int: ...
    @property
    def output_bytes(self) -> int: ...
    @property
    def segments(self) -> Sequence[SegmentLike]: ...
    @property
    def cuts(self) -> Sequence[CutLike]: ...
    @property
    def hub_ms(self) -> Sequence[float]: ...
    @property
    def device_ms(self) -> Sequence[float]: ...


def _providers(target: str, profile: Sequence[str], available: Sequence[str]) -> list[str]:
    if not target.startswith("onnx-"):
        return [_CPU]
    return session_providers(target, profile, available)


class SegmentRunner:
    """Every segment of one split model, loaded in ONNX Runtime.

    Args:
        plan: The model's split plan.
        folder: The folder holding ``split.json`` and the segment files.
        root: The skill's folder; every segment file must lie inside it.
        target: The device's ONNX target (its execution providers are used).
        slowdown: Emulate a device this many times slower (``>= 1``).
        providers: The device profile's ONNX Runtime providers, best first, tried
            after the target's own (as the runtime facade opens sessions).

    Raises:
        RuntimeBackendError: A segment file leaves the skill, is missing, or does not
            load; or ``slowdown`` is below 1.
    """

    def __init__(
        self,
        plan: PlanLike,
        folder: Path,
        *,
        root: Path,
        target: str = "onnx-cpu",
        slowdown: float = 1.0,
        providers: Sequence[str] = (),
    ) -> None:
        if not (slowdown >= 1.0 and np.isfinite(slowdown)):
            raise RuntimeBackendError(f"a device slowdown must be >= 1, got {slowdown!r}")
        import onnxruntime as ort  # noqa: PLC0415 - loaded only where a split model runs

        self.plan = plan
        self.slowdown = slowdown
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        chosen = _providers(target, providers, ort.get_available_providers())
        top = root.resolve()
        self._sessions: list[Any] = []
        for segment in plan.segments:
            path = (folder / segment.file).resolve()
            if not path.is_relative_to(top):
                raise RuntimeBackendError(f"segment {segment.file!r} leaves the skill")
            try:
                session = ort.InferenceSession(str(path), sess_options=options, providers=chosen)
            except Exception as exc:  # onnxruntime raises its own untyped errors
                raise RuntimeBackendError(
                    f"{plan.model}: cannot load segment {segment.file}: {exc}"
                ) from exc
            self._sessions.append(session)

    @property
    def count(self) -> int:
        """How many segments the model has."""
        return len(self._sessions)

    def run(
        self, tensors: Mapping[str, np.ndarray], start: int = 0, stop: int | None = None
    ) -> dict[str, np.ndarray]:
        """Run segments ``start..stop-1`` and return every tensor fed or computed.

        Raises:
            RuntimeBackendError: A needed tensor is missing or inference failed.
        """
        env = dict(tensors)
        end = self.count if stop is None else stop
        for index in range(max(start, 0), end):
            self._run_one(index, env)
        return env

    def outputs(self, env: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The model's outputs out of a full run's tensors.

        Raises:
            RuntimeBackendError: An output was not computed.
        """
        missing = [name for name in self.plan.output_names if name not in env]
        if missing:
            raise RuntimeBackendError(f"{self.plan.model}: outputs {missing} were not computed")
        return {name: env[name] for name in self.plan.output_names}

    def example_feeds(self, seed: int = 0) -> dict[str, np.ndarray]:
        """Inputs of the right shapes and types (symbolic dimensions as 1), for profiling.

        Raises:
            RuntimeBackendError: An input is not an input of any segment.
        """
        rng = np.random.default_rng(seed)
        metas = {meta.name: meta for s in self._sessions for meta in s.get_inputs()}
        feeds: dict[str, np.ndarray] = {}
        for name in self.plan.input_names:
            meta = metas.get(name)
            if meta is None:
                raise RuntimeBackendError(f"{self.plan.model}: no segment reads input {name!r}")
            shape = [d if isinstance(d, int) and d > 0 else 1 for d in meta.shape]
            dtype = _DTYPES.get(meta.type, np.float32)
            if np.issubdtype(dtype, np.floating):
                feeds[name] = rng.standard_normal(shape).astype(dtype)
            else:
                feeds[name] = np.zeros(shape, dtype)
        return feeds

    def profile(self, repeats: int = 5, warmup: int = 1) -> list[float]:
        """Each segment's median time alone (ms), on this device as emulated.

        Raises:
            RuntimeBackendError: ``repeats`` is not positive or inference failed.
        """
        if repeats < 1:
            raise RuntimeBackendError(f"repeats must be >= 1, got {repeats}")
        env = self.run(self.example_feeds())
        times = []
        for index, segment in enumerate(self.plan.segments):
            feed = {name: env[name] for name in segment.inputs}
            samples = []
            for attempt in range(warmup + repeats):
                started = time.perf_counter()
                self._call(index, feed)
                if attempt >= warmup:
                    samples.append(time.perf_counter() - started)
            times.append(statistics.median(samples) * 1000.0 * self.slowdown)
        return times

    def _run_one(self, index: int, env: dict[str, np.ndarray]) -> None:
        segment = self.plan.segments[index]
        missing = [name for name in segment.inputs if name not in env]
        if missing:
            raise RuntimeBackendError(f"{self.plan.model}: segment {index} needs {missing}")
        started = time.perf_counter()
        values = self._call(index, {name: env[name] for name in segment.inputs})
        if self.slowdown > 1.0:
            time.sleep((self.slowdown - 1.0) * (time.perf_counter() - started))
        env.update(zip(segment.outputs, values, strict=True))

    def _call(self, index: int, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        segment = self.plan.segments[index]
        try:
            values = self._sessions[index].run(list(segment.outputs), feed)
        except Exception as exc:  # onnxruntime raises its own untyped errors
            raise RuntimeBackendError(
                f"{self.plan.model}: segment {index} failed in ONNX Runtime: {exc}"
            ) from exc
        return [np.asarray(v) for v in values]
