"""A simulated skill runtime: stands in for the sandboxed control process of each device.

The agent starts skills through a launcher (``launcher(skill_dir, config)``,
see :mod:`edge_agent.sandbox.launcher`) and feeds what it returns through
``process``; here that process runs no control code and loads no model. It
answers from the version's :class:`~edgeskill.sim.params.VersionSpec`: right
with the version's accuracy, after a latency drawn around the version's
median and scaled by the board, and it may crash at a chosen rate. A device
drawn to fail a version's install fails its health check, as a broken skill
would, so the agent's real rollback runs.

The inputs come from :func:`synthetic_source`, whose items carry their own
label, so the simulated skill knows the right answer without a model.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edge_agent.errors import HealthCheckError, SandboxError
from edge_agent.sandbox import SkillItemError
from edge_agent.workload import ReplaySource
from edgeskill.sim.params import VersionSpec
from skills.manifest import Manifest

__all__ = [
    "BOARD_SPEED",
    "SimStats",
    "SimulatedLauncher",
    "SimulatedSkillProcess",
    "VersionStats",
    "synthetic_source",
]

#: Latency of each board relative to an ``x86-cpu`` gateway (accelerators are faster).
BOARD_SPEED: Mapping[str, float] = {
    "x86-cpu": 1.0,
    "x86-cuda": 0.3,
    "jetson": 0.5,
    "ascend-310": 0.4,
    "atlas-200": 0.6,
    "arm-cpu": 2.5,
    "rpi": 4.0,
}
#: Spread of the latency draw (the sigma of a log-normal): p99 is about 1.8x the median.
LATENCY_SIGMA = 0.25
#: Latency samples kept per version for percentiles (a uniform reservoir).
RESERVOIR = 20_000
_CLASSES = 10


def synthetic_source(items: int = 100, seed: int = 0) -> ReplaySource:
    """A replay source whose every input holds its own label (``x[i] == y[i]``)."""
    labels = np.random.default_rng(seed).integers(0, _CLASSES, size=items)
    return ReplaySource(x=labels.astype(np.float32).reshape(items, 1), y=labels.astype(np.int64))


@dataclass
class VersionStats:
    """What the simulated skills of one version did: counts and a latency sample."""

    inferences: int = 0
    correct: int = 0
    errors: int = 0
    latencies_ms: list[float] = field(default_factory=list)

    def add(self, correct: bool, latency_ms: float, rng: random.Random) -> None:
        """Count one answer; keep its latency in the reservoir."""
        self.inferences += 1
        self.correct += int(correct)
        if len(self.latencies_ms) < RESERVOIR:
            self.latencies_ms.append(latency_ms)
        else:
            slot = rng.randrange(self.inferences)
            if slot < RESERVOIR:
                self.latencies_ms[slot] = latency_ms


@dataclass
class SimStats:
    """Counters shared by every simulated skill of one worker process (thread-safe)."""

    versions: dict[str, VersionStats] = field(default_factory=dict)
    starts: int = 0
    failed_health_checks: int = 0
    crashes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _rng: random.Random = field(default_factory=lambda: random.Random(0))

    def answer(self, version: str, correct: bool, latency_ms: float) -> None:
        """Count one answer of ``version``."""
        with self._lock:
            self.versions.setdefault(version, VersionStats()).add(correct, latency_ms, self._rng)

    def error(self, version: str) -> None:
        """Count one input ``version`` raised on."""
        with self._lock:
            self.versions.setdefault(version, VersionStats()).errors += 1

    def count(self, what: str) -> None:
        """Add one to ``starts``, ``failed_health_checks`` or ``crashes``."""
        with self._lock:
            setattr(self, what, getattr(self, what) + 1)

    def snapshot(self, *, latencies: bool = True) -> dict[str, Any]:
        """The counters as plain data (for the worker's status file), samples if ``latencies``."""
        with self._lock:
            return {
                "starts": self.starts,
                "failed_health_checks": self.failed_health_checks,
                "crashes": self.crashes,
                "versions": {
                    v: {
                        "inferences": s.inferences,
                        "correct": s.correct,
                        "errors": s.errors,
                        "latencies_ms": [round(x, 3) for x in s.latencies_ms] if latencies else [],
                    }
                    for v, s in self.versions.items()
                },
            }


class SimulatedSkillProcess:
    """Stands in for :class:`edge_agent.sandbox.SkillProcess`: answers, crashes, stops.

    Args:
        manifest: The installed version's manifest.
        spec: How this version behaves.
        speed: The board's latency factor (:data:`BOARD_SPEED`).
        stats: Where answers and crashes are counted.
        rng: This process's random draws.
        crash_rate: Crashes per minute (0: never).
        clock: Monotonic seconds.
    """

    def __init__(
        self,
        manifest: Manifest,
        spec: VersionSpec,
        speed: float,
        stats: SimStats,
        rng: random.Random,
        *,
        crash_rate: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.manifest = manifest
        #: It answers without blocking: the agent calls it on its loop, not in a thread
        #: (thousands of simulated devices would otherwise queue on one process's threads).
        self.answers_inline = True
        self.models = {"classifier": "simulated"}
        self.limit_notes: tuple[str, ...] = ()
        self._spec = spec
        self._median_ms = spec.latency_ms * speed
        self._stats = stats
        self._rng = rng
        self._clock = clock
        self._stopped = False
        wait = rng.expovariate(crash_rate / 60.0) if crash_rate > 0 else math.inf
        self._crashes_at = clock() + wait
        self._crash_counted = False

    @property
    def alive(self) -> bool:
        """Whether the simulated control process still runs."""
        if self._stopped:
            return False
        if self._clock() < self._crashes_at:
            return True
        if not self._crash_counted:
            self._crash_counted = True
            self._stats.count("crashes")
        return False

    @property
    def kill_reason(self) -> str | None:
        """Why it stopped on its own: ``None`` while alive or after a plain stop."""
        return None if self._stopped or self.alive else "simulated crash"

    def process(
        self, item: Mapping[str, Any], timeout: float = 10.0
    ) -> tuple[dict[str, Any], float]:
        """Answer one input: its label with the version's accuracy, and a latency.

        Raises:
            SkillItemError: the version's ``error_rate`` drew this input as one it
                raises on (the process serves on).
            SandboxError: the simulated process crashed or was stopped.
        """
        if not self.alive:  # stopped (an upgrade, a removal) or crashed: say which
            why = "stopped" if self._stopped else "simulated crash"
            raise SandboxError(f"{self.manifest.name} {self.manifest.version}: {why}")
        if self._spec.error_rate and self._rng.random() < self._spec.error_rate:
            self._stats.error(self.manifest.version)
            raise SkillItemError(f"{self.manifest.name} {self.manifest.version}: simulated error")
        truth = int(np.asarray(item["image"]).flat[0])
        correct = self._rng.random() < self._spec.accuracy
        label = truth if correct else (truth + 1 + self._rng.randrange(_CLASSES - 1)) % _CLASSES
        latency = self._median_ms * math.exp(self._rng.gauss(0.0, LATENCY_SIGMA))
        self._stats.answer(self.manifest.version, correct, latency)
        return {"label": label, "confidence": 0.9 if correct else 0.5}, latency

    def drain_events(self) -> list[dict[str, Any]]:
        """Events the skill emitted: the simulated one emits none."""
        return []

    def stop(self, timeout: float = 5.0) -> None:
        """Stop it; safe to call twice."""
        self._stopped = True


@dataclass
class SimulatedLauncher:
    """The launcher of one simulated device (the shape of ``SkillLauncher``).

    Attributes:
        device_id: The device, seeding its draws.
        board: Its board from the profile table.
        specs: Behaviour per version; versions not named get :class:`VersionSpec`'s defaults.
        fail_versions: Versions whose health check fails on this device.
        stats: The worker's shared counters.
        crash_rate: Crashes per minute of each started skill.
        seed: The run's seed.
    """

    device_id: str
    board: str
    specs: Mapping[str, VersionSpec]
    fail_versions: frozenset[str]
    stats: SimStats
    crash_rate: float = 0.0
    seed: int = 0
    _starts: int = 0

    def __call__(self, skill_dir: Path, config: Mapping[str, str]) -> SimulatedSkillProcess:
        """Start the installed version in ``skill_dir``.

        Raises:
            HealthCheckError: the manifest cannot be read, or this device was drawn
                to fail this version.
        """
        try:
            text = (skill_dir / "skill.toml").read_text(encoding="utf-8")
        except OSError as exc:
            raise HealthCheckError(f"cannot read {skill_dir.name}'s manifest: {exc}") from exc
        manifest = Manifest.from_toml(text)
        if manifest.version in self.fail_versions:
            self.stats.count("failed_health_checks")
            raise HealthCheckError(
                f"{manifest.name} {manifest.version}: simulated health check failure"
            )
        self._starts += 1
        self.stats.count("starts")
        rng = random.Random(f"{self.seed}:{self.device_id}:{manifest.version}:{self._starts}")
        return SimulatedSkillProcess(
            manifest,
            self.specs.get(manifest.version, VersionSpec()),
            BOARD_SPEED.get(self.board, 1.0),
            self.stats,
            rng,
            crash_rate=self.crash_rate,
        )
