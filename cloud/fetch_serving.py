"""Serving repository files to devices in chunks, and the wire codes of its refusals.

Both transports serve fetches through :meth:`cloud.hubcore.HubCore.open_fetch`;
this module checks the path, the offset and the size caps, opens the file in
the TUF repository and streams it, and maps each refusal to its wire code.
"""

from __future__ import annotations

import asyncio
from typing import BinaryIO

from cloud.errors import FetchRefusedError, FetchTooLargeError
from protos.fetch import FetchErrorCode
from skills.errors import SkillError
from skills.trust import TrustRepository

__all__ = ["FileChunks", "fetch_error_code", "next_chunk", "open_repository_file"]


def fetch_error_code(exc: Exception) -> FetchErrorCode:
    """The wire code a fetch refusal raised by :meth:`HubCore.open_fetch` is sent with.

    Raises:
        TypeError: ``exc`` is not a fetch refusal (a bug in the caller).
    """
    if isinstance(exc, FileNotFoundError):
        return FetchErrorCode.NOT_FOUND
    if isinstance(exc, FetchRefusedError):
        return exc.code
    raise TypeError(f"not a fetch refusal: {type(exc).__name__}")


def open_repository_file(
    trust: TrustRepository,
    path: str,
    offset: int,
    cap: int,
    chunk_bytes: int,
) -> tuple[int, FileChunks]:
    """Open a repository file for a chunked fetch from ``offset``, reading its first chunk.

    Args:
        trust: The TUF repository the file is served from.
        path: Its path under the repository (``metadata/...`` or ``targets/...``).
        offset: Where the first chunk starts.
        cap: The largest file served.
        chunk_bytes: The size of each chunk (the last may be shorter).

    Returns:
        The file's total size and its chunks (see :class:`FileChunks`).

    Raises:
        FileNotFoundError: no such file.
        OSError: the file cannot be read.
        FetchTooLargeError: the file is over ``cap``.
        FetchRefusedError: a bad path or an offset outside the file.
    """
    if not _under_served_folder(path):
        raise FetchRefusedError(f"bad fetch path {path!r}")
    try:
        size, fh = trust.open_file(path)
    except SkillError as exc:  # the trust repository refused the path
        raise FetchRefusedError(str(exc)) from exc
    if size > cap:
        fh.close()
        raise FetchTooLargeError(f"{path} has {size} bytes, over the {cap} byte cap")
    if offset < 0 or offset > size:
        fh.close()
        raise FetchRefusedError(f"offset {offset} outside {path}")
    try:
        fh.seek(offset)
        return size, FileChunks(fh, chunk_bytes)
    except BaseException:
        fh.close()
        raise


def _under_served_folder(path: str) -> bool:
    """Whether ``path`` is relative, under ``metadata/`` or ``targets/``, and has no ``..``.

    Read as :class:`pathlib.PurePosixPath` reads it (empty and ``.`` parts dropped),
    without building one: this runs for every fetch.
    """
    parts = [part for part in path.split("/") if part and part != "."]
    return (
        bool(parts)
        and parts[0] in ("metadata", "targets")
        and ".." not in parts
        and not path.startswith("/")
    )


class FileChunks:
    """An open repository file, read chunk by chunk; the first chunk is read as it opens.

    The hub opens a file on a worker thread and then reads each chunk on one
    (file reads stay off the event loop). Most files a device fetches are one
    chunk (metadata, a small bundle), so reading it in the thread that opens the
    file spares the second hop, which cost as much as the rest of serving the
    fetch; :func:`next_chunk` hands it out without one.
    """

    def __init__(self, fh: BinaryIO, chunk_bytes: int) -> None:
        """Read the first chunk of ``fh`` from where it stands (blocking)."""
        self._fh = fh
        self._chunk_bytes = chunk_bytes
        #: The chunk read at opening and not yet handed out (None: none left).
        self._ready: bytes | None = fh.read(chunk_bytes) or None
        if self._ready is None or len(self._ready) < chunk_bytes:
            fh.close()  # it ended within the first chunk: nothing more to read

    def __iter__(self) -> FileChunks:
        """The chunks themselves."""
        return self

    def __next__(self) -> bytes:
        """The next chunk (a blocking read unless it is the first).

        Raises:
            StopIteration: the file ended.
        """
        ready = self.take_ready()
        if ready is not None:
            return ready
        chunk = b"" if self._fh.closed else self._fh.read(self._chunk_bytes)
        if not chunk:
            self.close()
            raise StopIteration
        return chunk

    def take_ready(self) -> bytes | None:
        """The chunk read at opening, if not handed out yet; never blocks."""
        ready, self._ready = self._ready, None
        return ready

    def close(self) -> None:
        """Close the file; the chunk read at opening is dropped."""
        self._ready = None
        self._fh.close()


async def next_chunk(chunks: FileChunks) -> bytes | None:
    """The next chunk, or None at the end: the first without a hop, later ones off the loop."""
    ready = chunks.take_ready()
    if ready is not None:
        return ready
    return await asyncio.to_thread(next, chunks, None)
