"""Field checks and typed TOML table access behind :mod:`skills.manifest`.

Every check raises ``ManifestError`` with a message that starts with the field's name.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from protos.limits import MAX_PATH_CHARS, MAX_VERSION_CHARS
from skills.errors import ManifestError

__all__ = [
    "Table",
    "check_bundle_path",
    "check_choice",
    "check_int",
    "check_pattern",
    "check_str",
    "fail",
    "located",
    "parse_version",
    "table_list",
]

_VERSION_RE = re.compile(
    r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
)


class _PreRelease(str):
    """A pre-release tag ordered by semver precedence, with ``""`` (a release) sorting last.

    Plain string order would put a release before its pre-releases and ``rc.10`` before
    ``rc.2``; this subclass keeps the value a ``str`` while fixing the order.
    """

    __slots__ = ()

    def _key(self) -> tuple[int, tuple[tuple[int, int, str], ...]]:
        if not self:
            return (1, ())
        return (0, tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in self.split(".")))

    def __lt__(self, other: str) -> bool:
        if isinstance(other, _PreRelease):
            return self._key() < other._key()
        return str.__lt__(self, other)

    def __le__(self, other: str) -> bool:
        return self == other or self < other

    def __gt__(self, other: str) -> bool:
        if isinstance(other, _PreRelease):
            return self._key() > other._key()
        return str.__gt__(self, other)

    def __ge__(self, other: str) -> bool:
        return self == other or self > other


def parse_version(text: str) -> tuple[int, int, int, str]:
    """Parse a semantic version ``MAJOR.MINOR.PATCH[-pre]``.

    The result works as a sort key: ``1.0.0-rc.2 < 1.0.0-rc.10 < 1.0.0 < 1.0.1``.
    The fourth item is the pre-release tag (``""`` for a release).

    Args:
        text: The version string. Build metadata (``+build``) is not accepted.

    Returns:
        ``(major, minor, patch, pre)``.

    Raises:
        ManifestError: If ``text`` is not such a version.
    """
    if not isinstance(text, str) or len(text) > MAX_VERSION_CHARS:
        raise ManifestError(f"version {text!r} is not a string of at most {MAX_VERSION_CHARS}")
    match = _VERSION_RE.fullmatch(text)
    if match is None:
        raise ManifestError(f"version {text!r} is not MAJOR.MINOR.PATCH[-prerelease]")
    pre = match.group(4) or ""
    if any(p.isdigit() and len(p) > 1 and p.startswith("0") for p in pre.split(".")):
        raise ManifestError(f"version {text!r}: numeric pre-release parts have no leading zeros")
    return (int(match.group(1)), int(match.group(2)), int(match.group(3)), _PreRelease(pre))


def fail(where: str, problem: str) -> ManifestError:
    return ManifestError(f"{where}: {problem}")


def check_str(value: object, where: str, max_chars: int) -> str:
    if not isinstance(value, str):
        raise fail(where, f"expected a string, got {type(value).__name__}")
    if len(value) > max_chars:
        raise fail(where, f"longer than {max_chars} characters")
    return value


def check_int(value: object, where: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise fail(where, f"expected an integer, got {type(value).__name__}")
    if not low <= value <= high:
        raise fail(where, f"{value} is outside [{low}, {high}]")
    return value


def check_pattern(value: object, where: str, pattern: re.Pattern[str]) -> str:
    text = check_str(value, where, 256)
    if pattern.fullmatch(text) is None:
        raise fail(where, f"{text!r} must match ^{pattern.pattern}$")
    return text


def check_choice(value: object, where: str, choices: tuple[str, ...]) -> str:
    text = check_str(value, where, 64)
    if text not in choices:
        raise fail(where, f"{text!r} is not one of {', '.join(choices)}")
    return text


def check_bundle_path(value: object, where: str) -> str:
    """Check a path inside a bundle: relative, ``/``-separated, no ``..``, ``.`` or empty parts.

    Args:
        value: The candidate path.
        where: The field name used in the error message.

    Returns:
        The path, unchanged.

    Raises:
        ManifestError: If the path is unsafe or malformed.
    """
    path = check_str(value, where, MAX_PATH_CHARS)
    if not path or path.startswith("/") or "\\" in path:
        raise fail(where, f"{path!r} must be a non-empty relative path with '/' separators")
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        raise fail(where, f"{path!r} contains control characters")
    if any(part in ("", ".", "..") for part in path.split("/")):
        raise fail(where, f"{path!r} must not contain '..', '.' or empty parts")
    return path


@contextmanager
def located(where: str) -> Iterator[None]:
    """Prefix the message of a ManifestError raised inside with its location."""
    try:
        yield
    except ManifestError as exc:
        raise ManifestError(f"{where}: {exc}") from exc


_MISSING: Any = object()


class Table:
    """Typed access to one TOML table that remembers which keys were read."""

    def __init__(self, data: object, where: str) -> None:
        if not isinstance(data, dict):
            raise fail(where, f"must be a table, got {type(data).__name__}")
        self._data: dict[str, Any] = data
        self._where = where
        self._used: set[str] = set()

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = _MISSING) -> Any:
        self._used.add(key)
        if key not in self._data:
            if default is _MISSING:
                raise fail(f"{self._where}.{key}", "missing")
            return default
        value = self._data[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
            wanted = " or ".join(k.__name__ for k in kinds)
            raise fail(f"{self._where}.{key}", f"expected {wanted}, got {type(value).__name__}")
        return value

    def all_of(self, kind: type) -> dict[str, Any]:
        return {key: self.get(key, kind) for key in list(self._data)}

    def done(self) -> None:
        unknown = sorted(set(self._data) - self._used)
        if unknown:
            raise fail(self._where, f"unknown key(s): {', '.join(map(str, unknown))}")


def table_list(doc: Table, key: str, limit: int) -> list[object]:
    items: list[object] = doc.get(key, list, [])
    if len(items) > limit:
        raise fail(key, f"more than {limit} entries")
    return items
