"""The Skill SDK: what a skill's control code implements and what it is given.

Control code lives in a bundle's ``control/`` folder. The manifest's entrypoint
(``module.path:ClassName``) names a :class:`Skill` subclass; the agent runs it in
its own sandboxed process, calls :meth:`Skill.setup` once with a
:class:`SkillContext`, then :meth:`Skill.process` for every item, and finally
:meth:`Skill.teardown`.

This module imports nothing but the standard library and numpy, so that control
code can be type-checked and unit-tested without the agent.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np

__all__ = ["Model", "Skill", "SkillContext"]


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
