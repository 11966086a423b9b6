"""Serving repository files to devices in chunks, and the wire codes of its refusals.

Both transports serve fetches through :meth:`cloud.hubcore.HubCore.open_fetch`;
this module checks the path, the offset and the size caps, opens the file in
the TUF repository and streams it, and maps each refusal to its wire code.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import BinaryIO

from cloud.errors import FetchRefusedError, FetchTooLargeError
from protos.fetch import FetchErrorCode
from skills.errors import SkillError
from skills.trust import TrustRepository

__all__ = ["fetch_error_code", "open_repository_file"]


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
