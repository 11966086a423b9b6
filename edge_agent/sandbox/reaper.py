"""Every process of a skill's user, found through ``/proc`` and killed.

A skill confined to its own user id cannot hide a process from this: leaving
its process group or session (``setsid``), or being reparented to init, does
not change the owner of ``/proc/<pid>``. Killing repeats until none is left,
because a process may fork between the scan and the signal.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

__all__ = ["kill_user", "processes_of"]

_PROC = Path("/proc")
_MAX_ROUNDS = 200


def processes_of(uid: int) -> list[int]:
    """Ids of the live (not zombie) processes whose owner is ``uid``."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(_PROC):
            if not entry.name.isdigit():
                continue
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                state = (_PROC / entry.name / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue  # gone meanwhile
            if state not in ("Z", "X"):
                found.append(int(entry.name))
    return found


def kill_user(uid: int, timeout_s: float = 5.0) -> int:
    """SIGKILL every process of ``uid`` until none is left or ``timeout_s`` passes.

    Never call it with the agent's own user id.

    Args:
        uid: The skill's user id.
        timeout_s: Longest time to keep killing.

    Returns:
        How many processes were still alive at the end (0 when all are gone).

    Raises:
        ValueError: ``uid`` is the caller's own user id or root's.
    """
    if uid in (0, os.getuid(), os.geteuid()):
        raise ValueError(f"refusing to kill every process of user {uid}")
    deadline = time.monotonic() + timeout_s
    for _ in range(_MAX_ROUNDS):
        pids = processes_of(uid)
        if not pids or time.monotonic() > deadline:
            return len(pids)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)
    return len(processes_of(uid))
