"""The Skill SDK: what a skill's control code implements and what it is given.

Control code lives in a bundle's ``control/`` folder. The manifest's entrypoint
(``module.path:ClassName``) names a :class:`Skill` subclass; the agent runs it in
its own sandboxed process, calls :meth:`Skill.setup` once with a
:class:`SkillContext`, then :meth:`Skill.process` for every item, and finally
:meth:`Skill.teardown`.

A model the manifest declares for split inference (``[[split]]``) or as the
small half of a joint pair (``[[joint]]``) is run through
:meth:`SkillContext.infer`, one call that hides where the work ran: on the
device, split with the hub at the planner's current cut, wholly on the hub, or
(joint) on the small model with its hard examples sent to the hub's big one.
The :class:`InferResult` says which path ran, and whether the device finished
on its own because the hub failed (``fallback``). Exactly one result comes back
per call.

This module imports nothing but the standard library and numpy, so that control
code can be type-checked and unit-tested without the agent.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

__all__ = ["INFER_PATHS", "InferResult", "Model", "Skill", "SkillContext"]

#: Where an :meth:`SkillContext.infer` call ran.
#:
#: * ``device`` — wholly on the device (also after a hub failure: see ``fallback``);
#: * ``split`` — the head on the device, the tail on the hub;
#: * ``hub`` — the raw input sent to the hub, which ran the whole model;
#: * ``joint-device`` — the small model's answer was kept;
#: * ``joint-hub`` — the input was hard for the small model; the hub's big model answered.
INFER_PATHS = ("device", "split", "hub", "joint-device", "joint-hub")


@dataclass(frozen=True)
class InferResult:
    """The answer of one :meth:`SkillContext.infer` call.

    Attributes:
        outputs: One array per output name of the model that answered.
        path: Where it ran; one of :data:`INFER_PATHS`.
        cut: The cut the activation crossed at (``input`` for hub-only), or ``None``
            when nothing crossed.
        fallback: The hub was asked but failed (refused, timed out, link lost) and the
            device finished the work itself.
        confidence: For a joint model, the small model's confidence value (normalised
            entropy or margin, as the manifest says); ``None`` otherwise.
        device_ms: For a split model, the time its segments ran on the device (the head,
            or the whole model on the device path); the agent learns its costs from it.

    Raises:
        ValueError: ``path`` is not one of :data:`INFER_PATHS`.
    """

    outputs: Mapping[str, np.ndarray]
    path: str
    cut: str | None = None
    fallback: bool = False
    confidence: float | None = None
    device_ms: float = 0.0

    def __post_init__(self) -> None:
        if self.path not in INFER_PATHS:
            raise ValueError(f"unknown inference path {self.path!r}; one of {INFER_PATHS}")


class Model(Protocol):
    """A model variant loaded by the device's runtime, ready to run.

    Attributes:
        name: The model's name in the manifest (``classifier``).
        target: The target of the variant that was picked (``onnx-cpu``).
        backend: The inference backend running it (``onnxruntime``, ``openvino``, ``litert``).
        input_names: The graph's input names, in graph order.
        output_names: The graph's output names, in graph order.
    """

    name: str
    target: str
    backend: str
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the model once.

        Args:
            feeds: One array per input name.

        Returns:
            One array per output name.

        Raises:
            edge_agent.errors.RuntimeBackendError: The feeds do not match the
                inputs, or the backend failed.
        """
        ...


class SkillContext(Protocol):
    """What the agent gives a skill at setup.

    Attributes:
        config: The deployment's configuration for this skill (strings only).
        skill_dir: The installed skill version's folder (read-only by convention).
        logger: A logger whose records go to the skill's log file.
    """

    config: Mapping[str, str]
    skill_dir: Path
    logger: logging.Logger

    def model(self, name: str) -> Model:
        """Load (once) and return the best variant of a model for this device.

        Args:
            name: The model's name in the manifest.

        Returns:
            The loaded model.

        Raises:
            edge_agent.errors.RuntimeBackendError: The manifest has no such model,
                or no variant of it can run on this device.
        """
        ...

    def infer(self, model: str, feeds: Mapping[str, np.ndarray]) -> InferResult:
        """Run a model wherever it is best run now, and say where it ran.

        A model with a ``[[split]]`` section runs its head up to the agent's current
        cut here and its tail on the hub; a joint pair's small model sends its hard
        inputs to the hub's big model; any other model runs on the device. When the
        hub refuses, is unreachable or misses the deadline, the device finishes the
        work: one result per call, marked ``fallback``. Only calls made from
        :meth:`Skill.process` (on its own thread) may reach the hub; elsewhere the
        model runs on the device.

        Args:
            model: The model's name in the manifest (for a joint pair, the small one).
            feeds: One array per input name.

        Returns:
            The outputs and the path that produced them.

        Raises:
            edge_agent.errors.RuntimeBackendError: The manifest has no such model, or
                it cannot run on this device.
        """
        ...

    def emit(self, result: Mapping[str, Any]) -> None:
        """Send an event up to the hub as telemetry.

        Args:
            result: A JSON-able mapping (numpy arrays are allowed).

        Raises:
            ValueError: The event cannot be encoded or exceeds the frame cap.
        """
        ...


class Skill(ABC):
    """Base class of every skill's control code."""

    @abstractmethod
    def setup(self, ctx: SkillContext) -> None:
        """Prepare to serve: read the configuration, load models.

        An exception raised here fails the skill version's health check.

        Args:
            ctx: The context for this run.
        """

    @abstractmethod
    def process(self, item: Mapping[str, Any]) -> Mapping[str, Any]:
        """Handle one item and return its result.

        An exception raised here fails this item only.

        Args:
            item: A JSON-able mapping; numpy arrays arrive as ``np.ndarray``.

        Returns:
            A JSON-able mapping (numpy arrays are allowed).
        """

    def teardown(self) -> None:  # noqa: B027 - an optional hook, empty on purpose
        """Release resources before the process exits. The default does nothing."""
