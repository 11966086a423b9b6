"""Writing a file so that readers see the old content or the new, never half, and never
with looser permissions than asked for: the one home of this for hub and agent alike.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["TMP_PREFIX", "write_atomic"]

#: Temporary files start with this; whoever holds the folder's writer lock may delete them.
TMP_PREFIX = ".tmp-"


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` through a temporary file, an fsync and a rename.

    The temporary file is created 0600 and given ``mode`` before any byte is
    written, so a key is never readable by others, even for a moment.

    Args:
        path: The file to write; its folder must exist.
        data: The new content.
        mode: Permission bits of the new file.

    Raises:
        OSError: The folder cannot be written.
    """
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=TMP_PREFIX)
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        Path(name).replace(path)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
