"""Numeric building blocks of drift statistics, shared by the hub and the agent.

The argument checks every drift module uses (each raises ``ValueError`` saying
what is wrong), count normalisation, and the :class:`Histogram` a drift
reference ships its confidence distribution in. Pure numpy: the hub builds
references with it, the agent's detectors (:mod:`edge_agent.drift`) read them.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["Floats", "Histogram", "check_int", "finite_array", "finite_number", "proportions"]

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


def proportions(name: str, counts: ArrayLike) -> Floats:
    """Non-negative counts (or weights) normalised to sum to one.

    Raises:
        ValueError: A count is negative or not finite, or they sum to zero.
    """
    array = finite_array(name, counts)
    if np.any(array < 0):
        raise ValueError(f"{name} must be >= 0")
    total = float(array.sum())
    if total <= 0:
        raise ValueError(f"{name} sum to zero")
    return array / total


@dataclass(frozen=True)
class Histogram:
    """A reference histogram: bin edges and the count (or weight) in each bin.

    Bins are ``[edges[i], edges[i+1])``, the last one closed. Live values outside
    the edges are counted in the outermost bins.

    Attributes:
        edges: Strictly increasing, finite; one more than ``counts``.
        counts: Finite and ``>= 0``, with a positive sum.
    """

    edges: tuple[float, ...]
    counts: tuple[float, ...]

    def __post_init__(self) -> None:
        """Coerce to tuples of floats and check the invariants.

        Raises:
            ValueError: An invariant above does not hold.
        """
        edges = finite_array("histogram edges", self.edges, allow_empty=True)
        if edges.size < 2:
            raise ValueError("a histogram needs at least two edges")
        counts = finite_array("histogram counts", self.counts, allow_empty=True)
        if counts.size != edges.size - 1:
            raise ValueError(f"{edges.size} edges need {edges.size - 1} counts, got {counts.size}")
        if np.any(np.diff(edges) <= 0):
            raise ValueError("histogram edges must be strictly increasing")
        proportions("histogram counts", counts)
        object.__setattr__(self, "edges", tuple(float(v) for v in edges))
        object.__setattr__(self, "counts", tuple(float(v) for v in counts))

    @property
    def bins(self) -> int:
        """The number of bins."""
        return len(self.counts)

    def proportions(self) -> Floats:
        """The counts normalised to sum to one."""
        return proportions("histogram counts", self.counts)

    def bin_counts(self, values: ArrayLike) -> Floats:
        """How many of ``values`` fall in each bin (outliers in the outermost bins).

        Raises:
            ValueError: ``values`` is not a 1-D array of finite numbers.
        """
        array = finite_array("values", values, allow_empty=True)
        index = np.searchsorted(np.asarray(self.edges), array, side="right") - 1
        index = np.clip(index, 0, self.bins - 1)
        return np.bincount(index, minlength=self.bins).astype(np.float64)

    @classmethod
    def from_values(cls, values: ArrayLike, edges: ArrayLike) -> Histogram:
        """The histogram of ``values`` on ``edges``.

        Raises:
            ValueError: Bad edges, or ``values`` empty or not finite.
        """
        array = finite_array("values", values)
        bounds = finite_array("edges", edges)
        shell = cls(tuple(bounds), (1.0,) * max(bounds.size - 1, 0))
        return cls(shell.edges, tuple(shell.bin_counts(array)))
