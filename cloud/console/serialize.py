"""Service views to JSON: frozen dataclasses, enums and mappings to plain values (pure)."""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping
from typing import Any

__all__ = ["to_json"]

#: Nesting deeper than this is a bug in a view, not data: it is cut rather than recursed.
_MAX_DEPTH = 32


def to_json(value: object, _depth: int = 0) -> Any:  # noqa: PLR0911 - one return per kind
    """A JSON-able copy of ``value``: dataclass fields, enum values, lists for tuples and sets.

    Floats that JSON cannot carry (NaN, infinities) become None; keys become strings.
    """
    if _depth > _MAX_DEPTH:
        return None
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, enum.Enum):
        return to_json(value.value, _depth + 1)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: to_json(getattr(value, f.name), _depth + 1) for f in dataclasses.fields(value)
        }
    if isinstance(value, Mapping):
        return {str(k): to_json(v, _depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=str) if isinstance(value, set | frozenset) else value
        return [to_json(v, _depth + 1) for v in items]
    if isinstance(value, bytes):
        return value.hex()
    return str(value)
