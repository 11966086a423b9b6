"""One agent per state folder: an exclusive lock held for the agent's lifetime.

Two agents on one state folder would share an outbox, installs and a device
identity, and both start the same skill; the second one refuses to start and
names the pid of the first.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from edge_agent.errors import AgentError

__all__ = ["LOCK_FILE", "hold_state_folder"]

LOCK_FILE = "agent.lock"
_MAX_PID_BYTES = 32


@contextlib.contextmanager
def hold_state_folder(state_dir: Path) -> Iterator[None]:
    """Hold the state folder's lock (creating the folder) until the block ends.

    Raises:
        AgentError: another process holds it, or the folder cannot be used.
    """
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(state_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise AgentError(f"cannot use the state folder {state_dir}: {exc}") from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, _MAX_PID_BYTES, 0).decode("ascii", "replace").strip()
            raise AgentError(
                f"another agent (pid {holder or 'unknown'}) already runs on {state_dir}; "
                "give each agent a --state-dir of its own"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing releases the lock
