"""Small served files kept in memory while the file system says they are unchanged.

A fleet upgrade asks for the same few small files thousands of times (TUF
metadata, bundles); one ``lstat`` tells whether the cached bytes are still the
file's, where opening, reading and closing it again takes four calls.

The bytes are keyed on the file's identity: device, inode, size, and the
modification and change times. The repository never rewrites a file in place
(it writes a new one and renames it over the old), so a changed file is a new
inode. An inode number freed by such a rename can be given to a later file,
though, and file times are coarse (a clock tick); a file changed within
:data:`SETTLE_NS` of being cached is therefore not cached, so a later file
cannot carry the same times as a cached one. This module does no I/O.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

__all__ = ["SETTLE_NS", "SmallFileCache"]

#: How old a file's last change must be before its bytes are cached.
SETTLE_NS = 2_000_000_000


@dataclass(frozen=True, slots=True)
class _Entry:
    identity: tuple[int, int, int, int, int]
    data: bytes


def _identity(info: os.stat_result) -> tuple[int, int, int, int, int]:
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


class SmallFileCache:
    """The bytes of recently served small files, by path; safe to share between threads.

    Args:
        max_file_bytes: Larger files are not cached.
        max_total_bytes: The most bytes held; the oldest entries make room.

    Raises:
        ValueError: A negative cap.
    """

    def __init__(self, max_file_bytes: int, max_total_bytes: int) -> None:
        if max_file_bytes < 0 or max_total_bytes < 0:
            raise ValueError("cache caps must be >= 0")
        self.max_file_bytes = max_file_bytes
        self.max_total_bytes = max_total_bytes
        self._entries: dict[str, _Entry] = {}
        self._total = 0
        self._lock = threading.Lock()

    def __contains__(self, path: object) -> bool:
        """Whether bytes are held for ``path`` (still to be checked with :meth:`get`)."""
        return path in self._entries

    def get(self, path: str, info: os.stat_result) -> bytes | None:
        """The bytes held for ``path`` if ``info`` (its ``lstat`` now) names their file."""
        entry = self._entries.get(path)
        if entry is None or entry.identity != _identity(info):
            return None
        return entry.data

    def put(self, path: str, info: os.stat_result, data: bytes, now_ns: int) -> None:
        """Hold ``data``, read from ``path`` whose ``fstat`` was ``info``, if it may be cached.

        Not cached: a file over the size cap, bytes that disagree with ``info``'s size
        (the file changed while read), or a file changed less than :data:`SETTLE_NS`
        before ``now_ns`` (wall-clock nanoseconds, the clock of file times).
        """
        if (
            len(data) != info.st_size
            or len(data) > min(self.max_file_bytes, self.max_total_bytes)
            or now_ns - max(info.st_mtime_ns, info.st_ctime_ns) < SETTLE_NS
        ):
            return
        with self._lock:
            old = self._entries.pop(path, None)
            self._total -= len(old.data) if old else 0
            while self._entries and self._total + len(data) > self.max_total_bytes:
                self._total -= len(self._entries.pop(next(iter(self._entries))).data)
            self._entries[path] = _Entry(_identity(info), data)
            self._total += len(data)
