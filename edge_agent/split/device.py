"""The paths behind ``ctx.infer``, as the control process runs them.

Lives in the skill's sandboxed process. For each call it picks the path from
the manifest and the plan the agent pushed with the item (the agent owns the
link estimate, so it decides; the control process only follows):

* a ``[[split]]`` model runs its segments up to the planned cut, asks the agent
  (``ask``) for the tail and, when that fails, runs the remaining segments here:
  the head's tensors are kept, so the fallback costs only the tail;
* a ``[[joint]]`` pair runs the small model, measures its confidence and, when
  the input is hard and the plan allows the hub, asks for the big model's
  answer; on failure the small model's answer stands;
* any other model runs here through the runtime facade.

Each call yields exactly one :class:`skills.sdk.InferResult`; nothing is retried
against the hub within a call.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from edge_agent.errors import RuntimeBackendError
from edge_agent.sandbox.protocol import TailAnswer
from edge_agent.split.joint import confidence, is_hard
from edge_agent.split.routes import DEVICE, JOINT
from edge_agent.split.segments import SegmentRunner
from skills.sdk import InferResult

if TYPE_CHECKING:
    from edge_agent.runtime import Runtime
    from skills.manifest import Manifest

__all__ = ["AskHub", "DeviceInference", "load_plan"]


#: ``ask(model, split, tensors)``: the agent's answer for the tail of ``model`` from
#: cut ``split`` (``input``: the whole model; ``joint``: the big model of a pair).
AskHub = Callable[[str, str, Mapping[str, np.ndarray]], TailAnswer]


def load_plan(skill_dir: Path, plan_path: str) -> tuple[object, Path]:
    """Read a split model's ``split.json`` and the folder its segments lie in.

    Raises:
        RuntimeBackendError: The path leaves the skill or the plan does not load.
    """
    from skills.split_plan import SplitPlan  # noqa: PLC0415 - only for split skills

    root = skill_dir.resolve()
    path = (root / plan_path).resolve()
    if not path.is_relative_to(root):
        raise RuntimeBackendError(f"split plan {plan_path!r} leaves the skill")
    try:
        plan = SplitPlan.load(path)
    except Exception as exc:  # a bad file in an installed bundle: one clear error
        raise RuntimeBackendError(f"cannot load split plan {plan_path}: {exc}") from exc
    return plan, path.parent


class DeviceInference:
    """Runs ``ctx.infer`` for one skill version in its control process.

    Args:
        skill_dir: The installed version's folder.
        manifest: Its manifest (``[[split]]`` and ``[[joint]]`` sections).
        runtime: Loads plain and small models.
        target: The device's ONNX target, for split segments.
        slowdown: Emulate a device this many times slower for split segments.
        providers: The device profile's ONNX Runtime providers, for split segments.
    """

    def __init__(
        self,
        skill_dir: Path,
        manifest: Manifest,
        runtime: Runtime,
        *,
        target: str = "onnx-cpu",
        slowdown: float = 1.0,
        providers: Sequence[str] = (),
    ) -> None:
        self._skill_dir = skill_dir
        self._manifest = manifest
        self._runtime = runtime
        self._target = target
        self.slowdown = slowdown
        self._providers = tuple(providers)
        self._runners: dict[str, SegmentRunner] = {}

    def split_models(self) -> list[str]:
        """The names of the manifest's split models."""
        return [spec.model for spec in self._manifest.splits]

    def runner(self, model: str) -> SegmentRunner:
        """The loaded segments of split model ``model`` (loaded on first use).

        Raises:
            RuntimeBackendError: The model has no ``[[split]]`` or its segments do not load.
        """
        if model not in self._runners:
            spec = self._manifest.split_for(model)
            if spec is None:
                raise RuntimeBackendError(f"model {model!r} has no [[split]] section")
            plan, folder = load_plan(self._skill_dir, spec.plan)
            self._runners[model] = SegmentRunner(
                plan,  # type: ignore[arg-type]  # a SplitPlan is a PlanLike
                folder,
                root=self._skill_dir,
                target=self._target,
                slowdown=self.slowdown,
                providers=self._providers,
            )
        return self._runners[model]

    def profile(self, repeats: int = 5) -> dict[str, list[float]]:
        """Every split model's per-segment times on this device (ms).

        Raises:
            RuntimeBackendError: A split model does not load or run.
        """
        return {model: self.runner(model).profile(repeats) for model in self.split_models()}

    def infer(
        self,
        model: str,
        feeds: Mapping[str, np.ndarray],
        *,
        plan: Mapping[str, str],
        ask: AskHub | None,
    ) -> InferResult:
        """Run ``model`` along the path the manifest and the plan call for.

        Args:
            model: The model's name (a joint pair's small model).
            feeds: One array per input.
            plan: The agent's plan: a cut name, :data:`DEVICE` or :data:`JOINT` per model.
            ask: Reaches the hub through the agent; ``None`` keeps everything here.

        Returns:
            One result.

        Raises:
            RuntimeBackendError: The model is unknown or fails on the device.
        """
        if self._manifest.split_for(model) is not None:
            return self._split(model, feeds, plan.get(model, DEVICE), ask)
        joint = self._manifest.joint_for(model)
        if joint is not None:
            allowed = ask if plan.get(model) == JOINT else None
            return self._joint(model, feeds, joint.measure, joint.threshold, allowed)
        return InferResult(self._runtime.model(model).run(feeds), "device")

    def _split(
        self, model: str, feeds: Mapping[str, np.ndarray], cut_name: str, ask: AskHub | None
    ) -> InferResult:
        runner = self.runner(model)
        cut = next((c for c in runner.plan.cuts if c.name == cut_name), None)
        started = time.perf_counter()
        if ask is None or cut is None:
            env = runner.run(feeds)
            return InferResult(runner.outputs(env), "device", device_ms=_since_ms(started))
        env = runner.run(feeds, 0, cut.after + 1)
        head_ms = _since_ms(started)
        missing = [name for name in cut.tensors if name not in env]
        if missing:
            raise RuntimeBackendError(f"{model}: cut {cut.name} needs {missing}")
        answer = ask(model, cut.name, {name: env[name] for name in cut.tensors})
        outputs = answer.outputs
        if outputs is not None and all(name in outputs for name in runner.plan.output_names):
            path = "hub" if cut.after < 0 else "split"
            answered = {n: outputs[n] for n in runner.plan.output_names}
            return InferResult(answered, path, cut.name, device_ms=head_ms)
        rest = time.perf_counter()
        env = runner.run(env, cut.after + 1)
        device_ms = head_ms + _since_ms(rest)  # the wait for the hub left out
        return InferResult(runner.outputs(env), "device", fallback=True, device_ms=device_ms)

    def _joint(
        self,
        model: str,
        feeds: Mapping[str, np.ndarray],
        measure: str,
        threshold: float,
        ask: AskHub | None,
    ) -> InferResult:
        small = self._runtime.model(model)
        outputs = small.run(feeds)
        try:
            value = confidence(outputs[small.output_names[0]], measure)
        except (ValueError, IndexError, KeyError) as exc:
            raise RuntimeBackendError(f"{model}: cannot measure its confidence: {exc}") from exc
        if ask is None or not is_hard(value, measure, threshold):
            return InferResult(outputs, "joint-device", confidence=value)
        answer = ask(model, JOINT, dict(feeds))
        if answer.outputs:
            return InferResult(dict(answer.outputs), "joint-hub", confidence=value)
        return InferResult(outputs, "joint-device", fallback=True, confidence=value)


def _since_ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0
