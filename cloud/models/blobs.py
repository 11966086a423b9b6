"""A content-addressed blob store for model files: ``<root>/sha256/ab/cdef...``.

Blobs are written to a temporary file in their final folder, synced and renamed,
so a reader sees a whole blob or none. They are never modified; a blob left
behind by a call that failed later is unreferenced, never wrong.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path

from cloud.models.errors import BlobError

__all__ = ["MAX_BLOB_BYTES", "BlobStore"]

MAX_BLOB_BYTES = 2 * 1024**3
_CHUNK = 1 << 20
_HEX_RE = re.compile(r"[0-9a-f]{64}")


def _hash_file(path: Path, limit: int) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            size += len(chunk)
            if size > limit:
                raise BlobError(f"{path.name} is over the cap of {limit} bytes")
            digest.update(chunk)
    return digest.hexdigest(), size


class BlobStore:
    """Files by sha256 under one folder (the hub home's ``blobs/``)."""

    def __init__(self, root: Path, *, max_bytes: int = MAX_BLOB_BYTES) -> None:
        """Use ``root`` (created on first write); blobs over ``max_bytes`` are refused."""
        self.root = root
        self.max_bytes = max_bytes

    def path(self, sha256: str) -> Path:
        """Where a blob lives (whether or not it exists).

        Raises:
            BlobError: ``sha256`` is not 64 lower-case hex digits.
        """
        if not isinstance(sha256, str) or not _HEX_RE.fullmatch(sha256):
            raise BlobError(f"bad blob hash {sha256!r}")
        return self.root / "sha256" / sha256[:2] / sha256[2:]

    def has(self, sha256: str) -> bool:
        """Whether the blob exists.

        Raises:
            BlobError: A malformed hash.
        """
        return self.path(sha256).is_file()

    def put_file(self, source: Path) -> tuple[str, int]:
        """Store a copy of ``source``; returns its ``(sha256, size)``.

        Raises:
            BlobError: The file is unreadable or over the cap.
        """
        try:
            sha, size = _hash_file(source, self.max_bytes)
            final = self.path(sha)
            if final.is_file():
                return sha, size
            final.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=".", suffix=".part")
            try:
                os.fchmod(fd, 0o644)
                with os.fdopen(fd, "wb") as out, source.open("rb") as src:
                    shutil.copyfileobj(src, out, _CHUNK)
                    out.flush()
                    os.fsync(out.fileno())
                if _hash_file(Path(tmp), self.max_bytes) != (sha, size):
                    raise BlobError(f"{source.name} changed while it was stored")
                Path(tmp).replace(final)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as exc:
            raise BlobError(f"cannot store {source.name}: {exc}") from exc
        return sha, size

    def verify(self, sha256: str) -> Path:
        """Check a blob exists and matches its hash; return its path.

        Raises:
            BlobError: Missing, malformed hash, or the content does not match.
        """
        path = self.path(sha256)
        try:
            actual, _ = _hash_file(path, self.max_bytes)
        except OSError as exc:
            raise BlobError(f"blob {sha256[:12]} is missing or unreadable: {exc}") from exc
        if actual != sha256:
            raise BlobError(f"blob {sha256[:12]} is corrupt: its content hashes to {actual[:12]}")
        return path

    def export(self, sha256: str, dest: Path) -> Path:
        """Copy a verified blob to ``dest`` (atomically); returns ``dest``.

        Raises:
            BlobError: The blob is missing or corrupt, or ``dest`` cannot be written.
        """
        source = self.verify(sha256)
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(f".{dest.name}.part")
            shutil.copyfile(source, tmp)
            tmp.replace(dest)
        except OSError as exc:
            raise BlobError(f"cannot copy blob {sha256[:12]} to {dest}: {exc}") from exc
        # The copy is checked too: the blob could change between verify and copy.
        if _hash_file(dest, self.max_bytes)[0] != sha256:
            dest.unlink(missing_ok=True)
            raise BlobError(f"blob {sha256[:12]} changed while it was copied")
        return dest
