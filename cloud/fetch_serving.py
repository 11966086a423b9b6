"""Serving repository files to devices in chunks, and the wire codes of its refusals.

Both transports serve fetches through :meth:`cloud.hubcore.HubCore.open_fetch`;
this module checks the path, the offset and the size caps, opens the file in
the TUF repository and streams it, and maps each refusal to its wire code.
:func:`open_files` opens the files of a batch together, each with its first
chunk read, so a batch of small files costs the event loop one worker-thread hop.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import BinaryIO

from cloud.errors import FetchRefusedError, FetchTooLargeError
from protos.fetch import FetchErrorCode
from skills.errors import SkillError
from skills.trust import TrustRepository

__all__ = ["FetchAsk", "OpenedFile", "fetch_error_code", "open_files", "open_repository_file"]

#: ``(path, offset, max_bytes)`` of one file asked for.
FetchAsk = tuple[str, int, int]
#: Opens one file as :meth:`cloud.hubcore.HubCore.open_fetch` does.
OpenFn = Callable[[str, int, int], tuple[int, Generator[bytes, None, None]]]


@dataclass(frozen=True, slots=True)
class OpenedFile:
    """A repository file opened for a fetch, its first chunk read already.

    Attributes:
        offset: Where ``head`` starts in the file.
        size: The file's total size.
        head: The first chunk (empty when ``offset`` is the file's end).
        rest: The chunks after ``head``; the caller closes it.
    """

    offset: int
    size: int
    head: bytes
    rest: Generator[bytes, None, None]


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


def open_files(
    open_fetch: OpenFn, asks: Sequence[FetchAsk]
) -> list[OpenedFile | FileNotFoundError | FetchRefusedError]:
    """Open each file of a batch and read its first chunk; blocking (run it on a worker).

    Returns:
        For each ask in order, the opened file or the refusal ``open_fetch`` raised.

    Raises:
        OSError: a failure other than a refusal (the files opened so far are closed).
    """
    opened: list[OpenedFile | FileNotFoundError | FetchRefusedError] = []
    try:
        for path, offset, max_bytes in asks:
            try:
                size, chunks = open_fetch(path, offset, max_bytes)
            except (FileNotFoundError, FetchRefusedError) as exc:
                opened.append(exc)
                continue
            try:
                head = next(chunks, b"") if offset < size else b""
            except BaseException:
                chunks.close()
                raise
            opened.append(OpenedFile(offset, size, head, chunks))
    except BaseException:
        for item in opened:
            if isinstance(item, OpenedFile):
                item.rest.close()
        raise
    return opened


def open_repository_file(
    trust: TrustRepository,
    path: str,
    offset: int,
    cap: int,
    chunk_bytes: int,
) -> tuple[int, Generator[bytes, None, None]]:
    """Open a repository file for a chunked fetch from ``offset``.

    Args:
        trust: The TUF repository the file is served from.
        path: Its path under the repository (``metadata/...`` or ``targets/...``).
        offset: Where the first chunk starts.
        cap: The largest file served.
        chunk_bytes: The size of each chunk (the last may be shorter).

    Returns:
        The file's total size and an iterator of chunks.

    Raises:
        FileNotFoundError: no such file.
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
    fh.seek(offset)
    return size, _chunks(fh, chunk_bytes)


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


def _chunks(fh: BinaryIO, size: int) -> Generator[bytes, None, None]:
    with fh:
        while chunk := fh.read(size):
            yield chunk
