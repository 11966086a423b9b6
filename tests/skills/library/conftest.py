"""Running a library skill's control code on its real model, without the agent.

``library_skill("face-detect")`` builds the skill's models out of their installed
packages once per test session (as ``cloud.models.library`` does at build time)
and gives a :class:`Harness`: the control code loaded from its source file, set
up with a context whose models come from the agent's own runtime facade.
"""

from __future__ import annotations

import importlib.util
import logging
import subprocess
import sys
import wave
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cloud.models.library import LIBRARY, materialise_skill
from edge_agent.runtime.facade import Runtime
from skills.manifest import Manifest
from skills.sdk import InferResult, Skill

ALL_TARGETS = ("tflite", "onnx-cpu", "openvino")


@dataclass
class Context:
    """A :class:`skills.sdk.SkillContext` over a real runtime; events are kept."""

    skill_dir: Path
    runtime: Runtime
    config: Mapping[str, str]
    logger: logging.Logger = field(default_factory=lambda: logging.getLogger("test.library"))
    events: list[Mapping[str, Any]] = field(default_factory=list)

    def model(self, name: str) -> Any:
        return self.runtime.model(name)

    def infer(self, model: str, feeds: Mapping[str, np.ndarray]) -> InferResult:
        return InferResult(self.runtime.model(model).run(feeds), "device")

    def emit(self, result: Mapping[str, Any]) -> None:
        self.events.append(result)


@dataclass
class Harness:
    """One materialised library skill."""

    root: Path
    manifest: Manifest

    def module(self) -> Any:
        """The control code's entry module, loaded from the skill folder."""
        control = self.root / "control"
        path = control / f"{self.manifest.entry_module.replace('.', '/')}.py"
        spec = importlib.util.spec_from_file_location(f"lib_{self.manifest.entry_module}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        saved, sys.dont_write_bytecode = sys.dont_write_bytecode, True
        try:
            spec.loader.exec_module(module)
        finally:
            sys.dont_write_bytecode = saved
        return module

    def context(
        self, config: Mapping[str, str] | None = None, targets: tuple[str, ...] = ALL_TARGETS
    ) -> Context:
        runtime = Runtime(self.root, self.manifest, targets)
        merged = {**self.manifest.config, **(config or {})}
        return Context(self.root, runtime, merged)

    def skill(
        self, config: Mapping[str, str] | None = None, targets: tuple[str, ...] = ALL_TARGETS
    ) -> Skill:
        """The skill's control class, set up on a fresh runtime."""
        cls = getattr(self.module(), self.manifest.entry_class)
        skill: Skill = cls()
        skill.setup(self.context(config, targets))
        return skill


_BUILT: dict[str, Harness] = {}


@pytest.fixture(scope="session")
def library_skill(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Harness]:
    """Materialise a library skill (once per session) and return its harness."""

    def get(name: str) -> Harness:
        if name not in _BUILT:
            dest = tmp_path_factory.mktemp(f"lib-{name}") / name
            _BUILT[name] = Harness(dest, materialise_skill(LIBRARY / name, dest))
        return _BUILT[name]

    return get


def speak(text: str, path: Path, *, lead_s: float = 0.0, tail_s: float = 0.0) -> np.ndarray:
    """``text`` spoken by espeak-ng, resampled to 16 kHz int16, padded with silence."""
    subprocess.run(["espeak-ng", "-w", str(path), text], check=True, capture_output=True)
    with wave.open(str(path), "rb") as wav:
        rate = wav.getframerate()
        pcm = np.frombuffer(wav.readframes(wav.getnframes()), np.int16).astype(np.float64)
    if rate != 16000:
        times = np.arange(round(len(pcm) * 16000 / rate)) * rate / 16000
        pcm = np.interp(times, np.arange(len(pcm)), pcm)
    lead, tail = np.zeros(round(lead_s * 16000)), np.zeros(round(tail_s * 16000))
    return np.concatenate([lead, pcm, tail]).round().astype(np.int16)
