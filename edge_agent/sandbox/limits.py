"""Resource limits of a skill's control process, and how they cross into it.

The parent computes :class:`SandboxLimits` from the manifest and passes them
in ``EDGESKILL_*`` variables; the worker applies them to itself first thing,
before any skill code is imported. (Setting them in the parent between fork
and exec would need ``preexec_fn``, which is unsafe in a threaded agent.)
Soft and hard limits are set equal so skill code cannot raise them again.

Memory is the exception: the manifest's ``memory_mb`` caps *resident* memory,
which no rlimit measures, so the parent enforces it
(:class:`edge_agent.sandbox.memory.MemoryWatchdog`); the value still crosses
into the worker so that it is visible there. The device owner's address-space
cap (:class:`edge_agent.sandbox.policy.OwnerLimits`) is an rlimit, set high
enough for runtimes that reserve much more than they touch, as a backstop.
The process count (``RLIMIT_NPROC``) counts every process and thread of the
real user: one skill's own user when the agent confines it, the agent's user
otherwise.
"""

from __future__ import annotations

import resource
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from edge_agent.sandbox.env import (
    ENV_ADDRESS_SPACE_MB,
    ENV_CPU_SECONDS,
    ENV_MAX_OPEN_FILES,
    ENV_MAX_PROCESSES,
    ENV_MEMORY_MB,
)

__all__ = [
    "MAX_FILE_BYTES",
    "MIN_OPEN_FILES",
    "SandboxLimits",
]

#: Python, numpy and a backend open a few dozen files at start.
MIN_OPEN_FILES = 64
#: Largest file the process may write, its log included.
MAX_FILE_BYTES = 64 * 1024 * 1024
#: Seconds between the soft CPU limit (SIGXCPU) and the hard one (SIGKILL).
_CPU_GRACE_S = 2


class ResourcesLike(Protocol):
    """The part of :class:`skills.manifest.Resources` read here."""

    @property
    def memory_mb(self) -> int:
        """Memory the skill asks for, MiB."""
        ...

    @property
    def cpu_seconds(self) -> int | float:
        """CPU time the process may use in all, seconds; 0 for no limit."""
        ...

    @property
    def max_open_files(self) -> int:
        """Open file descriptors the process may hold."""
        ...


@dataclass(frozen=True)
class SandboxLimits:
    """Limits applied to one control process.

    Attributes:
        memory_mb: Resident-memory limit of the process tree, MiB, exactly as the manifest
            asks; enforced by the parent, not by an rlimit.
        cpu_seconds: CPU-time limit in seconds, counted from the process's start
            (interpreter and library imports take a few tenths); 0 for none.
        max_open_files: File-descriptor limit.
        address_space_mb: Address-space limit, MiB; 0 for none.
        max_processes: Processes and threads of the real user; 0 for none.
        busy_window_s: Seconds a skill may burn CPU with no item in flight before the
            watchdog kills it as a busy loop; 0 turns the check off. Not an rlimit.
        busy_cpu_fraction: CPU (in cores) averaged over ``busy_window_s`` that counts
            as busy.
    """

    memory_mb: int
    cpu_seconds: int
    max_open_files: int
    address_space_mb: int = 0
    max_processes: int = 0
    busy_window_s: float = 0.0
    busy_cpu_fraction: float = 0.9

    @classmethod
    def from_resources(cls, resources: ResourcesLike) -> SandboxLimits:
        """Limits for a manifest's resources, with the floors applied."""
        cpu = int(resources.cpu_seconds)
        if cpu < resources.cpu_seconds:  # round a fractional limit up, never to 0
            cpu += 1
        return cls(
            memory_mb=int(resources.memory_mb),
            cpu_seconds=max(cpu, 0),
            max_open_files=max(int(resources.max_open_files), MIN_OPEN_FILES),
        )

    def to_env(self) -> dict[str, str]:
        """The variables that carry these limits into the worker."""
        return {
            ENV_MEMORY_MB: str(self.memory_mb),
            ENV_CPU_SECONDS: str(self.cpu_seconds),
            ENV_MAX_OPEN_FILES: str(self.max_open_files),
            ENV_ADDRESS_SPACE_MB: str(self.address_space_mb),
            ENV_MAX_PROCESSES: str(self.max_processes),
        }

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> SandboxLimits:
        """Read the limits back in the worker.

        Raises:
            ValueError: A variable is missing or not a non-negative integer.
        """
        values = []
        keys = (ENV_MEMORY_MB, ENV_CPU_SECONDS, ENV_MAX_OPEN_FILES)
        for key in (*keys, ENV_ADDRESS_SPACE_MB, ENV_MAX_PROCESSES):
            raw = env.get(key, "0" if key not in keys else "")
            if not raw.isdigit():
                raise ValueError(f"{key}={raw!r} is not a non-negative integer")
            values.append(int(raw))
        return cls(
            memory_mb=values[0],
            cpu_seconds=values[1],
            max_open_files=values[2],
            address_space_mb=values[3],
            max_processes=values[4],
        )

    def apply(self) -> None:
        """Set the rlimits on the calling process (the worker does this at start).

        Memory is not among them: see the module's docstring.

        Raises:
            OSError: The kernel refused a limit.
            ValueError: A limit is out of the kernel's range.
        """
        if self.cpu_seconds > 0:
            _set_limit(resource.RLIMIT_CPU, self.cpu_seconds, self.cpu_seconds + _CPU_GRACE_S)
        _set_limit(resource.RLIMIT_NOFILE, self.max_open_files)
        _set_limit(resource.RLIMIT_FSIZE, MAX_FILE_BYTES)
        _set_limit(resource.RLIMIT_CORE, 0)
        if self.address_space_mb > 0:
            _set_limit(resource.RLIMIT_AS, self.address_space_mb * 1024 * 1024)
        if self.max_processes > 0:
            _set_limit(resource.RLIMIT_NPROC, self.max_processes)


def _set_limit(which: int, soft: int, hard: int | None = None) -> None:
    """Lower a limit; never above the current hard limit, which only root may raise."""
    _, current_hard = resource.getrlimit(which)
    hard = soft if hard is None else hard
    if current_hard != resource.RLIM_INFINITY:
        soft, hard = min(soft, current_hard), min(hard, current_hard)
    resource.setrlimit(which, (soft, hard))
