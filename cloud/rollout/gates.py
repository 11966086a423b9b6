"""Rollout gates: the checks a rollout must pass before it moves more devices (pure, no I/O).

A gate reads :class:`Observations` (counts the engine gathers from device
facts) and answers :class:`Verdict` ``pass``, ``wait`` or ``fail`` with a
one-line reason. Too few samples is always ``wait``, never ``pass``; a gate
that has enough samples and is over its limit fails at once, soak or not; a
gate within its limit passes only after it has soaked ``soak_s`` seconds into
the current hold.

Device gates (install failures, offline, health) count devices; their sample
need is capped by how many admitted devices could report, so a group smaller
than ``min_samples`` can finish (the engine admits at least the sample need in
a rollout's first wave, so the cap bites only there). KPI gates (accuracy, p95 latency, error rate)
compare the new version with the baseline on the same group and count
inferences (labelled inferences for accuracy).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cloud.errors import ValidationError

__all__ = [
    "DEFAULT_GATES",
    "DEVICE_GATES",
    "Gate",
    "GateKind",
    "GateResult",
    "KpiTotals",
    "Observations",
    "Verdict",
    "evaluate_gate",
    "parse_gates",
]


class GateKind(enum.StrEnum):
    """What a gate measures; the value is the name used in plans."""

    INSTALL_FAILURE = "install_failure"  # limit: most failed share of finished installs
    OFFLINE = "offline"  # limit: most share of moved devices gone offline
    HEALTH = "health"  # limit: most share of devices that ran and then failed
    ACCURACY_DROP = "accuracy_drop"  # limit: most accuracy points lost against the baseline
    P95_RATIO = "p95_ratio"  # limit: most p95 latency ratio to the baseline
    ERROR_RATE = "error_rate"  # limit: most error-rate points gained against the baseline


#: Gates that count devices (the others count inferences).
DEVICE_GATES = frozenset({GateKind.INSTALL_FAILURE, GateKind.OFFLINE, GateKind.HEALTH})


class Verdict(enum.StrEnum):
    """A gate's answer."""

    PASS = "pass"  # noqa: S105 - a verdict, not a secret
    WAIT = "wait"
    FAIL = "fail"


@dataclass(frozen=True)
class Gate:
    """One gate of a plan; ``None`` sample or soak settings take the plan's.

    Raises:
        ValidationError: A limit out of range or a negative sample count or soak.
    """

    kind: GateKind
    limit: float
    min_samples: int | None = None
    soak_s: float | None = None

    def __post_init__(self) -> None:
        """Check the limit fits the kind."""
        object.__setattr__(self, "kind", GateKind(self.kind))
        if not math.isfinite(self.limit) or self.limit < 0:
            raise ValidationError(f"gate {self.kind} limit {self.limit!r} must be >= 0")
        if self.kind in DEVICE_GATES and self.limit > 1:
            raise ValidationError(f"gate {self.kind} limit {self.limit!r} is a fraction 0..1")
        if self.kind is GateKind.P95_RATIO and self.limit < 1:
            raise ValidationError(f"gate p95_ratio limit {self.limit!r} must be >= 1")
        if self.min_samples is not None and self.min_samples < 1:
            raise ValidationError(f"gate {self.kind} min_samples {self.min_samples!r} must be >= 1")
        if self.soak_s is not None and not 0 <= self.soak_s < math.inf:
            raise ValidationError(f"gate {self.kind} soak_s {self.soak_s!r} must be >= 0")

    def to_dict(self) -> dict[str, Any]:
        """The plan form of this gate (what :func:`parse_gates` reads back)."""
        out: dict[str, Any] = {"max": self.limit}
        if self.min_samples is not None:
            out["min_samples"] = self.min_samples
        if self.soak_s is not None:
            out["soak_s"] = self.soak_s
        return out


#: The gates of a plan that names none: stop when a tenth of installs fail or devices break.
DEFAULT_GATES = (Gate(GateKind.INSTALL_FAILURE, 0.1), Gate(GateKind.HEALTH, 0.1))


@dataclass(frozen=True)
class KpiTotals:
    """Summed KPI windows of one version; ``p95_ms`` is the median of the devices' p95."""

    devices: int = 0
    inferences: int = 0
    labelled: int = 0
    correct: int = 0
    errors: int = 0
    p95_ms: float = 0.0

    @property
    def accuracy(self) -> float:
        """Correct share of labelled inferences (0 with no labels)."""
        return self.correct / self.labelled if self.labelled else 0.0

    @property
    def error_rate(self) -> float:
        """Errored share of inferences (0 with none)."""
        return self.errors / self.inferences if self.inferences else 0.0


@dataclass(frozen=True)
class Observations:
    """What the gates read, gathered by the engine from device facts."""

    targets: int = 0
    admitted: int = 0
    finished: int = 0
    install_failed: int = 0
    ran: int = 0
    health_failed: int = 0
    offline: int = 0
    candidate: KpiTotals = KpiTotals()
    baseline: KpiTotals = KpiTotals()


@dataclass(frozen=True)
class GateResult:
    """A gate's verdict and the one line that explains it."""

    gate: Gate
    verdict: Verdict
    reason: str


def _pct(x: float) -> str:
    return f"{x * 100:.1f}%"


def _share(label: str, bad: int, total: int, limit: float) -> tuple[bool, str]:
    value = bad / total if total else 0.0
    return value > limit, f"{label} {_pct(value)} ({bad} of {total}), limit {_pct(limit)}"


def _measure(gate: Gate, obs: Observations) -> tuple[int, float, bool, str]:
    """Samples, samples needed before deciding (ignoring min_samples), over-limit, reason."""
    cand, base, lim = obs.candidate, obs.baseline, gate.limit
    if gate.kind is GateKind.INSTALL_FAILURE:
        bad, text = _share("install failures", obs.install_failed, obs.finished, lim)
        return obs.finished, obs.admitted, bad, text
    if gate.kind is GateKind.OFFLINE:
        bad, text = _share("offline", obs.offline, obs.admitted, lim)
        return obs.admitted, obs.admitted, bad, text
    if gate.kind is GateKind.HEALTH:
        bad, text = _share("unhealthy after start", obs.health_failed, obs.ran, lim)
        return obs.ran, obs.admitted - obs.install_failed, bad, text
    if gate.kind is GateKind.ACCURACY_DROP:
        points = (cand.accuracy - base.accuracy) * 100
        text = (
            f"accuracy {cand.accuracy:.2f} vs {base.accuracy:.2f} baseline: "
            f"{points:+.1f} points, limit {-lim:.1f}"
        )
        return min(cand.labelled, base.labelled), math.inf, points < -lim, text
    if gate.kind is GateKind.P95_RATIO:
        ratio = cand.p95_ms / base.p95_ms if base.p95_ms > 0 else math.inf
        text = (
            f"p95 latency {cand.p95_ms:.1f} ms vs {base.p95_ms:.1f} ms baseline: "
            f"{ratio:.2f}x, limit {lim:.2f}x"
        )
        return min(cand.inferences, base.inferences), math.inf, ratio > lim, text
    points = (cand.error_rate - base.error_rate) * 100
    text = (
        f"error rate {_pct(cand.error_rate)} vs {_pct(base.error_rate)} baseline: "
        f"{points:+.1f} points, limit +{lim:.1f}"
    )
    return min(cand.inferences, base.inferences), math.inf, points > lim, text


def evaluate_gate(
    gate: Gate, obs: Observations, *, min_samples: int, soak_s: float, soaked_s: float
) -> GateResult:
    """Judge one gate.

    Args:
        gate: The gate.
        obs: What the fleet shows now.
        min_samples: The plan's sample need, used when the gate sets none.
        soak_s: The plan's soak, used when the gate sets none.
        soaked_s: Seconds since the current hold began (0 while devices are in flight).

    Returns:
        ``fail`` when enough samples are over the limit; ``wait`` with too few
        samples or before the soak is over; ``pass`` otherwise.
    """
    samples, reachable, over, text = _measure(gate, obs)
    need = int(min(gate.min_samples or min_samples, max(reachable, 0)))
    if samples < need:
        return GateResult(
            gate, Verdict.WAIT, f"{gate.kind}: waiting for samples ({samples} of {need})"
        )
    if over:
        return GateResult(gate, Verdict.FAIL, text)
    soak = gate.soak_s if gate.soak_s is not None else soak_s
    if soaked_s < soak:
        return GateResult(
            gate, Verdict.WAIT, f"{gate.kind}: soaking, {soaked_s:.0f} s of {soak:.0f} s"
        )
    return GateResult(gate, Verdict.PASS, text)


def _limit(kind: GateKind, value: object) -> float:
    """A limit from a plan: a number, or for share gates also a percentage like ``"10%"``."""
    if isinstance(value, str) and kind in DEVICE_GATES and value.strip().endswith("%"):
        try:
            return float(value.strip()[:-1]) / 100
        except ValueError:
            pass
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise ValidationError(f"gate {kind} limit {value!r} is not a number (or a percentage)")


_GATE_KEYS = ("max", "min_samples", "soak_s")


def _one_gate(name: str, spec: object) -> Gate:
    try:
        kind = GateKind(name)
    except ValueError:
        known = ", ".join(k.value for k in GateKind)
        raise ValidationError(f"unknown gate {name!r}; known: {known}") from None
    if not isinstance(spec, Mapping):
        return Gate(kind, _limit(kind, spec))
    extra = sorted(set(spec) - set(_GATE_KEYS))
    if extra or "max" not in spec:
        what = f"unknown key {extra[0]!r}" if extra else "no 'max'"
        raise ValidationError(f"gate {name!r} has {what}; keys: max, min_samples, soak_s")
    opts: dict[str, Any] = {}
    for key in ("min_samples", "soak_s"):
        if key in spec:
            value = spec[key]
            kinds = int if key == "min_samples" else int | float
            if isinstance(value, bool) or not isinstance(value, kinds):
                raise ValidationError(f"gate {name!r} {key} {value!r} is not a number")
            opts[key] = int(value) if key == "min_samples" else float(value)
    return Gate(kind, _limit(kind, spec["max"]), **opts)


def parse_gates(spec: object) -> tuple[Gate, ...]:
    """Read the ``gates`` table of a plan.

    Args:
        spec: A mapping of gate name to a limit (``0.1``, ``"10%"``) or to a table
            with ``max`` and optionally ``min_samples`` and ``soak_s``.

    Returns:
        The gates, in a fixed order (by kind).

    Raises:
        ValidationError: An unknown gate or key, or a bad limit.
    """
    if not isinstance(spec, Mapping):
        raise ValidationError(f"gates must be a table of gate = limit, not {spec!r}")
    gates = [_one_gate(str(name), value) for name, value in spec.items()]
    order = list(GateKind)
    return tuple(sorted(gates, key=lambda g: order.index(g.kind)))
