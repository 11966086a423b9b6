"""Service views to JSON: frozen dataclasses, enums and mappings to plain values (pure)."""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
from collections.abc import Mapping
from typing import Any

__all__ = ["to_json"]

#: Nesting deeper than this is a bug in a view, not data: it is cut rather than recursed.
_MAX_DEPTH = 32


#: Values copied as they are (checked by exact type first: the common case).
_PLAIN = frozenset({str, int, bool, type(None)})


@functools.cache
def _field_names(kind: type) -> tuple[str, ...]:
    """A dataclass's field names, looked up once per class (a status has thousands of rows)."""
    return tuple(f.name for f in dataclasses.fields(kind))


def to_json(value: object, _depth: int = 0) -> Any:  # noqa: PLR0911 - one return per kind
    """A JSON-able copy of ``value``: dataclass fields, enum values, lists for tuples and sets.

    Floats that JSON cannot carry (NaN, infinities) become None; keys become strings.
    """
    if _depth > _MAX_DEPTH:
        return None
    if type(value) in _PLAIN:
        return value
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, enum.Enum):
        return to_json(value.value, _depth + 1)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            name: to_json(getattr(value, name), _depth + 1) for name in _field_names(type(value))
        }
    if isinstance(value, Mapping):
        return {str(k): to_json(v, _depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=str) if isinstance(value, set | frozenset) else value
        return [to_json(v, _depth + 1) for v in items]
    if isinstance(value, bytes):
        return value.hex()
    return str(value)
