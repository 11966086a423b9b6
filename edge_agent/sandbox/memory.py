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
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path

__all__ = ["MemoryWatchdog", "tree_rss_bytes"]

_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
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


def tree_rss_bytes(pid: int) -> int:
    """Resident bytes of ``pid`` and every process below it (0 once it is gone)."""
    total, todo = 0, [pid]
    seen: set[int] = set()
    while todo and len(seen) < _MAX_TREE:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        total += _rss_bytes(current)
        todo.extend(_children(current))
    return total


class MemoryWatchdog:
    """Kills a process group when its resident memory passes a limit.

    Args:
        pid: The leader of the group (the control process).
        limit_mb: The limit in MiB.
        on_kill: Called with the reason (``"killed: memory 530 MB over the 256 MB limit"``)
            just before the group is killed.
    """

    def __init__(self, pid: int, limit_mb: int, on_kill: Callable[[str], None]) -> None:
        self._pid = pid
        self._limit_mb = limit_mb
        self._on_kill = on_kill
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

    def _watch(self) -> None:
        limit = self._limit_mb * 1024 * 1024
        while not self._stopped.wait(POLL_S):
            used = tree_rss_bytes(self._pid)
            if used <= limit:
                continue
            self._on_kill(
                f"killed: memory {used // (1024 * 1024)} MB over the {self._limit_mb} MB limit"
            )
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._pid, signal.SIGKILL)
            return
