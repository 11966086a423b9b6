"""The on-disk format of skill installs: safe names, the completion marker, links, fsync.

:class:`edge_agent.installs.InstallStore` decides what to change and in which
order; the helpers here say what a folder, a link or a marker on disk means
and write the marker durably. None of them takes a lock.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from edge_agent.errors import InstallError

__all__ = [
    "LINKS",
    "MARKER",
    "NAME",
    "TEMP_LINK_PREFIXES",
    "check_name",
    "delete_path",
    "fsync",
    "installed_ns",
    "is_complete",
    "is_verified",
    "is_version_dir",
    "read_link",
    "read_marker",
    "scan_skill",
    "write_marker",
]

MARKER = ".edgeskill-installed.json"
"""Written last into a version folder; a folder without it is a half-finished install."""

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")
LINKS = ("current", "previous")
TEMP_LINK_PREFIXES = ("current.", "previous.")
_MAX_MARKER_BYTES = 8 * 1024 * 1024


def write_marker(name: str, version: str, dest: Path) -> None:
    """Flush every unpacked file to disk, then record their sizes in the marker, last.

    Raises:
        InstallError: The bundle holds a file named like the marker, or a link.
        OSError: A file cannot be flushed or the marker cannot be written.
    """
    if (dest / MARKER).exists():
        raise InstallError(f"the bundle contains the reserved file {MARKER}")
    files: dict[str, int] = {}
    for path, rel, size in _walk(dest):
        if size is not None:
            files[rel] = size
        fsync(path)
    tmp = dest / f"{MARKER}.tmp"
    record = {"name": name, "version": version, "files": files}
    tmp.write_text(json.dumps(record), encoding="utf-8")
    fsync(tmp)
    tmp.replace(dest / MARKER)
    fsync(dest)
    fsync(dest.parent)


def _walk(dest: Path) -> list[tuple[Path, str, int | None]]:
    """Everything under ``dest``, sorted by path: (path, relative name, size or None for a folder).

    One ``scandir`` a folder (an install's hot path: pathlib's ``rglob`` and a ``stat``
    per file cost more than the unpack's writes).

    Raises:
        InstallError: A link, or anything that is neither a file nor a folder.
        OSError: A folder cannot be listed.
    """
    found: list[tuple[Path, str, int | None]] = []
    folders = [(dest, "")]
    while folders:
        folder, prefix = folders.pop()
        with os.scandir(folder) as entries:
            for entry in entries:
                rel = f"{prefix}{entry.name}"
                path = folder / entry.name
                if entry.is_symlink():
                    raise InstallError(f"the unpacked bundle contains a link: {rel}")
                if entry.is_dir(follow_symlinks=False):
                    found.append((path, rel, None))
                    folders.append((path, f"{rel}/"))
                elif entry.is_file(follow_symlinks=False):
                    found.append((path, rel, entry.stat(follow_symlinks=False).st_size))
                else:
                    raise InstallError(f"the unpacked bundle contains a special file: {rel}")
    found.sort(key=lambda item: item[0])
    return found


def check_name(what: str, value: str, *, version: bool = False) -> str:
    """``value`` if it is a safe skill name (or version, with ``version=True``).

    Raises:
        InstallError: It is not.
    """
    ok = isinstance(value, str) and NAME.fullmatch(value) is not None
    if ok and version:  # versions share a folder with the links
        ok = value not in LINKS and not value.startswith(TEMP_LINK_PREFIXES)
    if not ok:
        raise InstallError(
            f"bad {what} {value!r}: use 1-128 of letters, digits, '.', '_', '+', '-', "
            "starting with a letter or digit; a version may not be 'current' or 'previous'"
        )
    return value


def delete_path(path: Path) -> None:
    """Delete a folder tree, or a file or link."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def is_version_dir(path: Path) -> bool:
    """Whether ``path`` is a real folder that may hold a version (not a link)."""
    return path.is_dir() and not path.is_symlink() and path.name not in LINKS


def is_complete(path: Path) -> bool:
    """Whether ``path`` is a version folder with its marker."""
    return is_version_dir(path) and (path / MARKER).is_file()


def read_link(link: Path) -> str | None:
    """The version a symlink names, or ``None`` if it is not a link to a plain version name."""
    try:
        return check_name("link target", str(link.readlink()), version=True)
    except (OSError, InstallError):
        return None


def scan_skill(skill_dir: Path) -> tuple[tuple[str, ...], str | None, str | None]:
    """A skill folder in one listing: its complete versions (sorted), ``current`` and ``previous``.

    The same answers as :func:`is_complete` on each entry and :func:`read_link` on
    each link, with a link to a version that is not complete read as None; a folder
    that does not exist has nothing. One ``scandir`` and a marker ``stat`` a version:
    an idle agent rescans every minute and after each install, and a simulated fleet
    runs thousands of agents on one machine (pathlib's checks took 96 us a scan, a
    ``stat`` or ``readlink`` each).

    Raises:
        OSError: The folder exists but cannot be listed.
    """
    complete: list[str] = []
    links: dict[str, str | None] = {}
    try:
        with os.scandir(skill_dir) as listing:
            entries = list(listing)
    except (FileNotFoundError, NotADirectoryError):
        return (), None, None
    for entry in entries:
        if entry.is_symlink():
            if entry.name in LINKS:
                links[entry.name] = read_link(Path(entry.path))
        elif (
            entry.is_dir(follow_symlinks=False)
            and entry.name not in LINKS
            # os.path, not pathlib: building a Path for each check cost more than its stat
            and os.path.isfile(f"{entry.path}/{MARKER}")  # noqa: PTH113
        ):
            complete.append(entry.name)
    complete.sort()
    found = set(complete)
    current, previous = (links.get(link) for link in LINKS)
    return (
        tuple(complete),
        current if current in found else None,
        previous if previous in found else None,
    )


def read_marker(version_dir: Path) -> dict[str, object] | None:
    """The marker's record, or ``None`` if it is missing, too large or unreadable."""
    try:
        with (version_dir / MARKER).open("rb") as f:
            raw = f.read(_MAX_MARKER_BYTES + 1)
        record = json.loads(raw) if len(raw) <= _MAX_MARKER_BYTES else None
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def installed_ns(version_dir: Path) -> int:
    """When the version was installed (its marker's mtime, in ns)."""
    return (version_dir / MARKER).stat().st_mtime_ns


def is_verified(version_dir: Path) -> bool:
    """Whether a version folder is complete and every file the marker lists has its size."""
    if not is_complete(version_dir):
        return False
    record = read_marker(version_dir)
    if record is None or record.get("version") != version_dir.name:
        return False
    files = record.get("files")
    if not isinstance(files, dict):
        return False
    for rel, size in files.items():
        path = version_dir / str(rel)
        if path.is_symlink() or not path.is_file() or path.stat().st_size != size:
            return False
    return True


def fsync(path: Path) -> None:
    """Flush a file's data, or a folder's entries (renames, new links), to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
