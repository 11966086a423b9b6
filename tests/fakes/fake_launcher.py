"""A skill launcher that starts no process, for running many agents in one test process.

It has the shape of ``edge_agent.sandbox.launcher.SkillLauncher``: an installed
version's folder and its merged config in, a started "process" out. The fake
process answers every item at once (with ``answer(item)`` when given one, else
a constant) and emits ``events_per_item`` events per item, so the agent's
workload and telemetry run for real around it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge_agent.errors import HealthCheckError
from edge_agent.profile import DeviceProfile
from skills.manifest import Manifest

#: What a fake skill answers for an item.
Answer = Callable[[Mapping[str, Any]], dict[str, Any]]


@dataclass
class FakeSkillProcess:
    """Stands in for ``edge_agent.sandbox.SkillProcess``."""

    skill_dir: Path
    manifest: Manifest
    config: dict[str, str]
    events_per_item: int = 0
    answer: Answer | None = None
    models: dict[str, str] = field(default_factory=lambda: {"classifier": "fake"})
    processed: int = 0
    stopped: bool = False
    _events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def alive(self) -> bool:
        return not self.stopped

    def process(
        self, item: Mapping[str, Any], timeout: float = 10.0
    ) -> tuple[dict[str, Any], float]:
        self.processed += 1
        for i in range(self.events_per_item):
            self._events.append({"kind": "fake", "item": self.processed, "n": i})
        if self.answer is not None:
            return self.answer(item), 0.1
        return {"label": 0, "confidence": 1.0}, 0.1

    def drain_events(self) -> list[dict[str, Any]]:
        events, self._events = self._events, []
        return events

    def stop(self, timeout: float = 5.0) -> None:
        self.stopped = True


@dataclass
class FakeLauncher:
    """Records every launch; ``fail_versions`` fail their health check."""

    events_per_item: int = 0
    fail_versions: frozenset[str] = frozenset()
    answer: Answer | None = None
    launched: list[FakeSkillProcess] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, skill_dir: Path, config: Mapping[str, str]) -> Any:
        manifest = Manifest.from_toml((skill_dir / "skill.toml").read_text(encoding="utf-8"))
        if manifest.version in self.fail_versions:
            raise HealthCheckError(f"{manifest.name} {manifest.version}: fake health check failed")
        merged = {**dict(manifest.config), **config}  # as the real launcher lays them
        proc = FakeSkillProcess(skill_dir, manifest, merged, self.events_per_item, self.answer)
        with self._lock:  # launchers are called from worker threads
            self.launched.append(proc)
        return proc


#: A device profile for agents run with the fake launcher (any ONNX CPU device).
PROFILE = DeviceProfile(
    arch="x86_64",
    accelerator="none",
    board="test",
    targets=("onnx-cpu",),
    cpu_count=1,
    memory_bytes=1 << 30,
)
