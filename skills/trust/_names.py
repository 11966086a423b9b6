"""Target-name rules shared by the hub repository and the agent client."""

from __future__ import annotations

import re

from skills.errors import TrustError

MAX_TARGET_NAME = 200
_COMPONENT = re.compile(r"[A-Za-z0-9._-]+")


def check_target_name(name: str) -> str:
    """Return ``name`` if it is a safe relative target name.

    A target name is a ``/``-separated path of components made of
    ``[A-Za-z0-9._-]``; it becomes a file path on the hub and the agent, so
    absolute paths, empty components, ``.`` and ``..`` are refused.

    Args:
        name: The target name, such as ``"digits/digits-1.0.0.skill"``.

    Returns:
        The same name.

    Raises:
        TrustError: The name is empty, too long or not a safe relative path.
    """
    if not is_safe_relpath(name, MAX_TARGET_NAME):
        raise TrustError(
            f"bad target name {name!r}: want 1..{MAX_TARGET_NAME} characters, components "
            "of [A-Za-z0-9._-] separated by '/', none of them '.' or '..'"
        )
    return name


def is_safe_relpath(path: object, max_len: int) -> bool:
    """Tell whether ``path`` is a relative path that cannot leave its base folder.

    Args:
        path: The candidate path (anything; non-strings are unsafe).
        max_len: The longest acceptable path.

    Returns:
        True when every ``/``-separated component is ``[A-Za-z0-9._-]+`` and
        none is ``.`` or ``..``.
    """
    if not isinstance(path, str) or not path or len(path) > max_len:
        return False
    return all(_COMPONENT.fullmatch(part) and part not in {".", ".."} for part in path.split("/"))


def served_path(name: str, sha256: str) -> str:
    """Return the repository-relative path a target is served under.

    With TUF consistent snapshots the file name is prefixed by its hash while
    the directories stay: ``a/b.skill`` is served as ``targets/a/<sha256>.b.skill``.

    Args:
        name: A valid target name.
        sha256: The hex SHA-256 of the target's content.

    Returns:
        The path, starting with ``targets/``.
    """
    dirname, sep, basename = name.rpartition("/")
    return f"targets/{dirname}{sep}{sha256}.{basename}"
