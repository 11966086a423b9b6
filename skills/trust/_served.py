"""Reading what the repository serves: ``metadata/<file>.json`` and ``targets/<...>``.

Every path comes from a device, so it is checked before it touches the disk:
only the two served folders, no ``..``, no escape through links.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

from skills.errors import TrustError
from skills.trust._names import is_safe_relpath

_MAX_SERVED_PATH = 400


class ServedFiles:
    """The read side of a repository folder, shared by every hub process."""

    _dir: Path

    def open_file(self, path: str) -> tuple[int, BinaryIO]:
        """Open a served file: ``metadata/<file>`` or ``targets/<...>``.

        Args:
            path: The path relative to the repository, as a client asks for it.

        Returns:
            The file's size and the file opened for binary reading (caller closes it).

        Raises:
            TrustError: The path is malformed or points outside the served folders.
            FileNotFoundError: There is no such file.
        """
        full = self._served(path)
        try:
            handle = full.open("rb")
        except IsADirectoryError as exc:
            raise FileNotFoundError(path) from exc
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            handle.close()
            raise FileNotFoundError(path)
        return info.st_size, handle

    def read(self, path: str, max_bytes: int) -> bytes:
        """Read a served file whole.

        Args:
            path: As for :meth:`open_file`.
            max_bytes: The most the caller accepts.

        Returns:
            The file's content.

        Raises:
            TrustError: Bad path, or the file is larger than ``max_bytes``.
            FileNotFoundError: There is no such file.
        """
        size, handle = self.open_file(path)
        with handle:
            # Checked before and after reading: the file may grow in between.
            data = handle.read(max_bytes + 1) if size <= max_bytes else b""
        if size > max_bytes or len(data) > max_bytes:
            raise TrustError(f"{path} is larger than the cap of {max_bytes} bytes")
        return data

    def _served(self, path: str) -> Path:
        top, _, rest = path.partition("/") if isinstance(path, str) else ("", "", "")
        ok = top in {"metadata", "targets"} and is_safe_relpath(rest, _MAX_SERVED_PATH)
        if ok and top == "metadata":
            ok = "/" not in rest and rest.endswith(".json")
        if not ok:
            raise TrustError(f"bad repository path {path!r}")
        base = (self._dir / top).resolve()
        full = (base / rest).resolve()
        if not full.is_relative_to(base):
            raise TrustError(f"repository path {path!r} leaves {top}/")
        return full
