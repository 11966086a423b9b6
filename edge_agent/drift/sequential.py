"""Sequential drift detectors: Page-Hinkley and ADWIN, and an accuracy monitor over labels.

Each detector takes one value at a time (``update(x) -> bool``: True when drift is
detected on that sample), exposes ``drift_detected`` and ``reset()``, is
deterministic and holds no global state. As in river, a detector that fired
starts afresh on its next sample.

* :class:`PageHinkley` — the CUSUM-like Page-Hinkley test on the deviation from
  the running mean, one- or two-sided, with an optional forgetting factor.
* :class:`ADWIN` — ADWIN2 (Bifet & Gavaldà, 2007): an adaptive window kept as an
  exponential histogram, cut where two sub-windows' means differ by more than a
  Hoeffding/Bernstein bound at confidence ``delta``.
* :class:`AccuracyMonitor` — correct/incorrect feedback fed to a detector as an
  error stream, with a sliding-window accuracy.

The defaults differ from river's: they are tuned, on a 0/1 error stream with a
10 % base error rate, for under one false alarm per 100,000 stationary samples
(``tests/bench/bench_drift.py`` measures them beside river's: 0.3-0.5 false
alarms per 100,000, a median delay of ~150 samples for a 10-point accuracy
drop). Much faster is not on offer at that false-alarm rate: the optimal test
for exactly this change (a log-likelihood CUSUM for 10 % to 20 %, which knows
both rates; 0.044 nats per sample) has, simulated, a median delay of ~140
samples at 0.6 false alarms per 100,000, and needs ~60-90 false alarms per
100,000 for a median of 50. Lower ``threshold`` (or raise ``delta``) for speed.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Literal, Protocol, runtime_checkable

from skills.drift_stats import check_int, finite_number

__all__ = ["ADWIN", "AccuracyMonitor", "DriftDetector", "PageHinkley"]


@runtime_checkable
class DriftDetector(Protocol):
    """What the monitors need of a detector."""

    @property
    def drift_detected(self) -> bool:
        """Whether drift was detected on the last sample."""
        ...

    def update(self, x: float) -> bool:
        """Add one value; True when drift is detected on it."""
        ...

    def reset(self) -> None:
        """Forget every sample."""
        ...


class PageHinkley:
    """The Page-Hinkley test (parameters as river's ``drift.PageHinkley``).

    With ``m`` the running mean since the last reset, it accumulates
    ``U = alpha·U + (x - m) - delta`` (increases) and ``L = alpha·L + (x - m) + delta``
    (decreases) and flags drift once ``min_instances`` values are in when
    ``U - min U`` (``mode="up"``) or ``max L - L`` (``"down"``) exceeds ``threshold``.

    Args:
        min_instances: Values needed before drift can be flagged.
        delta: The tolerated change per sample (the CUSUM's drift allowance).
        threshold: The alarm level (lambda).
        alpha: The forgetting factor of the sums, in (0, 1]. 1 (no forgetting) by
            default: with ``alpha < 1`` the sums settle around ``-delta/(1-alpha)``
            and their stationary wander alone eventually crosses any threshold.
        mode: ``"up"``, ``"down"`` or ``"both"``: which changes of the mean count.

    Raises:
        ValueError: A parameter is out of range.
    """

    def __init__(
        self,
        min_instances: int = 30,
        delta: float = 0.04,
        threshold: float = 12.0,
        alpha: float = 1.0,
        mode: Literal["up", "down", "both"] = "up",
    ) -> None:
        check_int("min_instances", min_instances, 1)
        if not (math.isfinite(delta) and delta >= 0):
            raise ValueError(f"delta must be finite and >= 0, got {delta!r}")
        if not (math.isfinite(threshold) and threshold > 0):
            raise ValueError(f"threshold must be finite and > 0, got {threshold!r}")
        if not (math.isfinite(alpha) and 0 < alpha <= 1):
            raise ValueError(f"alpha must be in (0, 1], got {alpha!r}")
        if mode not in ("up", "down", "both"):
            raise ValueError(f"mode must be 'up', 'down' or 'both', got {mode!r}")
        self.min_instances = min_instances
        self.delta = delta
        self.threshold = threshold
        self.alpha = alpha
        self.mode = mode
        self.reset()

    def reset(self) -> None:
        """Forget every sample."""
        self._n = 0
        self._mean = 0.0
        self._up = 0.0
        self._down = 0.0
        self._min_up = math.inf
        self._max_down = -math.inf
        self._drift = False

    @property
    def drift_detected(self) -> bool:
        """Whether drift was detected on the last sample."""
        return self._drift

    @property
    def n(self) -> int:
        """Values seen since the last reset."""
        return self._n

    @property
    def statistic(self) -> float:
        """The larger of the watched test statistics (compared with ``threshold``)."""
        up = self._up - self._min_up if self._n else 0.0
        down = self._max_down - self._down if self._n else 0.0
        if self.mode == "up":
            return up
        return down if self.mode == "down" else max(up, down)

    def update(self, x: float) -> bool:
        """Add one value; True when drift is detected on it.

        Raises:
            ValueError: ``x`` is not a finite number.
        """
        value = finite_number("a drift detector's value", x)
        if self._drift:
            self.reset()
        self._n += 1
        self._mean += (value - self._mean) / self._n
        deviation = value - self._mean
        self._up = self.alpha * self._up + deviation - self.delta
        self._down = self.alpha * self._down + deviation + self.delta
        self._min_up = min(self._min_up, self._up)
        self._max_down = max(self._max_down, self._down)
        self._drift = self._n >= self.min_instances and self.statistic > self.threshold
        return self._drift


class _Row:
    """The buckets of one size (2**level values each), oldest first: sums and variances."""

    __slots__ = ("sums", "variances")

    def __init__(self) -> None:
        self.sums: deque[float] = deque()
        self.variances: deque[float] = deque()


class ADWIN:
    """ADWIN2, the adaptive-windowing detector (parameters as river's ``drift.ADWIN``).

    The window is an exponential histogram: row ``i`` holds up to ``max_buckets``
    buckets of ``2**i`` values (sum and variance each); a row that overflows merges
    its two oldest buckets into the next. Every ``clock`` samples, once the window
    holds more than ``grace_period`` values, each split of the window at a bucket
    boundary into an older ``W0`` and a newer ``W1`` (both at least
    ``min_window_length`` long) is tested: drift when

    ``|μ0 - μ1| > sqrt(2/m · σ² · δ') + 2/(3m) · δ'``, with
    ``1/m = 1/(n0 - L + 1) + 1/(n1 - L + 1)`` and ``δ' = ln(2·ln(n)/delta)``

    (``σ²`` the window's variance, ``n`` its width, ``L`` the minimum length).
    The oldest bucket is then dropped and the test repeated, so after a detection
    the window holds the recent data only; the next sample starts a fresh window.

    Args:
        delta: The confidence parameter, in (0, 1): smaller means fewer false
            alarms. The bound is loose, so 0.05 still gives well under one false
            alarm per 100,000 stationary samples.
        clock: Test every this many samples (the test costs a pass over the
            ``O(max_buckets · log n)`` buckets).
        max_buckets: Buckets kept per row before two are merged.
        min_window_length: The shortest sub-window a split may leave.
        grace_period: Values needed before the first test.

    Raises:
        ValueError: A parameter is out of range.
    """

    def __init__(
        self,
        delta: float = 0.05,
        clock: int = 4,
        max_buckets: int = 5,
        min_window_length: int = 5,
        grace_period: int = 10,
    ) -> None:
        if not (math.isfinite(delta) and 0 < delta < 1):
            raise ValueError(f"delta must be in (0, 1), got {delta!r}")
        check_int("clock", clock, 1)
        check_int("max_buckets", max_buckets, 1)
        check_int("min_window_length", min_window_length, 1)
        check_int("grace_period", grace_period, 0)
        self.delta = delta
        self.clock = clock
        self.max_buckets = max_buckets
        self.min_window_length = min_window_length
        self.grace_period = grace_period
        self.n_detections = 0
        self.reset()

    def reset(self) -> None:
        """Forget every sample (``n_detections`` is kept)."""
        self._rows: list[_Row] = [_Row()]
        self._width = 0
        self._total = 0.0
        self._variance = 0.0  # the sum of squared deviations from the mean
        self._tick = 0
        self._drift = False

    @property
    def drift_detected(self) -> bool:
        """Whether drift was detected on the last sample."""
        return self._drift

    @property
    def width(self) -> int:
        """The number of values in the window."""
        return self._width

    @property
    def estimation(self) -> float:
        """The window's mean (0.0 when empty)."""
        return self._total / self._width if self._width else 0.0

    @property
    def variance(self) -> float:
        """The window's population variance (0.0 when empty)."""
        return self._variance / self._width if self._width else 0.0

    def update(self, x: float) -> bool:
        """Add one value; True when drift is detected on it.

        Raises:
            ValueError: ``x`` is not a finite number.
        """
        value = finite_number("a drift detector's value", x)
        if self._drift:
            self.reset()
        self._insert(value)
        self._tick += 1
        if self._tick % self.clock == 0 and self._width > self.grace_period:
            while self._cut_found():
                self._drift = True
                self._drop_oldest()
        if self._drift:
            self.n_detections += 1
        return self._drift

    def _insert(self, value: float) -> None:
        if self._width:
            gap = value - self._total / self._width
            self._variance += self._width * gap * gap / (self._width + 1)
        self._width += 1
        self._total += value
        self._rows[0].sums.append(value)
        self._rows[0].variances.append(0.0)
        level = 0
        while len(self._rows[level].sums) > self.max_buckets:
            row, size = self._rows[level], float(1 << level)
            sum_a, sum_b = row.sums.popleft(), row.sums.popleft()
            var_a, var_b = row.variances.popleft(), row.variances.popleft()
            gap = (sum_a - sum_b) / size
            if level + 1 == len(self._rows):
                self._rows.append(_Row())
            self._rows[level + 1].sums.append(sum_a + sum_b)
            self._rows[level + 1].variances.append(var_a + var_b + size * gap * gap / 2)
            level += 1

    def _drop_oldest(self) -> None:
        row = self._rows[-1]
        size = 1 << (len(self._rows) - 1)
        bucket_sum, bucket_var = row.sums.popleft(), row.variances.popleft()
        self._width -= size
        self._total -= bucket_sum
        if self._width:
            gap = bucket_sum / size - self._total / self._width
            self._variance -= bucket_var + size * self._width * gap * gap / (size + self._width)
        else:
            self._variance = 0.0
        if not row.sums and len(self._rows) > 1:
            self._rows.pop()

    def _cut_found(self) -> bool:
        """Whether some split of the window into old and new parts has different means."""
        width = self._width
        if width < 2:
            return False
        log_term = math.log(2 * math.log(width) / self.delta)
        spread = max(0.0, 2 * self._variance / width * log_term)  # rounding can go below 0
        shortest = self.min_window_length
        n0, sum0 = 0, 0.0
        for level in range(len(self._rows) - 1, -1, -1):
            size = 1 << level
            for bucket_sum in self._rows[level].sums:
                n0 += size
                sum0 += bucket_sum
                n1 = width - n0
                if n1 < shortest:
                    return False
                if n0 < shortest:
                    continue
                inverse_m = 1 / (n0 - shortest + 1) + 1 / (n1 - shortest + 1)
                bound = math.sqrt(spread * inverse_m) + 2 / 3 * log_term * inverse_m
                if abs(sum0 / n0 - (self._total - sum0) / n1) > bound:
                    return True
        return False


class AccuracyMonitor:
    """Labelled feedback (correct or not) fed to a detector as a 0/1 error stream.

    Args:
        detector: Watches the errors (1.0 = incorrect); an :class:`ADWIN` by
            default (its bound scales with the error rate's own variance, so one
            setting suits skills with 1 % or 30 % errors alike).
        window: How many recent labels :attr:`accuracy` is over.

    Raises:
        ValueError: ``window`` is not an int >= 1.
    """

    def __init__(self, detector: DriftDetector | None = None, window: int = 500) -> None:
        check_int("window", window, 1)
        self.detector: DriftDetector = ADWIN() if detector is None else detector
        self._recent: deque[bool] = deque(maxlen=window)
        self._correct_in_window = 0
        self.n_labels = 0
        self.n_alarms = 0

    @property
    def drift_detected(self) -> bool:
        """Whether the detector fired on the last label."""
        return self.detector.drift_detected

    @property
    def accuracy(self) -> float | None:
        """The accuracy over the last ``window`` labels (None before the first)."""
        return self._correct_in_window / len(self._recent) if self._recent else None

    def update(self, correct: bool) -> bool:
        """Add one label's verdict; True when the detector fires on it.

        Raises:
            ValueError: ``correct`` is not a bool.
        """
        if not isinstance(correct, bool):
            raise ValueError(f"correct must be a bool, got {correct!r}")
        if len(self._recent) == self._recent.maxlen:
            self._correct_in_window -= self._recent[0]
        self._recent.append(correct)
        self._correct_in_window += correct
        self.n_labels += 1
        fired = self.detector.update(0.0 if correct else 1.0)
        self.n_alarms += fired
        return fired

    def reset(self) -> None:
        """Forget every label and reset the detector."""
        self.detector.reset()
        self._recent.clear()
        self._correct_in_window = 0
        self.n_labels = 0
        self.n_alarms = 0
