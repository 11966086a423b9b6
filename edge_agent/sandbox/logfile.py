"""The log file a control process's stderr goes to, and its tail for error messages."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import IO

__all__ = ["SkillLog"]

#: A log larger than this when a process starts is moved to ``<name>.1`` first.
ROTATE_BYTES = 8 * 1024 * 1024
#: Bytes of the log quoted in an error message.
TAIL_BYTES = 2000


class SkillLog:
    """One skill's log file.

    Args:
        path: The file; its folder is created when needed.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._run_offset = 0

    def open_for_run(self, label: str) -> IO[bytes]:
        """Rotate if large, write a start marker, and open for appending (for the child).

        Raises:
            OSError: The file or its folder cannot be created or written.
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists() and self.path.stat().st_size > ROTATE_BYTES:
            self.path.replace(self.path.with_name(self.path.name + ".1"))
        log = self.path.open("ab")
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        log.write(f"--- {stamp} starting {label}\n".encode())
        log.flush()
        self._run_offset = log.tell()
        return log

    def tail(self) -> str:
        """The end of what this run wrote, as a block to append to a message; "" if none."""
        try:
            with self.path.open("rb") as log:
                size = log.seek(0, os.SEEK_END)
                log.seek(max(self._run_offset, size - TAIL_BYTES))
                text = log.read(TAIL_BYTES).decode("utf-8", "replace").strip()
        except OSError:
            return ""
        return f"\n--- log tail ---\n{text}" if text else ""
