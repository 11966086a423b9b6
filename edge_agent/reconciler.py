"""Level-triggered reconcile: make installed and running skills match the desired state.

Each pass compares the desired state with what is on disk and running, and
does only what is missing, so a restart, a lost message or a crash in the
middle of an install converges on the next pass. An install is: fetch through
TUF, verify, unpack into staging, switch ``current`` atomically, health-check
the new version by starting it, and roll back to the previous version when
the check fails.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from edge_agent.errors import AgentError, HealthCheckError, InstallError, SandboxError
from edge_agent.installs import InstallStore
from edge_agent.sandbox import SkillProcess
from protos import pb
from skills.errors import SkillError
from skills.manifest import Manifest

log = logging.getLogger(__name__)

FetchTarget = Callable[[str], Path]

RETRY_BASE_S = 3.0
RETRY_MAX_S = 300.0


@dataclass(frozen=True)
class SkillState:
    """What the agent says about one skill in its reports."""

    name: str
    version: str = ""
    state: str = "installing"
    error: str = ""
    desired_version: str = ""
    previous_version: str = ""
    variant: str = ""

    def to_message(self) -> pb.SkillStatus:
        """The state as a wire message."""
        return pb.SkillStatus(
            name=self.name,
            version=self.version,
            state=self.state,
            error=self.error[:2000],
            desired_version=self.desired_version,
            previous_version=self.previous_version,
            variant=self.variant[:256],
        )


class Reconciler:
    """Owns the installed skills and their control processes."""

    def __init__(
        self,
        installs: InstallStore,
        fetch_target: FetchTarget,
        profile_targets: Sequence[str],
        log_dir: Path,
        on_change: Callable[[], None],
        precisions: Sequence[str] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.installs = installs
        self.fetch_target = fetch_target
        self.profile_targets = tuple(profile_targets)
        self.precisions = tuple(precisions)
        self.clock = clock
        self.log_dir = log_dir
        self.on_change = on_change
        self.processes: dict[str, SkillProcess] = {}
        self.states: dict[str, SkillState] = {}
        # Versions that failed, with the monotonic time they may be tried again: a fetch or
        # trust failure may be the hub's or the network's passing fault and is retried with
        # backoff; a failed health check is not retried until the desired state changes.
        self._failed: dict[tuple[str, str], float] = {}
        self._fetch_failures: dict[tuple[str, str], int] = {}
        self._generation = -1

    async def reconcile(self, desired: pb.DesiredState | None) -> None:
        """One pass. ``None`` means the hub's wishes are unknown: keep what is installed."""
        if desired is None:
            for skill in await asyncio.to_thread(self.installs.installed):
                await self._ensure_running(skill.name, skill.version, skill.version, {})
            return
        if desired.generation != self._generation:
            self._failed.clear()
            self._fetch_failures.clear()
            self._generation = desired.generation
        wanted = {s.name: s for s in desired.skills}
        for spec in desired.skills:
            await self._converge(spec)
        for skill in await asyncio.to_thread(self.installs.installed):
            if skill.name not in wanted:
                await self._remove(skill.name)

    async def _converge(self, spec: pb.SkillSpec) -> None:
        current = await asyncio.to_thread(self.installs.current, spec.name)
        if current is not None and current.version == spec.version:
            await self._ensure_running(spec.name, spec.version, spec.version, dict(spec.config))
            return
        if self._failed.get((spec.name, spec.version), 0.0) > self.clock():
            if current is not None:  # keep the version that works running meanwhile
                await self._ensure_running(
                    spec.name, current.version, spec.version, dict(spec.config)
                )
            return
        await self._install(spec, current.version if current else "")

    async def _install(self, spec: pb.SkillSpec, previous: str) -> None:
        self._set(SkillState(spec.name, previous, "installing", "", spec.version, previous))
        try:
            bundle = await asyncio.to_thread(self.fetch_target, spec.target_name)
            await asyncio.to_thread(self.installs.unpack, spec.name, spec.version, bundle)
        except (SkillError, AgentError) as exc:
            # The version that runs now keeps running; the failure is reported.
            key = (spec.name, spec.version)
            tries = self._fetch_failures[key] = self._fetch_failures.get(key, 0) + 1
            self._failed[key] = self.clock() + min(RETRY_MAX_S, RETRY_BASE_S * 2 ** (tries - 1))
            self._set(SkillState(spec.name, previous, "failed", str(exc), spec.version, previous))
            return
        await self._stop(spec.name)
        await asyncio.to_thread(self.installs.activate, spec.name, spec.version)
        await self._ensure_running(spec.name, spec.version, spec.version, dict(spec.config))

    async def _ensure_running(
        self, name: str, version: str, desired: str, config: dict[str, str]
    ) -> None:
        proc = self.processes.get(name)
        if proc is not None and proc.alive:
            return
        current = await asyncio.to_thread(self.installs.current, name)
        if current is None:
            return
        try:
            self.processes[name] = await asyncio.to_thread(self._start, current.path, config)
        except (HealthCheckError, SandboxError, SkillError) as exc:
            await self._roll_back(name, version, desired, str(exc))
            return
        if version == desired:
            variant = ", ".join(f"{k}={v}" for k, v in sorted(self.processes[name].models.items()))
            self._set(
                SkillState(name, version, "running", "", desired, current.previous or "", variant)
            )

    def _start(self, skill_dir: Path, config: dict[str, str]) -> SkillProcess:
        manifest = Manifest.from_toml((skill_dir / "skill.toml").read_text(encoding="utf-8"))
        merged = {**dict(manifest.config), **config}
        self.log_dir.mkdir(parents=True, exist_ok=True)
        proc = SkillProcess(
            skill_dir,
            manifest,
            self.profile_targets,
            config=merged,
            log_path=self.log_dir / f"{manifest.name}-{manifest.version}.log",
            precisions=self.precisions,
        )
        proc.start()
        return proc

    async def _roll_back(self, name: str, failed: str, desired: str, error: str) -> None:
        self._failed[(name, failed)] = math.inf
        self.processes.pop(name, None)
        log.warning(
            "skill %s %s failed its health check: %s", name, failed, error.splitlines()[-1:]
        )
        try:
            restored = await asyncio.to_thread(self.installs.rollback, name)
        except InstallError:
            self._set(SkillState(name, "", "failed", error, desired, ""))
            return
        current = await asyncio.to_thread(self.installs.current, name)
        try:
            if current is not None:
                self.processes[name] = await asyncio.to_thread(self._start, current.path, {})
        except (HealthCheckError, SandboxError, SkillError) as exc:
            error = f"{error}\nprevious version {restored} failed too: {exc}"
        self._set(SkillState(name, restored, "rolled_back", error, desired, failed))

    async def _stop(self, name: str) -> None:
        proc = self.processes.pop(name, None)
        if proc is not None:
            await asyncio.to_thread(proc.stop)

    async def _remove(self, name: str) -> None:
        await self._stop(name)
        await asyncio.to_thread(self.installs.remove_skill, name)
        self.states.pop(name, None)
        self.on_change()

    async def shutdown(self) -> None:
        """Stop every control process."""
        for name in list(self.processes):
            await self._stop(name)

    def _set(self, state: SkillState) -> None:
        if self.states.get(state.name) != state:
            self.states[state.name] = state
            self.on_change()

    def report(self, generation: int) -> pb.ReportedState:
        """The report of every skill's state for ``generation``."""
        msg = pb.ReportedState(generation=generation)
        msg.skills.extend(
            s.to_message() for s in sorted(self.states.values(), key=lambda s: s.name)
        )
        return msg

    def running(self) -> dict[str, SkillProcess]:
        """Control processes that are alive, by skill name."""
        return {n: p for n, p in self.processes.items() if p.alive}

    def version_of(self, name: str) -> str:
        """Version the agent reports as active for ``name``."""
        state = self.states.get(name)
        return state.version if state else ""


__all__ = ["Reconciler", "SkillState"]
