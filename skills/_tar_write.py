"""Deterministic tar.gz writing behind :func:`skills.archive.write_archive`."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO

from skills.errors import ArchiveError

__all__ = ["DIR_MODE", "FILE_MODE", "write_tar_gz"]

FILE_MODE = 0o644
DIR_MODE = 0o755


def _walk(
    root: Path, prefix: str, skip: Callable[[str], bool] | None
) -> Iterator[tuple[str, Path, bool]]:
    """Yield ``(name, path, is_dir)``: files first, then directories, each sorted by name."""
    files: list[tuple[str, Path]] = []
    dirs: list[tuple[str, Path]] = []
    for path in sorted(root.iterdir(), key=lambda p: p.name):
        rel = f"{prefix}{path.name}"
        if skip is not None and skip(rel):
            continue
        if path.is_symlink():
            raise ArchiveError(f"cannot archive symbolic link {rel!r}")
        if path.is_dir():
            dirs.append((rel, path))
        elif path.is_file():
            files.append((rel, path))
        else:
            raise ArchiveError(f"cannot archive special file {rel!r}")
    for rel, path in files:
        yield rel, path, False
    for rel, path in dirs:
        yield rel, path, True
        yield from _walk(path, f"{rel}/", skip)


def _tar_info(name: str, is_dir: bool, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE if is_dir else tarfile.REGTYPE
    info.mode = DIR_MODE if is_dir else FILE_MODE
    info.size = 0 if is_dir else size
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _write_entries(
    tar: tarfile.TarFile,
    src_dir: Path,
    overrides: Mapping[str, bytes],
    skip: Callable[[str], bool] | None,
) -> None:
    pending = set(overrides)
    for rel, path, is_dir in _walk(src_dir, "", skip):
        if is_dir:
            tar.addfile(_tar_info(rel, True, 0))
        elif rel in overrides:
            pending.discard(rel)
            data = overrides[rel]
            tar.addfile(_tar_info(rel, False, len(data)), io.BytesIO(data))
        else:
            with path.open("rb") as source:
                tar.addfile(_tar_info(rel, False, os.fstat(source.fileno()).st_size), source)
    if pending:
        raise ArchiveError(f"override(s) for files not in {src_dir}: {', '.join(sorted(pending))}")


def write_tar_gz(
    raw: IO[bytes],
    src_dir: Path,
    overrides: Mapping[str, bytes],
    skip: Callable[[str], bool] | None,
) -> None:
    """Write ``src_dir`` as a reproducible tar.gz stream into ``raw``.

    Raises:
        ArchiveError: If ``src_dir`` holds a link or special file, or an override names
            a file that is not there.
        OSError: If reading or writing fails.
    """
    # No file name and mtime 0 in the gzip header keep the bytes reproducible.
    with (
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as zipped,
        tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        _write_entries(tar, src_dir, overrides, skip)
