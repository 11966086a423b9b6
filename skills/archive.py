"""Safe extraction and deterministic writing of gzip-compressed tar archives.

Extraction never calls ``tarfile``'s own extract functions. The gzip stream is read
through a meter that counts every decompressed byte, so a decompression bomb is caught
by what is actually produced, not by what headers claim, and an oversized PAX or GNU
long-name header is cut off before ``tarfile`` buffers it. Each member is checked
(name, type, size, duplicates) before anything is written, and files are written by
this module with fixed permissions. On any error whatever was written is removed.
"""

from __future__ import annotations

import gzip
import os
import shutil
import stat
import tarfile
import tempfile
import zlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, cast

from skills._tar_write import DIR_MODE, FILE_MODE, write_tar_gz
from skills.errors import ArchiveError

__all__ = ["DEFAULT_LIMITS", "ArchiveLimits", "read_member", "safe_extract", "write_archive"]

_MIB = 1024 * 1024
_CHUNK = _MIB
_MAX_NAME_CHARS = 1024
_MAX_DEPTH = 32
_MAX_PART_BYTES = 255
# Decompressed bytes allowed for one member's headers (PAX, GNU long names) plus the
# 10 KiB that tarfile reads ahead; real headers are a few KiB at most.
_HEADER_BUDGET = 64 * 1024

_TYPE_NAMES = {
    tarfile.SYMTYPE: "symbolic link",
    tarfile.LNKTYPE: "hard link",
    tarfile.CHRTYPE: "character device",
    tarfile.BLKTYPE: "block device",
    tarfile.FIFOTYPE: "fifo",
}


@dataclass(frozen=True)
class ArchiveLimits:
    """Caps applied while reading an archive.

    Attributes:
        max_archive_bytes: Largest compressed archive accepted.
        max_entries: Most members (files and directories).
        max_total_bytes: Most file bytes written in total.
        max_file_bytes: Largest single file.
        max_ratio: Most decompressed bytes per compressed byte of the archive.
        ratio_floor_bytes: The ratio is enforced only past this many decompressed
            bytes, so tiny archives of very compressible text are not refused.
    """

    max_archive_bytes: int = 512 * _MIB
    max_entries: int = 4096
    max_total_bytes: int = 1024 * _MIB
    max_file_bytes: int = 512 * _MIB
    max_ratio: float = 100.0
    ratio_floor_bytes: int = _MIB

    def __post_init__(self) -> None:
        """Check the caps are positive.

        Raises:
            ValueError: If a cap is not positive.
        """
        for name in ("max_archive_bytes", "max_entries", "max_total_bytes", "max_file_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"ArchiveLimits.{name} must be positive")
        if self.max_ratio <= 0 or self.ratio_floor_bytes < 0:
            raise ValueError("ArchiveLimits.max_ratio must be positive, ratio_floor_bytes >= 0")


DEFAULT_LIMITS = ArchiveLimits()


class _Reject(Exception):
    """An entry breaks a rule; turned into ArchiveError naming the entry."""


class _Meter:
    """Reads the decompressed tar stream, counting bytes and enforcing the stream caps."""

    def __init__(self, compressed: int, limits: ArchiveLimits) -> None:
        self._source: gzip.GzipFile | None = None
        self._ratio_cap = max(limits.ratio_floor_bytes, limits.max_ratio * compressed)
        self._max_ratio = limits.max_ratio
        self.count = 0
        self.entry = "(archive header)"
        self._header_mark: int | None = 0

    def attach(self, source: gzip.GzipFile) -> None:
        self._source = source

    def read(self, size: int = -1) -> bytes:
        if self._source is None:
            raise ValueError("_Meter.read before attach")
        data = self._source.read(size)
        self.count += len(data)
        if self.count > self._ratio_cap:
            raise _Reject(f"decompression ratio exceeds {self._max_ratio:g}:1")
        if self._header_mark is not None and self.count - self._header_mark > _HEADER_BUDGET:
            raise _Reject(f"member headers exceed {_HEADER_BUDGET} bytes")
        return data

    def headers(self, on: bool) -> None:
        """Switch header accounting on (before ``tar.next()``) or off (while reading data)."""
        self._header_mark = self.count if on else None


def _archive_size(archive: Path, limits: ArchiveLimits) -> int:
    """Return the size of ``archive`` after checking it is a regular file under the cap."""
    try:
        info = archive.lstat()
    except OSError as exc:
        raise ArchiveError(f"cannot read archive {archive.name}: {exc.strerror}") from exc
    if not stat.S_ISREG(info.st_mode):
        raise ArchiveError(f"archive {archive.name} is not a regular file")
    if info.st_size > limits.max_archive_bytes:
        raise ArchiveError(
            f"archive {archive.name} is {info.st_size} bytes, over {limits.max_archive_bytes}"
        )
    return info.st_size


@contextmanager
def _open_tar(archive: Path, meter: _Meter) -> Iterator[tarfile.TarFile]:
    with archive.open("rb") as raw, gzip.GzipFile(fileobj=raw, mode="rb") as unzipped:
        meter.attach(unzipped)
        with tarfile.open(fileobj=cast(IO[bytes], meter), mode="r|") as tar:
            yield tar


def _members(
    tar: tarfile.TarFile, meter: _Meter, limits: ArchiveLimits
) -> Iterator[tuple[tarfile.TarInfo, str]]:
    """Yield each member with its normalised name, after the checks that need no disk."""
    count = 0
    while True:
        meter.headers(on=True)
        info = tar.next()
        meter.headers(on=False)
        if info is None:
            return
        meter.entry = info.name
        count += 1
        if count > limits.max_entries:
            raise _Reject(f"more than {limits.max_entries} entries")
        problem = _type_problem(info)
        if problem is not None:
            raise _Reject(problem)
        if info.isreg() and info.size > limits.max_file_bytes:
            raise _Reject(f"file of {info.size} bytes is over the {limits.max_file_bytes} cap")
        yield info, _normalise(info.name)


def _type_problem(info: tarfile.TarInfo) -> str | None:
    if info.issparse():
        return "sparse files are not allowed"
    if info.isreg() or info.isdir():
        return None
    return f"{_TYPE_NAMES.get(info.type, 'entry of unsupported type')} not allowed"


def _normalise(name: str) -> str:
    """Return ``name`` without ``.`` or empty parts, or raise if it could leave the root."""
    if not name or len(name) > _MAX_NAME_CHARS:
        raise _Reject(f"name must have 1 to {_MAX_NAME_CHARS} characters")
    if "\\" in name or any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise _Reject("name contains a backslash or control characters")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _Reject("name is not valid UTF-8") from exc
    if name.startswith("/"):
        raise _Reject("absolute path")
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise _Reject("path has a '..' component")
    if len(parts) > _MAX_DEPTH or any(len(p.encode()) > _MAX_PART_BYTES for p in parts):
        raise _Reject("path too deep or a component too long")
    return "/".join(parts)


def _translate(archive: Path, meter_entry: str, exc: BaseException) -> ArchiveError:
    if isinstance(exc, _Reject):
        return ArchiveError(f"unsafe archive {archive.name}: entry {meter_entry!r}: {exc}")
    return ArchiveError(f"unreadable archive {archive.name} at entry {meter_entry!r}: {exc}")


_READ_ERRORS = (_Reject, tarfile.TarError, OSError, EOFError, zlib.error)


class _Extraction:
    """What has been written so far under one destination, and the checks that need it."""

    def __init__(self, dest: Path, limits: ArchiveLimits) -> None:
        self._dest = dest
        self._limits = limits
        self._files: set[str] = set()
        self._dirs: set[str] = set()
        self._explicit_dirs: set[str] = set()
        self.total = 0
        self.names: list[str] = []

    def add(self, tar: tarfile.TarFile, info: tarfile.TarInfo, name: str) -> None:
        if not name:
            if info.isdir():  # "./" is the root itself, which tar -C dir . emits
                return
            raise _Reject("file with an empty name")
        if name in self._files or name in self._explicit_dirs:
            raise _Reject(f"duplicate entry {name!r}")
        parts = name.split("/")
        for depth in range(1, len(parts)):
            if "/".join(parts[:depth]) in self._files:
                raise _Reject(f"parent {'/'.join(parts[:depth])!r} is a file")
        if info.isdir():
            self._make_dirs(parts)
            self._explicit_dirs.add(name)
        else:
            if name in self._dirs:
                raise _Reject("file clashes with a directory of the same name")
            self._make_dirs(parts[:-1])
            self._write_file(tar, info, name)
            self._files.add(name)
        self.names.append(name)

    def _make_dirs(self, parts: list[str]) -> None:
        for depth in range(1, len(parts) + 1):
            rel = "/".join(parts[:depth])
            if rel in self._dirs:
                continue
            path = self._dest.joinpath(*parts[:depth])
            path.mkdir(mode=DIR_MODE)
            path.chmod(DIR_MODE)  # mkdir's mode is narrowed by the umask
            self._dirs.add(rel)

    def _write_file(self, tar: tarfile.TarFile, info: tarfile.TarInfo, name: str) -> None:
        if self.total + info.size > self._limits.max_total_bytes:
            raise _Reject(f"archive content is over the {self._limits.max_total_bytes} byte cap")
        source = tar.extractfile(info)
        if source is None:
            raise _Reject("member has no data")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(self._dest.joinpath(*name.split("/")), flags, FILE_MODE)
        with os.fdopen(fd, "wb") as out:
            os.fchmod(out.fileno(), FILE_MODE)
            written = self._copy(source, out)
        if written != info.size:
            raise _Reject(f"expected {info.size} bytes, got {written}")

    def _copy(self, source: IO[bytes], out: IO[bytes]) -> int:
        written = 0
        while chunk := source.read(_CHUNK):
            written += len(chunk)
            self.total += len(chunk)
            if written > self._limits.max_file_bytes:
                raise _Reject(f"file is over the {self._limits.max_file_bytes} byte cap")
            if self.total > self._limits.max_total_bytes:
                raise _Reject(f"content is over the {self._limits.max_total_bytes} byte cap")
            out.write(chunk)
        return written


def _prepare_dest(dest: Path) -> bool:
    """Make sure ``dest`` is an empty real directory; return whether it was created here."""
    if dest.is_symlink():
        raise ArchiveError(f"destination {dest} is a symbolic link")
    if dest.exists():
        if not dest.is_dir() or any(dest.iterdir()):
            raise ArchiveError(f"destination {dest} exists and is not an empty directory")
        return False
    try:
        dest.mkdir(mode=DIR_MODE)
    except OSError as exc:
        raise ArchiveError(f"cannot create destination {dest}: {exc.strerror}") from exc
    return True


def _clear(dest: Path, created: bool) -> None:
    if created:
        shutil.rmtree(dest, ignore_errors=True)
        return
    for child in dest.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def safe_extract(archive: Path, dest: Path, limits: ArchiveLimits = DEFAULT_LIMITS) -> list[str]:
    """Extract a ``.tar.gz`` into ``dest``, refusing anything unsafe.

    Only regular files and directories are accepted. Files get mode 0o644 and
    directories 0o755 whatever the archive says.

    Args:
        archive: The gzip-compressed tar file.
        dest: A directory that does not exist yet or is empty.
        limits: Caps on size, entry count and compression ratio.

    Returns:
        The normalised names of the members, in archive order.

    Raises:
        ArchiveError: If ``dest`` is unusable, the archive is unreadable, or any member is
            unsafe (absolute or ``..`` path, link, device, fifo, duplicate, over a cap).
            The message names the entry; everything written under ``dest`` is removed.
    """
    compressed = _archive_size(archive, limits)
    created = _prepare_dest(dest)
    try:
        return _extract_into(archive, compressed, dest, limits)
    except BaseException:
        _clear(dest, created)
        raise


def _extract_into(archive: Path, compressed: int, dest: Path, limits: ArchiveLimits) -> list[str]:
    extraction = _Extraction(dest, limits)
    meter = _Meter(compressed, limits)
    try:
        with _open_tar(archive, meter) as tar:
            for info, name in _members(tar, meter, limits):
                extraction.add(tar, info, name)
    except _READ_ERRORS as exc:
        raise _translate(archive, meter.entry, exc) from exc
    return extraction.names


def read_member(
    archive: Path, name: str, max_bytes: int, limits: ArchiveLimits = DEFAULT_LIMITS
) -> bytes | None:
    """Read one regular file from an archive without extracting anything.

    Reading stops at the first member whose normalised name equals ``name``; members
    before it get the same checks as in :func:`safe_extract` except duplicates.

    Args:
        archive: The gzip-compressed tar file.
        name: Normalised member name, e.g. ``"skill.toml"``.
        max_bytes: Largest member accepted.
        limits: Caps on size, entry count and compression ratio.

    Returns:
        The member's bytes, or ``None`` if the archive has no such member.

    Raises:
        ArchiveError: If the archive is unreadable, unsafe before the member, or the
            member is not a regular file or is larger than ``max_bytes``.
    """
    meter = _Meter(_archive_size(archive, limits), limits)
    try:
        with _open_tar(archive, meter) as tar:
            for info, member in _members(tar, meter, limits):
                source = tar.extractfile(info) if info.isreg() else None
                if member != name:
                    while source is not None and source.read(_CHUNK):
                        pass
                    continue
                if source is None or info.size > max_bytes:
                    raise _Reject(f"must be a regular file of at most {max_bytes} bytes")
                return source.read(max_bytes + 1)
    except _READ_ERRORS as exc:
        raise _translate(archive, meter.entry, exc) from exc
    return None


def write_archive(
    src_dir: Path,
    out: Path,
    *,
    overrides: Mapping[str, bytes] | None = None,
    skip: Callable[[str], bool] | None = None,
) -> None:
    """Write ``src_dir`` as a deterministic ``.tar.gz`` at ``out``, atomically.

    The same folder always gives the same bytes: entries in a fixed order (at each level
    files first, then directories, each sorted by name), mtime 0, uid/gid 0, no user
    names, modes 0o644/0o755, gzip header mtime 0 and no file name.

    Args:
        src_dir: The folder to archive; symbolic links and special files are refused.
        out: The archive to write (replaced atomically if it exists).
        overrides: Relative names of files in ``src_dir`` whose archived content is
            given here instead of read from disk.
        skip: Called with each relative name (``"control/__pycache__"``); true leaves
            the entry, and everything under it, out.

    Raises:
        ArchiveError: If ``src_dir`` holds a link or special file, an override names a
            missing file, or writing fails. ``out`` is then left as it was.
    """
    if not src_dir.is_dir():
        raise ArchiveError(f"{src_dir} is not a directory")
    try:
        fd, tmp_name = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    except OSError as exc:
        raise ArchiveError(f"cannot write archive {out}: {exc}") from exc
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as raw:
            write_tar_gz(raw, src_dir, overrides or {}, skip)
            raw.flush()
            os.fsync(raw.fileno())
        tmp.chmod(FILE_MODE)
        tmp.replace(out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ArchiveError(f"cannot write archive {out}: {exc}") from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
