"""Per-window drift summaries of a running skill, against its bundle's reference.

A :class:`DriftMonitor` is fed every prediction a skill makes (its class, its
confidence, optionally the input summaries the skill declares and the true label
when one comes back) and, every ``window_size`` samples, returns a
:class:`DriftSummary`: PSI of the class mix and of the confidence histogram, a
KS test per input summary, which sequential detectors fired, and the accuracy
over the window's labels. The agent reports summaries to the hub, which decides
on retraining; nothing here does I/O or reads a clock (times are arguments).
"""

from __future__ import annotations

import math
import numbers
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from edge_agent.drift.sequential import ADWIN, AccuracyMonitor, DriftDetector
from edge_agent.drift.windowed import (
    DEFAULT_EPSILON,
    categorical_psi,
    histogram_psi,
    ks_2samp,
)
from skills.drift_reference import DriftReference
from skills.drift_stats import check_int, finite_number

__all__ = ["MAX_WINDOW", "DriftMonitor", "DriftSummary", "InputDrift"]

MAX_WINDOW = 1_000_000


@dataclass(frozen=True)
class InputDrift:
    """The KS test of one input summary over a window.

    Attributes:
        name: The input summary's name.
        statistic: The KS statistic against the reference, in [0, 1].
        pvalue: Its asymptotic p-value (using the reference's ``n``).
        n: Live values in the window.
    """

    name: str
    statistic: float
    pvalue: float
    n: int


@dataclass(frozen=True)
class DriftSummary:
    """A skill version's drift statistics over one window of predictions.

    Attributes:
        skill: The skill's name.
        version: The skill version.
        window_start: The first sample's time (the caller's clock).
        window_end: The last sample's time.
        n_samples: Predictions in the window.
        class_mix_psi: PSI of the predicted-class mix against the reference.
        confidence_psi: PSI of the confidence histogram against the reference.
        inputs: One KS test per declared input summary that had values, by name.
        alarms: The sequential detectors (``"accuracy"``, ``"confidence"``) that
            fired during the window, sorted.
        accuracy: The accuracy over the window's labelled samples (None if none).
        n_labelled: Labelled samples in the window.
    """

    skill: str
    version: str
    window_start: float
    window_end: float
    n_samples: int
    class_mix_psi: float
    confidence_psi: float
    inputs: tuple[InputDrift, ...] = ()
    alarms: tuple[str, ...] = ()
    accuracy: float | None = None
    n_labelled: int = 0

    def to_dict(self) -> dict[str, object]:
        """The summary as plain JSON-able data (for the agent's report)."""
        return asdict(self)

    def to_metrics(self, prefix: str = "drift.") -> dict[str, float]:
        """The summary as telemetry metrics, every name starting with ``prefix``.

        ``n`` (samples), ``psi_class``, ``psi_confidence``, ``alarms`` (how many
        detectors fired) and ``alarm.<detector>`` (1 for each that fired); with
        labels, ``accuracy`` and ``labelled``; per input summary, ``ks.<name>``
        (the KS statistic) and ``ks_p.<name>`` (its p-value).
        """
        metrics = {
            f"{prefix}n": float(self.n_samples),
            f"{prefix}psi_class": self.class_mix_psi,
            f"{prefix}psi_confidence": self.confidence_psi,
            f"{prefix}alarms": float(len(self.alarms)),
        }
        metrics.update({f"{prefix}alarm.{name}": 1.0 for name in self.alarms})
        if self.accuracy is not None:
            metrics[f"{prefix}accuracy"] = self.accuracy
            metrics[f"{prefix}labelled"] = float(self.n_labelled)
        for item in self.inputs:
            metrics[f"{prefix}ks.{item.name}"] = item.statistic
            metrics[f"{prefix}ks_p.{item.name}"] = item.pvalue
        return metrics


@dataclass
class _Window:
    start: float = math.nan
    end: float = math.nan
    n: int = 0
    classes: Counter[str] = field(default_factory=Counter)
    confidences: list[float] = field(default_factory=list)
    inputs: dict[str, list[float]] = field(default_factory=dict)
    alarms: set[str] = field(default_factory=set)
    labelled: int = 0
    correct: int = 0


def _label(name: str, value: str | int) -> str:
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be a str or an int, got {value!r}")
    return str(int(value))  # numpy's ints as well, named as build_reference names them


class DriftMonitor:
    """Turns a skill's stream of predictions into one :class:`DriftSummary` per window.

    Args:
        skill: The skill's name.
        version: The running version.
        reference: The version's drift reference (from its bundle).
        window_size: Predictions per summary, 1 to :data:`MAX_WINDOW`.
        accuracy: Watches labelled feedback; an :class:`AccuracyMonitor` by default.
        confidence_detector: Watches the confidence stream; an :class:`ADWIN` by
            default (it catches a fall or a rise of the mean confidence).
        epsilon: The PSI floor for empty bins.

    Raises:
        ValueError: ``window_size`` or ``epsilon`` is out of range, or ``skill`` or
            ``version`` is empty.
    """

    def __init__(
        self,
        skill: str,
        version: str,
        reference: DriftReference,
        *,
        window_size: int = 1000,
        accuracy: AccuracyMonitor | None = None,
        confidence_detector: DriftDetector | None = None,
        epsilon: float = DEFAULT_EPSILON,
    ) -> None:
        if not skill or not version:
            raise ValueError("skill and version must be non-empty")
        check_int("window_size", window_size, 1, MAX_WINDOW)
        if not (math.isfinite(epsilon) and 0 < epsilon < 1):
            raise ValueError(f"epsilon must be in (0, 1), got {epsilon!r}")
        self.skill = skill
        self.version = version
        self.reference = reference
        self.window_size = window_size
        self.accuracy = AccuracyMonitor() if accuracy is None else accuracy
        self.confidence_detector = ADWIN() if confidence_detector is None else confidence_detector
        self.epsilon = epsilon
        self._declared = {item.name for item in reference.inputs}
        self._window = _Window()

    @property
    def pending(self) -> int:
        """Predictions in the current, not yet summarised window."""
        return self._window.n

    def observe(
        self,
        predicted: str | int,
        confidence: float,
        *,
        at: float,
        inputs: Mapping[str, float] | None = None,
        label: str | int | None = None,
    ) -> DriftSummary | None:
        """Add one prediction; the window's summary when this one completes it.

        Args:
            predicted: The predicted class (an int is compared as ``str``).
            confidence: The top-class confidence.
            at: When it was made, on the caller's clock.
            inputs: Values of declared input summaries for this sample.
            label: The true class, when known.

        Raises:
            ValueError: A value is not finite, a class is neither str nor int, or an
                input summary is not declared in the reference. Nothing is recorded.
        """
        name = _label("predicted", predicted)
        score = finite_number("confidence", confidence)
        when = finite_number("at", at)
        truth = None if label is None else _label("label", label)
        values = {
            key: finite_number(f"input {key!r}", value) for key, value in (inputs or {}).items()
        }
        undeclared = sorted(set(values) - self._declared)
        if undeclared:
            raise ValueError(f"input summaries {undeclared} are not declared in the reference")
        window = self._window
        if window.n == 0:
            window.start = when
        window.end = when
        window.n += 1
        window.classes[name] += 1
        window.confidences.append(score)
        for key, value in values.items():
            window.inputs.setdefault(key, []).append(value)
        if self.confidence_detector.update(score):
            window.alarms.add("confidence")
        if truth is not None:
            window.labelled += 1
            window.correct += truth == name
            if self.accuracy.update(truth == name):
                window.alarms.add("accuracy")
        return self.flush() if window.n >= self.window_size else None

    def flush(self) -> DriftSummary | None:
        """Summarise the current window now, however short; None when it is empty."""
        window = self._window
        if window.n == 0:
            return None
        self._window = _Window()
        inputs = []
        for name, values in sorted(window.inputs.items()):
            reference = self.reference.input(name)
            test = ks_2samp(reference.points, values, reference_n=reference.n)
            inputs.append(InputDrift(name, test.statistic, test.pvalue, len(values)))
        return DriftSummary(
            skill=self.skill,
            version=self.version,
            window_start=window.start,
            window_end=window.end,
            n_samples=window.n,
            class_mix_psi=categorical_psi(
                self.reference.class_weights(), dict(window.classes), self.epsilon
            ),
            confidence_psi=histogram_psi(
                self.reference.confidence, window.confidences, self.epsilon
            ),
            inputs=tuple(inputs),
            alarms=tuple(sorted(window.alarms)),
            accuracy=window.correct / window.labelled if window.labelled else None,
            n_labelled=window.labelled,
        )
