"""Windowed drift tests: PSI on histograms, two-sample Kolmogorov–Smirnov, a sliding KS detector.

Pure numpy; no I/O, no clock, no global state.

* :func:`psi` / :func:`histogram_psi` / :func:`categorical_psi` — the Population
  Stability Index ``Σ (aᵢ - eᵢ) ln(aᵢ / eᵢ)`` between a reference distribution
  ``e`` (as shipped in a skill bundle) and a live window ``a``; proportions below
  ``epsilon`` are raised to it so empty bins stay finite. Every term is ``>= 0``.
  The usual reading: under :data:`PSI_MODERATE` (0.1) stable, from
  :data:`PSI_MAJOR` (0.25) a major shift (:func:`psi_level`).
* :func:`ks_2samp` — the two-sample Kolmogorov–Smirnov statistic against a
  reference sample or the points of a reference empirical CDF, with an asymptotic
  p-value from the Kolmogorov distribution (:func:`kolmogorov_sf`).
* :class:`KSWindowDetector` — KSWIN-like: a sliding window whose most recent part
  is tested against its older part (or a fixed reference); fires when the p-value
  falls to ``alpha``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from skills.drift_stats import (
    Floats,
    Histogram,
    check_int,
    finite_array,
    finite_number,
    proportions,
)

__all__ = [
    "DEFAULT_EPSILON",
    "PSI_MAJOR",
    "PSI_MODERATE",
    "KSResult",
    "KSWindowDetector",
    "categorical_psi",
    "histogram_psi",
    "kolmogorov_sf",
    "ks_2samp",
    "ks_statistic",
    "psi",
    "psi_level",
]

PSI_MODERATE = 0.1
PSI_MAJOR = 0.25
DEFAULT_EPSILON = 1e-4


def _check_epsilon(epsilon: float) -> None:
    if not (math.isfinite(epsilon) and 0 < epsilon < 1):
        raise ValueError(f"epsilon must be in (0, 1), got {epsilon!r}")


def psi(expected: ArrayLike, actual: ArrayLike, epsilon: float = DEFAULT_EPSILON) -> float:
    """The Population Stability Index between two count vectors over the same bins.

    Args:
        expected: The reference counts or proportions.
        actual: The live counts or proportions.
        epsilon: The floor for a bin's proportion, so an empty bin stays finite.

    Raises:
        ValueError: Different lengths, a negative or non-finite count, an all-zero
            vector, or ``epsilon`` outside (0, 1).
    """
    _check_epsilon(epsilon)
    e = proportions("expected counts", expected)
    a = proportions("actual counts", actual)
    if e.shape != a.shape:
        raise ValueError(f"expected has {e.size} bins, actual {a.size}")
    e = np.maximum(e, epsilon)
    a = np.maximum(a, epsilon)
    return float(np.sum((a - e) * np.log(a / e)))


def histogram_psi(reference: Histogram, live: ArrayLike, epsilon: float = DEFAULT_EPSILON) -> float:
    """PSI between a reference histogram and live values binned on its edges.

    Raises:
        ValueError: ``live`` is empty or not finite, or ``epsilon`` is outside (0, 1).
    """
    counts = reference.bin_counts(finite_array("live values", live))
    return psi(reference.counts, counts, epsilon)


def categorical_psi(
    reference: Mapping[str, float],
    live: Mapping[str, float] | Iterable[str],
    epsilon: float = DEFAULT_EPSILON,
) -> float:
    """PSI between a reference class mix and live class counts (or labels).

    Classes missing on one side count as empty there.

    Args:
        reference: Class to weight (count or proportion).
        live: Class to count, or an iterable of the live labels.
        epsilon: The floor for a class's proportion.

    Raises:
        ValueError: A side is empty, negative or not finite, or ``epsilon`` is bad.
    """
    if not isinstance(live, Mapping):
        tally: dict[str, float] = {}
        for label in live:
            tally[label] = tally.get(label, 0.0) + 1.0
        live = tally
    classes = sorted(set(reference) | set(live))
    expected = [reference.get(c, 0.0) for c in classes]
    actual = [live.get(c, 0.0) for c in classes]
    return psi(expected, actual, epsilon)


def psi_level(value: float) -> Literal["stable", "moderate", "major"]:
    """The usual reading of a PSI value: < 0.1 stable, < 0.25 moderate, else major.

    Raises:
        ValueError: ``value`` is negative or NaN.
    """
    if not value >= 0:
        raise ValueError(f"a PSI is >= 0, got {value!r}")
    if value < PSI_MODERATE:
        return "stable"
    return "moderate" if value < PSI_MAJOR else "major"


def kolmogorov_sf(z: float) -> float:
    """``P(K > z)`` for the Kolmogorov distribution (the limit of ``√n·Dₙ``).

    Two series, each used where it converges in a few terms:
    ``2 Σ (-1)^(k-1) exp(-2k²z²)`` for large ``z`` and
    ``1 - √(2π)/z · Σ exp(-(2k-1)²π²/(8z²))`` for small ``z``.

    Raises:
        ValueError: ``z`` is NaN.
    """
    if math.isnan(z):
        raise ValueError("z is NaN")
    if z <= 0:
        return 1.0
    if z < 1.18:
        cdf, k = 0.0, 1
        factor = -(math.pi**2) / (8 * z * z)
        while k < 100:
            term = math.exp(factor * (2 * k - 1) ** 2)
            cdf += term
            if term < 1e-17 * cdf or term == 0:
                break
            k += 1
        return min(1.0, max(0.0, 1.0 - math.sqrt(2 * math.pi) / z * cdf))
    total, sign = 0.0, 1.0
    for k in range(1, 101):
        term = math.exp(-2.0 * k * k * z * z)
        total += sign * term
        if term < 1e-17 * total or term == 0:
            break
        sign = -sign
    return min(1.0, max(0.0, 2.0 * total))


@dataclass(frozen=True)
class KSResult:
    """A two-sample Kolmogorov–Smirnov test.

    Attributes:
        statistic: ``sup |F_ref - F_live|``, in [0, 1].
        pvalue: The asymptotic p-value, in [0, 1].
        n_reference: The reference's sample size used for the p-value.
        n_live: The live sample's size.
    """

    statistic: float
    pvalue: float
    n_reference: int
    n_live: int


def ks_statistic(a: ArrayLike, b: ArrayLike) -> float:
    """The two-sample Kolmogorov–Smirnov statistic ``sup |F_a - F_b|``.

    Raises:
        ValueError: A sample is empty or not a 1-D array of finite numbers.
    """
    first = np.sort(finite_array("first sample", a))
    second = np.sort(finite_array("second sample", b))
    return _sorted_statistic(first, second)


def _sorted_statistic(first: Floats, second: Floats) -> float:
    """The KS statistic of two sorted samples (ties counted on both sides at once)."""
    points = np.concatenate([first, second])
    cdf_first = np.searchsorted(first, points, side="right") / first.size
    cdf_second = np.searchsorted(second, points, side="right") / second.size
    return float(np.max(np.abs(cdf_first - cdf_second)))


def _pvalue(statistic: float, n_reference: int, n_live: int) -> float:
    """The asymptotic two-sided p-value, with Stephens' finite-sample correction."""
    effective = n_reference * n_live / (n_reference + n_live)
    root = math.sqrt(effective)
    return kolmogorov_sf((root + 0.12 + 0.11 / root) * statistic)


def ks_2samp(reference: ArrayLike, live: ArrayLike, *, reference_n: int | None = None) -> KSResult:
    """The two-sample KS test of a live sample against a reference.

    The p-value is ``Q_KS((√nₑ + 0.12 + 0.11/√nₑ)·D)`` with
    ``nₑ = n_ref·n_live/(n_ref + n_live)`` (Stephens' correction of the Kolmogorov
    limit; close to the exact distribution from ``nₑ ≈ 4``). Ties (discrete data)
    make it conservative.

    Args:
        reference: A reference sample, or the points of a reference empirical CDF
            (e.g. its quantiles at evenly spaced probabilities).
        live: The live sample.
        reference_n: How many observations ``reference`` stands for when it is a
            compressed CDF; defaults to its length.

    Raises:
        ValueError: A sample is empty or not finite, or ``reference_n`` is smaller
            than one.
    """
    first = np.sort(finite_array("reference", reference))
    second = np.sort(finite_array("live sample", live))
    n_reference = first.size if reference_n is None else reference_n
    if isinstance(n_reference, bool) or not isinstance(n_reference, int) or n_reference < 1:
        raise ValueError(f"reference_n must be an int >= 1, got {reference_n!r}")
    statistic = _sorted_statistic(first, second)
    return KSResult(
        statistic, _pvalue(statistic, n_reference, second.size), n_reference, second.size
    )


class KSWindowDetector:
    """A sliding-window Kolmogorov–Smirnov drift detector (KSWIN-like, deterministic).

    Keeps the last ``window_size`` values. Every ``clock`` samples once the window is
    full, its ``stat_size`` most recent values are tested against the older ones (or
    against ``reference`` when given); drift is flagged when the p-value is at most
    ``alpha`` and the statistic above ``min_statistic``. On drift only the recent
    values are kept (against a fixed reference, none), so the next test waits for a
    fresh window. Unlike river's KSWIN the whole older part is used, not a random
    sub-sample, so there is no seed.

    The defaults suit continuous values (confidences, input summaries): on normal
    data we measured 0.6 false alarms per 100,000 stationary samples at
    ``alpha=1e-4`` and none at ``1e-5`` (the tests overlap heavily). On 0/1 data (errors) the
    asymptotic p-value is very conservative, so there ``alpha`` can be ~0.1.

    Args:
        alpha: The p-value at or under which drift is flagged, in (0, 1).
        window_size: Values kept (ignored, but for the recent part, with a reference).
        stat_size: The recent part's size; below ``window_size``.
        clock: Test every this many samples (1 = every sample).
        min_statistic: The statistic must also exceed this, in [0, 1).
        reference: A fixed reference sample to test against instead of the older part.

    Raises:
        ValueError: A parameter is out of range.
    """

    def __init__(
        self,
        alpha: float = 1e-5,
        window_size: int = 1000,
        stat_size: int = 300,
        clock: int = 10,
        min_statistic: float = 0.0,
        reference: ArrayLike | None = None,
    ) -> None:
        if not (math.isfinite(alpha) and 0 < alpha < 1):
            raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
        check_int("stat_size", stat_size, 1)
        check_int("window_size", window_size, stat_size + 1)
        check_int("clock", clock, 1)
        if not (math.isfinite(min_statistic) and 0 <= min_statistic < 1):
            raise ValueError(f"min_statistic must be in [0, 1), got {min_statistic!r}")
        self.alpha = alpha
        self.window_size = window_size
        self.stat_size = stat_size
        self.clock = clock
        self.min_statistic = min_statistic
        self._reference = (
            None if reference is None else np.sort(finite_array("reference", reference))
        )
        self._window: deque[float] = deque(
            maxlen=stat_size if reference is not None else window_size
        )
        self._tick = 0
        self._drift = False
        self._pending_reset = False
        self.pvalue = 1.0
        self.statistic = 0.0

    @property
    def drift_detected(self) -> bool:
        """Whether the last sample was flagged as drift."""
        return self._drift

    def reset(self) -> None:
        """Forget every sample (the fixed reference is kept)."""
        self._window.clear()
        self._tick = 0
        self._drift = False
        self._pending_reset = False
        self.pvalue, self.statistic = 1.0, 0.0

    def update(self, x: float) -> bool:
        """Add one value; True when drift is flagged on it.

        Raises:
            ValueError: ``x`` is not finite.
        """
        value = finite_number("a drift detector's value", x)
        if self._pending_reset:
            self._pending_reset = False
            self._tick = 0
            keep = [] if self._reference is not None else list(self._window)[-self.stat_size :]
            self._window.clear()
            self._window.extend(keep)
        self._window.append(value)
        self._tick += 1
        self._drift = False
        if len(self._window) == self._window.maxlen and self._tick % self.clock == 0:
            self._test()
        return self._drift

    def _test(self) -> None:
        values = np.fromiter(self._window, dtype=np.float64, count=len(self._window))
        recent = np.sort(values[-self.stat_size :])
        if self._reference is not None:
            older = self._reference
        else:
            older = np.sort(values[: -self.stat_size])
        self.statistic = _sorted_statistic(older, recent)
        self.pvalue = _pvalue(self.statistic, older.size, recent.size)
        if self.pvalue <= self.alpha and self.statistic > self.min_statistic:
            self._drift = True
            self._pending_reset = True
