"""Argument checks shared by the drift modules: each raises ValueError saying what is wrong."""

from __future__ import annotations

import math
import numbers

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["Floats", "check_int", "finite_array", "finite_number"]

Floats = NDArray[np.float64]


def check_int(name: str, value: int, minimum: int, maximum: int | None = None) -> None:
    """Raise unless ``value`` is an int (not a bool) in ``minimum..maximum``.

    Raises:
        ValueError: It is not.
    """
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < minimum
        or (maximum is not None and value > maximum)
    ):
        wanted = f">= {minimum}" if maximum is None else f"in {minimum}..{maximum}"
        raise ValueError(f"{name} must be an int {wanted}, got {value!r}")


def finite_number(name: str, value: float) -> float:
    """``value`` as a float, if it is a finite real number (numpy's too; not a bool).

    Raises:
        ValueError: It is not.
    """
    if type(value) is float and math.isfinite(value):  # the hot path of every update
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    try:
        number = float(value)
    except OverflowError:  # an int beyond float range
        number = math.inf
    if not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return number


def finite_array(name: str, values: ArrayLike, *, allow_empty: bool = False) -> Floats:
    """``values`` as a 1-D float64 array of finite numbers.

    Raises:
        ValueError: Not 1-D, not numeric, empty (unless allowed) or not all finite.
    """
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be numbers: {exc}") from exc
    if array.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {array.shape}")
    if not allow_empty and array.size == 0:
        raise ValueError(f"{name} is empty")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must be finite (no NaN or infinity)")
    return array
