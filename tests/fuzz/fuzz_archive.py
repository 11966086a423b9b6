"""atheris harness: bytes as a bundle archive are extracted safely inside dest, or refused."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import atheris

with atheris.instrument_imports():
    from skills.archive import ArchiveLimits, safe_extract
    from skills.errors import ArchiveError

_LIMITS = ArchiveLimits(max_entries=64, max_total_bytes=1 << 22, max_file_bytes=1 << 20)
_WORK = Path(tempfile.mkdtemp(prefix="fuzz-archive-"))


def one_input(data: bytes) -> None:
    """Extract ``data``; everything written must stay inside the destination."""
    archive, dest = _WORK / "b.skill", _WORK / "out"
    archive.write_bytes(data)
    try:
        safe_extract(archive, dest, _LIMITS)
    except ArchiveError:
        if dest.exists() and any(dest.iterdir()):
            raise AssertionError("a refused archive left files behind") from None
        return
    try:
        root = dest.resolve()
        for path in dest.rglob("*"):
            if path.is_symlink() or not path.resolve().is_relative_to(root):
                raise AssertionError(f"{path} escapes the destination")
    finally:
        shutil.rmtree(dest, ignore_errors=True)


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
