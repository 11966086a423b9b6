"""The memory limit of a skill: resident memory of its process tree, watched from the parent.

An address-space limit (``RLIMIT_AS``) is a poor fit: ONNX Runtime, OpenVINO
and numpy reserve hundreds of MiB of address space they never touch, so a
limit low enough to mean anything breaks them, and one high enough to let
them start means nothing. What a device runs out of is resident memory, so
the agent measures that instead: a watchdog thread sums the resident set of
the control process and every process below it a few times a second and
kills the group when the sum passes the manifest's ``memory_mb``.

A skill can overshoot the limit by what it allocates in one polling interval
before it is stopped.

The same thread watches for busy loops: a skill that burns more than a
fraction of a core for a whole window while no item is in flight is killed
too. When the skill runs as a user of its own, "its processes" are every
process of that user, so one that left the process tree still counts.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["BusyRule", "MemoryWatchdog", "cpu_seconds", "tree_pids", "tree_rss_bytes"]

_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_PROC = Path("/proc")
#: Seconds between two measurements.
POLL_S = 0.1
_MAX_TREE = 4096


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = list((_PROC / str(pid) / "task").iterdir())
    except OSError:
        return found
    for task in tasks:
        with contextlib.suppress(OSError, ValueError):
            found.extend(int(c) for c in (task / "children").read_text().split())
    return found


def _rss_bytes(pid: int) -> int:
    try:
        fields = (_PROC / str(pid) / "statm").read_text().split()
        return int(fields[1]) * _PAGE_BYTES
    except (OSError, ValueError, IndexError):
        return 0  # the process is gone


def tree_pids(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    todo = [pid]
    seen: dict[int, None] = {}
    while todo and len(seen) < _MAX_TREE:
        current = todo.pop()
        if current not in seen:
            seen[current] = None
            todo.extend(_children(current))
    return list(seen)


def tree_rss_bytes(pid: int) -> int:
    """Resident bytes of ``pid`` and every process below it (0 once it is gone)."""
    return sum(_rss_bytes(p) for p in tree_pids(pid))


def cpu_seconds(pid: int) -> float:
    """User and system CPU time a process has used (0 once it is gone)."""
    try:
        fields = (_PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
    except (OSError, ValueError, IndexError):
        return 0.0


@dataclass(frozen=True)
class BusyRule:
    """When a skill counts as a busy loop.

    Attributes:
        window_s: How long it must burn CPU with no item in flight.
        cpu_fraction: The CPU, in cores, averaged over the window, that counts as burning.
        idle_since: Monotonic time since which no item has been in flight, or ``None``
            while one is.
    """

    window_s: float
    cpu_fraction: float
    idle_since: Callable[[], float | None]


class _CpuMeter:
    """CPU used by a changing set of processes over a sliding window."""

    def __init__(self, window_s: float) -> None:
        self._window_s = window_s
        self._last: dict[int, float] = {}
        self._samples: deque[tuple[float, float]] = deque()

    def sample(self, pids: Iterable[int], now: float) -> float:
        """Record one measurement; returns the CPU seconds used within the window."""
        current = {pid: cpu_seconds(pid) for pid in pids}
        used = sum(max(0.0, cpu - self._last.get(pid, 0.0)) for pid, cpu in current.items())
        self._last = current
        self._samples.append((now, used))
        while self._samples and self._samples[0][0] < now - self._window_s:
            self._samples.popleft()
        return sum(u for _, u in self._samples)


class MemoryWatchdog:
    """Kills a skill when its resident memory passes a limit, or when it busy-loops.

    Args:
        pid: The leader of the group (the control process).
        limit_mb: The limit in MiB.
        on_kill: Called with the reason (``"killed: memory 530 MB over the 256 MB limit"``)
            just before the group is killed.
        members: The skill's processes; the tree below ``pid`` by default.
        kill: Kills the skill; signals the process group of ``pid`` by default.
        busy: When to kill a busy loop; never by default.
    """

    def __init__(
        self,
        pid: int,
        limit_mb: int,
        on_kill: Callable[[str], None],
        *,
        members: Callable[[], list[int]] | None = None,
        kill: Callable[[], None] | None = None,
        busy: BusyRule | None = None,
    ) -> None:
        self._pid = pid
        self._limit_mb = limit_mb
        self._on_kill = on_kill
        self._members = members or (lambda: tree_pids(pid))
        self._kill = kill or self._kill_group
        self._busy = busy
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"skill-memory-{pid}", daemon=True)

    def start(self) -> None:
        """Start watching in a daemon thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop watching; safe to call more than once and from the watchdog's own callback."""
        self._stopped.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=2 * POLL_S + 1.0)

    def _kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._pid, signal.SIGKILL)

    def _watch(self) -> None:
        limit = self._limit_mb * 1024 * 1024
        meter = _CpuMeter(self._busy.window_s) if self._busy is not None else None
        while not self._stopped.wait(POLL_S):
            pids = self._members()
            used = sum(_rss_bytes(p) for p in pids)
            reason = None
            if used > limit:
                reason = (
                    f"killed: memory {used // (1024 * 1024)} MB over the {self._limit_mb} MB limit"
                )
            elif meter is not None and self._busy is not None:
                reason = self._busy_reason(meter, pids, self._busy)
            if reason is not None:
                self._on_kill(reason)
                self._kill()
                return

    @staticmethod
    def _busy_reason(meter: _CpuMeter, pids: list[int], rule: BusyRule) -> str | None:
        now = time.monotonic()
        burned = meter.sample(pids, now)
        idle_since = rule.idle_since()
        if idle_since is None or now - idle_since < rule.window_s:
            return None
        if burned < rule.cpu_fraction * rule.window_s:
            return None
        return (
            f"killed: busy loop, {burned:.1f} s of CPU in {rule.window_s:g} s "
            "with no item in flight"
        )
