"""Reading what the repository serves: ``metadata/<file>.json`` and ``targets/<...>``.

Every path comes from a device, so it is checked before it touches the disk:
only the two served folders, no ``..``, no escape through links.

Serving is on the hub's hot path (each device fetches a handful of small files
per upgrade), so the path is checked by its text, the served folder is resolved
once, and the file is opened one part at a time without following links; only
a path that passes through a link pays for resolving it, and it is served only
if it resolves inside its folder. Small files are read whole and kept (see
:mod:`skills.trust._file_cache`). What is resolved and kept belongs to the
repository's :class:`ServedFolder`, not to the process.
"""

from __future__ import annotations

import errno
import io
import os
import stat
import threading
import time
from pathlib import Path
from typing import BinaryIO

from skills.errors import TrustError
from skills.trust._file_cache import SmallFileCache
from skills.trust._names import is_safe_relpath

_MAX_SERVED_PATH = 400
#: Files up to this size are read whole at open, and cached (TUF metadata, most bundles).
_SMALL_FILE_BYTES = 64 * 1024
_CACHE_BYTES = 16 * 1024 * 1024
_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
_NO_LINK = getattr(os, "O_NOFOLLOW", 0)
#: Without O_NOFOLLOW and dir_fd every path takes the resolving check.
_CAN_REFUSE_LINKS = bool(_NO_LINK) and os.open in os.supports_dir_fd
_DIR_FLAGS = _FLAGS | _NO_LINK | getattr(os, "O_DIRECTORY", 0)


class ServedFolder:
    """The files one repository folder serves, and what is kept to serve them cheaply.

    It keeps, for its life, the served folders resolved (once each) and the bytes of
    small files (while ``lstat`` says they are unchanged); one per repository, so
    repositories never share them. Safe to share between threads.

    Args:
        root: The repository folder.
        small_files: Where small files are kept; by default a cache of its own.
    """

    def __init__(self, root: Path, small_files: SmallFileCache | None = None) -> None:
        self._root = os.fspath(root)
        if small_files is None:
            small_files = SmallFileCache(_SMALL_FILE_BYTES, _CACHE_BYTES)
        self._small_files = small_files
        self._bases: dict[str, str] = {}
        self._bases_lock = threading.Lock()

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
        top, rest = _checked(path)
        base = self._real_base(top)
        full = f"{base}/{rest}"
        data = self._cached(full)
        if data is not None:
            return len(data), io.BytesIO(data)
        fd = _open_inside(base, rest, path, top)
        handle: BinaryIO | None = None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise FileNotFoundError(path)
            if info.st_size > _SMALL_FILE_BYTES:
                handle = os.fdopen(fd, "rb")
                return info.st_size, handle
            # One read: a short read of a regular file is its end.
            data = os.read(fd, info.st_size + 1)
        finally:
            if handle is None:
                os.close(fd)
        self._small_files.put(full, info, data, time.time_ns())
        return info.st_size, io.BytesIO(data)

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

    def _real_base(self, top: str) -> str:
        """The served folder ``top`` with its links resolved, once per folder."""
        base = self._bases.get(top)
        if base is None:
            real = Path(self._root, top).resolve()
            base = str(real)
            if real.is_dir():  # a folder not made yet is resolved again next time
                with self._bases_lock:
                    self._bases[top] = base
        return base

    def _cached(self, full: str) -> bytes | None:
        """The cached bytes of ``full`` if it is still the file they were read from."""
        if full not in self._small_files:
            return None
        try:
            # Not following a last link: a link stats as itself, never as a cached file.
            info = os.lstat(full)
        except OSError:
            return None
        return self._small_files.get(full, info)


class ServedFiles:
    """The read side of a repository class: serving through its :class:`ServedFolder`."""

    #: Made by the repository's constructor, for the repository's folder.
    _served: ServedFolder

    def open_file(self, path: str) -> tuple[int, BinaryIO]:
        """Open a served file (see :meth:`ServedFolder.open_file`); the caller closes it.

        Raises:
            TrustError: The path is malformed or points outside the served folders.
            FileNotFoundError: There is no such file.
        """
        return self._served.open_file(path)

    def read(self, path: str, max_bytes: int) -> bytes:
        """Read a served file of at most ``max_bytes`` whole (see :meth:`ServedFolder.read`).

        Raises:
            TrustError: Bad path, or the file is larger than ``max_bytes``.
            FileNotFoundError: There is no such file.
        """
        return self._served.read(path, max_bytes)


def _checked(path: str) -> tuple[str, str]:
    """Split ``path`` into its served folder and the safe relative path under it.

    Raises:
        TrustError: Not ``metadata/<name>.json`` or ``targets/<safe path>``.
    """
    top, _, rest = path.partition("/") if isinstance(path, str) else ("", "", "")
    ok = top in {"metadata", "targets"} and is_safe_relpath(rest, _MAX_SERVED_PATH)
    if ok and top == "metadata":
        ok = "/" not in rest and rest.endswith(".json")
    if not ok:
        raise TrustError(f"bad repository path {path!r}")
    return top, rest


def _open_inside(base: str, rest: str, path: str, top: str) -> int:
    """Open ``base/rest`` for reading; through a link only if it stays inside ``base``.

    Raises:
        TrustError: A link leads outside ``base``.
        FileNotFoundError: No such file (or a file where ``rest`` names a folder).
        OSError: Another failure to open.
    """
    if _CAN_REFUSE_LINKS:
        try:
            return _open_without_links(base, rest)
        except OSError as exc:
            # A link on the way: ELOOP for the file, ENOTDIR for a folder (as for a file).
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
    full = os.path.realpath(f"{base}/{rest}")
    if not full.startswith(f"{base}/"):
        raise TrustError(f"repository path {path!r} leaves {top}/")
    try:
        return os.open(full, _FLAGS)
    except NotADirectoryError as exc:
        raise FileNotFoundError(path) from exc


def _open_without_links(base: str, rest: str) -> int:
    """Open ``base/rest`` (``base`` already resolved), refusing any link in ``rest``.

    Raises:
        OSError: As :func:`os.open`: ``ELOOP`` for a link as the file, ``ENOTDIR`` for a
            link (or a file) as a folder.
    """
    *folders, name = rest.split("/")
    if not folders:
        return os.open(f"{base}/{name}", _FLAGS | _NO_LINK)
    dir_fd = os.open(f"{base}/{folders[0]}", _DIR_FLAGS)
    try:
        for folder in folders[1:]:
            inner = os.open(folder, _DIR_FLAGS, dir_fd=dir_fd)
            os.close(dir_fd)
            dir_fd = inner
        return os.open(name, _FLAGS | _NO_LINK, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
