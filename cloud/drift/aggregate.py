"""Drift windows from devices and their fleet aggregate per skill version and group (pure).

Agents report drift in a telemetry window's ``metrics`` map (the keys in
:data:`METRIC_KEYS`); :meth:`DriftWindow.from_metrics` turns one such map into
a checked :class:`DriftWindow`. A :class:`DriftAggregate` holds the windows of
one (skill, version, group) as a set, so adding windows is a union: windows
that arrive late, twice or out of order give the same aggregate.

A device's state at time ``t`` is its newest window ending in ``(t - window,
t]`` (a tie on the end time goes to the worse news, then to a fixed order of
the values, so it never depends on arrival). Windows ending after ``t`` are
not seen at ``t``. A window under the policy's ``min_samples`` is too small
to be news (the PSI of a few samples is mostly noise): it neither counts nor
hides its device's last window that does.

Fleet numbers weigh each counted device by its window's sample count: the
drifting *share* is the share of the counted samples that drifting devices
saw, and the fleet PSI is the sample-weighted mean, so a device that saw ten
times the inputs carries ten times the evidence. Device counts (``counted``,
``drifting``) stay counts: an incident still needs several devices.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import NamedTuple, Protocol

from cloud.errors import ValidationError

__all__ = [
    "METRIC_KEYS",
    "DeviceDrift",
    "DriftAggregate",
    "DriftKey",
    "DriftThresholds",
    "DriftWindow",
    "FleetDrift",
    "Tally",
]

#: The metric keys an agent reports drift under; a window without ``drift.n`` has no drift.
METRIC_KEYS = (
    "drift.n",
    "drift.psi_class",
    "drift.psi_confidence",
    "drift.alarms",
    "drift.labelled",
    "drift.accuracy",
)
MAX_COUNT = 2**53  # counts arrive as doubles; above this they are no longer exact


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValidationError(message)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True, order=True)
class DriftKey:
    """What drift is aggregated per: a skill version on a group.

    Raises:
        ValidationError: An empty or non-string part.
    """

    skill: str
    version: str
    group: str

    def __post_init__(self) -> None:
        """Refuse empty names."""
        for name in ("skill", "version", "group"):
            value = getattr(self, name)
            _check(isinstance(value, str) and bool(value), f"a drift key needs a {name}")

    def __str__(self) -> str:
        """``skill version on group``."""
        return f"{self.skill} {self.version} on {self.group}"


@dataclass(frozen=True)
class DriftWindow:
    """One device's drift statistics for one skill version over one telemetry window.

    Attributes:
        end_ms: The window's end, ms since the Unix epoch.
        n: Samples (predictions) in the window.
        psi_class: PSI of the predicted-class mix against the bundle's reference.
        psi_confidence: PSI of the confidence histogram against the reference.
        alarms: Sequential-detector alarms raised in the window.
        labelled: Samples whose true label came back.
        accuracy: Accuracy over the labelled samples; None when none were labelled.

    Raises:
        ValidationError: An empty name, a negative time, a count that is not
            a whole number in ``[0, 2**53]``, a PSI that is negative or not
            finite, an accuracy outside ``[0, 1]``, more labelled samples than
            samples, or an accuracy given without labels (or labels without one).
    """

    device_id: str
    skill: str
    version: str
    group: str
    end_ms: int
    n: int
    psi_class: float | None = None
    psi_confidence: float | None = None
    alarms: int = 0
    labelled: int = 0
    accuracy: float | None = None

    def __post_init__(self) -> None:
        """Check every value is one a device could have measured."""
        _check(isinstance(self.device_id, str) and bool(self.device_id), "a window needs a device")
        DriftKey(self.skill, self.version, self.group)
        _check(_is_int(self.end_ms) and self.end_ms >= 0, f"bad window end {self.end_ms!r}")
        for name in ("n", "alarms", "labelled"):
            value = getattr(self, name)
            _check(_is_int(value) and 0 <= value <= MAX_COUNT, f"bad drift count {name}={value!r}")
        for name in ("psi_class", "psi_confidence"):
            value = getattr(self, name)
            ok = value is None or (_is_real(value) and math.isfinite(value) and value >= 0)
            _check(ok, f"bad drift {name}={value!r}: a PSI is finite and non-negative")
        _check(self.labelled <= self.n, f"{self.labelled} labelled of {self.n} samples")
        acc = self.accuracy
        _check(acc is None or (_is_real(acc) and 0 <= acc <= 1), f"bad drift accuracy {acc!r}")
        _check((acc is None) == (self.labelled == 0), "drift accuracy needs labelled samples")

    @classmethod
    def from_metrics(
        cls,
        device_id: str,
        skill: str,
        version: str,
        group: str,
        end_ms: int,
        metrics: Mapping[str, float],
    ) -> DriftWindow | None:
        """Read a window's drift from a telemetry ``metrics`` map.

        Keys other than :data:`METRIC_KEYS` are ignored; missing optional keys
        mean "not measured" (no PSI, no alarm, no labels).

        Args:
            device_id: The reporting device.
            skill: The skill the telemetry is for.
            version: The skill version that ran.
            group: The group the window is aggregated in (a device in several
                groups gives one window per group).
            end_ms: The window's end time.
            metrics: The telemetry's metrics map.

        Returns:
            The window, or None when the map has no ``drift.n`` (no drift reported).

        Raises:
            ValidationError: A drift value is not a number, or the window fails
                the checks of :class:`DriftWindow`.
        """
        if "drift.n" not in metrics:
            return None
        counts = {k: _count(metrics, f"drift.{k}") for k in ("n", "alarms", "labelled")}
        return cls(
            device_id,
            skill,
            version,
            group,
            end_ms,
            psi_class=_real(metrics, "drift.psi_class"),
            psi_confidence=_real(metrics, "drift.psi_confidence"),
            accuracy=_real(metrics, "drift.accuracy"),
            **counts,
        )

    @property
    def key(self) -> DriftKey:
        """The aggregate this window belongs to."""
        return DriftKey(self.skill, self.version, self.group)

    @property
    def psi(self) -> float | None:
        """The worse of the two PSIs (None when neither was measured)."""
        measured = [p for p in (self.psi_class, self.psi_confidence) if p is not None]
        return max(measured) if measured else None


def _real(metrics: Mapping[str, float], key: str) -> float | None:
    value = metrics.get(key)
    if value is None:
        return None
    _check(_is_real(value), f"drift metric {key} is not a number: {value!r}")
    return float(value)


def _count(metrics: Mapping[str, float], key: str) -> int:
    value = _real(metrics, key)
    if value is None:
        return 0
    _check(math.isfinite(value) and value.is_integer(), f"drift metric {key}={value!r} not whole")
    return int(value)


def _rank(w: DriftWindow) -> tuple[object, ...]:
    """A total order of one device's windows: newest first, then worse news, then values."""
    none_psi = -1.0  # PSIs are never negative, so this cannot collide
    return (
        w.end_ms,
        w.alarms,
        none_psi if w.psi is None else w.psi,
        none_psi if w.psi_class is None else w.psi_class,
        none_psi if w.psi_confidence is None else w.psi_confidence,
        w.accuracy is not None,
        0.0 if w.accuracy is None else -w.accuracy,
        w.labelled,
        w.n,
    )


def _state_rank(policy: DriftThresholds, w: DriftWindow) -> tuple[object, ...]:
    """Which window is a device's state: one with enough samples first, then :func:`_rank`."""
    return (w.n >= policy.min_samples, *_rank(w))


class DriftThresholds(Protocol):
    """What classifying devices needs of a policy (:class:`~cloud.drift.policy.DriftPolicy`)."""

    @property
    def psi_threshold(self) -> float: ...
    @property
    def accuracy_drop(self) -> float: ...
    @property
    def min_samples(self) -> int: ...
    @property
    def min_labelled(self) -> int: ...
    @property
    def window_ms(self) -> int: ...


@dataclass(frozen=True)
class DeviceDrift:
    """One device's state: its newest window and what it says.

    Attributes:
        counts: The window has at least the policy's ``min_samples``.
        causes: Why the device drifts, a subset of ``psi``, ``alarm``, ``accuracy``.
    """

    window: DriftWindow
    counts: bool
    causes: frozenset[str]

    @property
    def drifting(self) -> bool:
        """Whether the device counts and drifts."""
        return self.counts and bool(self.causes)


class Tally(NamedTuple):
    """Counted and drifting devices at one time, and the samples their windows saw."""

    at_ms: int
    counted: int
    drifting: int
    samples: int
    drifting_samples: int

    @property
    def share(self) -> float:
        """The drifting devices' share of the counted samples (0 when none counted)."""
        return self.drifting_samples / self.samples if self.samples else 0.0


@dataclass(frozen=True)
class FleetDrift:
    """Fleet numbers of one aggregate at one time (over the devices that count).

    Attributes:
        reporting: Devices with a window in the span.
        counted: Of those, devices whose window has enough samples.
        drifting: Counted devices that drift.
        share: ``drifting_samples / samples`` (0 when none counted).
        mean_psi: Mean of the counted devices' worse PSI, each weighted by its
            window's samples (None when none measured).
        accuracy: Pooled accuracy of the counted devices (their correct answers
            over their labels; None without labels).
        labelled: Labels behind ``accuracy``.
        samples: Samples in the counted devices' windows.
        drifting_samples: Of those, samples in the drifting devices' windows.
    """

    at_ms: int
    reporting: int
    counted: int
    drifting: int
    share: float
    mean_psi: float | None
    accuracy: float | None
    labelled: int
    samples: int = 0
    drifting_samples: int = 0


@dataclass(frozen=True)
class DriftAggregate:
    """The drift windows of one skill version on one group.

    ``reference_accuracy`` is the version's accuracy on its reference data;
    without it no device drifts on accuracy.

    Raises:
        ValidationError: A reference accuracy outside ``[0, 1]``, or a window
            of another skill version or group.
    """

    key: DriftKey
    reference_accuracy: float | None = None
    windows: frozenset[DriftWindow] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        """Check the reference and that every window belongs here."""
        ref = self.reference_accuracy
        _check(ref is None or (_is_real(ref) and 0 <= ref <= 1), f"bad reference accuracy {ref!r}")
        object.__setattr__(self, "windows", frozenset(self.windows))
        for w in self.windows:
            _check(w.key == self.key, f"aggregate {self.key} got a window of {w.key}")

    def add(self, windows: Iterable[DriftWindow]) -> DriftAggregate:
        """The aggregate with more windows (one already here changes nothing).

        Raises:
            ValidationError: A window of another skill version or group.
        """
        return replace(self, windows=self.windows | frozenset(windows))

    def prune(self, before_ms: int) -> DriftAggregate:
        """The aggregate without windows that ended before ``before_ms``."""
        return replace(self, windows=frozenset(w for w in self.windows if w.end_ms >= before_ms))

    def classify(self, policy: DriftThresholds, window: DriftWindow) -> DeviceDrift:
        """What one window says under a policy's thresholds."""
        causes: set[str] = set()
        if window.psi is not None and window.psi > policy.psi_threshold:
            causes.add("psi")
        if window.alarms > 0:
            causes.add("alarm")
        if self._accuracy_fell(policy, window):
            causes.add("accuracy")
        return DeviceDrift(window, window.n >= policy.min_samples, frozenset(causes))

    def _accuracy_fell(self, policy: DriftThresholds, window: DriftWindow) -> bool:
        ref, acc = self.reference_accuracy, window.accuracy
        if ref is None or acc is None or window.labelled < policy.min_labelled:
            return False
        return acc < ref - policy.accuracy_drop

    def devices(self, policy: DriftThresholds, at_ms: int) -> dict[str, DeviceDrift]:
        """Each reporting device's state at ``at_ms``, by device id (sorted).

        A device with only windows under ``min_samples`` in the span reports
        but does not count; its state is then its newest window.
        """
        newest: dict[str, DriftWindow] = {}
        for w in self.windows:
            if at_ms - policy.window_ms < w.end_ms <= at_ms:
                old = newest.get(w.device_id)
                if old is None or _state_rank(policy, w) > _state_rank(policy, old):
                    newest[w.device_id] = w
        return {d: self.classify(policy, newest[d]) for d in sorted(newest)}

    def fleet(self, policy: DriftThresholds, at_ms: int) -> FleetDrift:
        """The fleet numbers at ``at_ms``."""
        states = self.devices(policy, at_ms)
        counted = [s.window for s in states.values() if s.counts]
        hot = [s.window for s in states.values() if s.drifting]
        measured = [(w.n, w.psi) for w in counted if w.psi is not None]
        weight = sum(n for n, _ in measured)
        labelled = sum(w.labelled for w in counted)
        correct = math.fsum(w.labelled * (w.accuracy or 0.0) for w in counted)
        samples = sum(w.n for w in counted)
        tally = Tally(at_ms, len(counted), len(hot), samples, sum(w.n for w in hot))
        return FleetDrift(
            at_ms=at_ms,
            reporting=len(states),
            counted=tally.counted,
            drifting=tally.drifting,
            share=tally.share,
            mean_psi=math.fsum(n * psi for n, psi in measured) / weight if weight else None,
            accuracy=correct / labelled if labelled else None,
            labelled=labelled,
            samples=tally.samples,
            drifting_samples=tally.drifting_samples,
        )

    def timeline(self, policy: DriftThresholds, start_ms: int, end_ms: int) -> Iterator[Tally]:
        """The counted and drifting devices and samples at ``start_ms`` and at each change.

        Between two yielded times (up to ``end_ms``) the numbers do not change,
        so a condition that holds at every yielded time holds over all of
        ``[start_ms, end_ms]``.
        """
        deltas: dict[int, list[int]] = {}
        for begin, until, state in self._spells(policy):
            n, hot = state.window.n, int(state.drifting)
            for at, sign in ((begin, 1), (until, -1)):
                step = deltas.setdefault(at, [0, 0, 0, 0])
                for i, value in enumerate((1, hot, n, n * hot)):
                    step[i] += sign * value
        times = sorted(deltas)
        split = bisect.bisect_right(times, start_ms)
        sums = [sum(deltas[at][i] for at in times[:split]) for i in range(4)]
        yield Tally(start_ms, *sums)
        for at in times[split:]:
            if at > end_ms:
                return
            sums = [a + b for a, b in zip(sums, deltas[at], strict=True)]
            yield Tally(at, *sums)

    def _spells(self, policy: DriftThresholds) -> Iterator[tuple[int, int, DeviceDrift]]:
        """Each counted window's time as its device's state: ``[end, min(next, end + window))``."""
        by_device: dict[str, dict[int, DriftWindow]] = {}
        for w in self.windows:
            if w.n < policy.min_samples:
                continue  # too small to be a state (see devices)
            ends = by_device.setdefault(w.device_id, {})
            if w.end_ms not in ends or _rank(w) > _rank(ends[w.end_ms]):
                ends[w.end_ms] = w
        for ends in by_device.values():
            order = sorted(ends)
            for i, end in enumerate(order):
                until = end + policy.window_ms
                if i + 1 < len(order):
                    until = min(until, order[i + 1])
                yield end, until, self.classify(policy, ends[end])
