"""File-system helpers for the repository: atomic writes, a cross-process lock, staging."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from protos.atomic import TMP_PREFIX, write_atomic
from skills.errors import TrustError

_CHUNK = 1024 * 1024
STAGE_PREFIX = ".stage-"


def atomic_write(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the new one, never half.

    Raises:
        OSError: The folder cannot be written.
    """
    write_atomic(path, data, mode)


@contextlib.contextmanager
def exclusive_lock(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_path`` (created if absent).

    flock locks belong to the open file description, so this excludes other
    processes and other threads of this one alike.

    Raises:
        OSError: The lock file cannot be opened.
    """
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def stage_copy(source: Path, folder: Path, max_bytes: int) -> tuple[Path, str, int]:
    """Copy ``source`` into a temporary file in ``folder`` while hashing the copy.

    Hashing the copy rather than the source means a source changing under us
    cannot make a signed hash disagree with the bytes that are served.

    Args:
        source: The file to copy.
        folder: Where the temporary copy goes (same file system as its final place).
        max_bytes: The largest acceptable source.

    Returns:
        The temporary copy (the caller moves or deletes it), its SHA-256 and length.

    Raises:
        TrustError: ``source`` is larger than ``max_bytes``.
        OSError: ``source`` cannot be read or ``folder`` written.
    """
    digest = hashlib.sha256()
    length = 0
    fd, name = tempfile.mkstemp(dir=folder, prefix=f"{STAGE_PREFIX}{os.getpid()}-")
    staged = Path(name)
    try:
        with source.open("rb") as src, os.fdopen(fd, "wb") as dst:
            while chunk := src.read(_CHUNK):
                length += len(chunk)
                if length > max_bytes:
                    raise TrustError(f"{source} is larger than {max_bytes} bytes")
                digest.update(chunk)
                dst.write(chunk)
            dst.flush()
            os.fchmod(dst.fileno(), 0o644)
            os.fsync(dst.fileno())
    except BaseException:
        staged.unlink(missing_ok=True)
        raise
    return staged, digest.hexdigest(), length


def clean_leftovers(staging: Path, metadata: Path) -> list[str]:
    """Delete what killed writers left: staged copies of dead processes, half-written files.

    Call with the repository lock held: then no ``.tmp-`` file is being
    written, while a staged copy may still belong to a live process that is
    waiting for the lock, so only those of dead processes go.

    Args:
        staging: The folder staged copies are made in.
        metadata: The folder metadata is written in.

    Returns:
        The names removed.

    Raises:
        OSError: A folder cannot be listed or a file removed.
    """
    removed = []
    for path in sorted(staging.glob(f"{STAGE_PREFIX}*")):
        pid = path.name[len(STAGE_PREFIX) :].split("-", 1)[0]
        if not (pid.isdigit() and _alive(int(pid))):
            path.unlink(missing_ok=True)
            removed.append(path.name)
    for path in sorted(metadata.glob(f"{TMP_PREFIX}*")):
        path.unlink(missing_ok=True)
        removed.append(path.name)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
