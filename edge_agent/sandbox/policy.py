"""The device owner's caps on skills, and how a manifest's requests are clamped to them.

A skill's manifest may only *lower* what the owner allows: a request above a
cap is clamped to the cap and the clamp is reported (never raised), and a
request for the network is honoured only where the owner allows it at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from edge_agent.sandbox.limits import MIN_OPEN_FILES, SandboxLimits

__all__ = ["Clamped", "OwnerLimits"]


class RequestedResources(Protocol):
    """The part of :class:`skills.manifest.Resources` a clamp reads."""

    @property
    def memory_mb(self) -> int:
        """Resident memory asked for, MiB."""
        ...

    @property
    def cpu_seconds(self) -> int:
        """CPU time asked for in all, seconds; 0 for no limit."""
        ...

    @property
    def max_open_files(self) -> int:
        """Open files asked for."""
        ...

    @property
    def max_processes(self) -> int:
        """Processes and threads asked for; 0 for the owner's cap."""
        ...

    @property
    def network(self) -> bool:
        """Whether the skill asks for the network."""
        ...


@dataclass(frozen=True)
class Clamped:
    """A manifest's request after the owner's caps.

    Attributes:
        limits: The limits the control process runs under.
        network: Whether it gets the network.
        notes: One line per request that was lowered or refused, for the skill's state.
    """

    limits: SandboxLimits
    network: bool
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class OwnerLimits:
    """Caps the device owner sets for every skill (agent configuration).

    Attributes:
        memory_mb: Largest resident memory of one skill's processes, MiB.
        cpu_seconds: Largest CPU time of one control process in all; 0 for no cap.
        address_space_mb: Address-space rlimit of every control process, MiB; high,
            because runtimes reserve much more than they touch; 0 for none.
        max_processes: Processes and threads one skill may run at once.
        max_open_files: Open files of one control process.
        allow_network: Whether a manifest may ask for the network at all.
        busy_window_s: A skill burning ``busy_cpu_fraction`` of a core for this long
            while no item is in flight is killed as a busy loop; 0 turns it off.
        busy_cpu_fraction: The CPU (cores) that counts as busy.
        uid_base: First user id given to skills when the agent runs as root.
        uid_count: How many user ids from ``uid_base`` skills may use.
    """

    memory_mb: int = 2048
    cpu_seconds: int = 0
    address_space_mb: int = 16 * 1024
    max_processes: int = 256
    max_open_files: int = 1024
    allow_network: bool = True
    busy_window_s: float = 10.0
    busy_cpu_fraction: float = 0.9
    uid_base: int = 61000
    uid_count: int = 4000

    def __post_init__(self) -> None:
        """Check the caps.

        Raises:
            ValueError: A cap is out of range.
        """
        if self.memory_mb < 1 or self.max_processes < 1 or self.cpu_seconds < 0:
            raise ValueError("memory_mb and max_processes must be >= 1, cpu_seconds >= 0")
        if self.max_open_files < MIN_OPEN_FILES or self.address_space_mb < 0:
            raise ValueError(f"max_open_files must be >= {MIN_OPEN_FILES}, address space >= 0")
        if self.busy_window_s < 0 or self.busy_cpu_fraction <= 0:
            raise ValueError("busy_window_s must be >= 0 and busy_cpu_fraction > 0")
        top = self.uid_base + self.uid_count
        if self.uid_base < 1000 or self.uid_count < 1 or top > 1 << 31:
            raise ValueError("skill user ids must lie in [1000, 2**31)")

    def clamp(self, asked: RequestedResources) -> Clamped:
        """The limits a skill runs under: what it asks, never more than the caps.

        Args:
            asked: The manifest's resources.

        Returns:
            The limits, the network decision and a note for each lowered request.
        """
        notes: list[str] = []

        def cap(what: str, value: int, ceiling: int) -> int:
            if ceiling and (value == 0 or value > ceiling):
                if value:
                    notes.append(f"{what} {value} clamped to the device's cap {ceiling}")
                return ceiling
            return value

        cpu = int(asked.cpu_seconds)
        if cpu < asked.cpu_seconds:
            cpu += 1
        limits = SandboxLimits(
            memory_mb=cap("memory_mb", int(asked.memory_mb), self.memory_mb),
            cpu_seconds=cap("cpu_seconds", max(cpu, 0), self.cpu_seconds),
            max_open_files=max(
                cap("max_open_files", int(asked.max_open_files), self.max_open_files),
                MIN_OPEN_FILES,
            ),
            address_space_mb=self.address_space_mb,
            max_processes=cap("max_processes", int(asked.max_processes), self.max_processes),
            busy_window_s=self.busy_window_s,
            busy_cpu_fraction=self.busy_cpu_fraction,
        )
        network = bool(asked.network) and self.allow_network
        if asked.network and not network:
            notes.append("network refused: the device does not allow skills the network")
        return Clamped(limits, network, tuple(notes))
