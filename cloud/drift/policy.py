"""The hub's drift policy: fleet drift and incidents in, open and close decisions out (pure).

:func:`evaluate` reads each :class:`~cloud.drift.aggregate.DriftAggregate`
at ``now_ms`` and says :class:`OpenIncident` when enough devices drift: at
least ``min_devices`` of them *and* at least ``min_share`` of what the
devices that count saw (their windows' samples; a device counts with a
window of ``min_samples`` samples or more, smaller ones are ignored). A
device that saw more inputs weighs more, and a window of a handful of
samples, whose PSI is mostly noise, opens nothing. It never opens a
second incident for a skill version and group while one is open or within
``cooldown_s`` of one closing.

It says :class:`CloseIncident` for an incident nobody has started work on
(stage ``open``) once its fleet has stayed calm for ``hold_s``: at every
moment of the hold at least ``min_devices`` devices counted and under
``release_ratio * min_share`` of their samples were on drifting devices. The gap between the share
that opens and the share that closes is the hysteresis; a fleet that went
silent proves nothing and closes nothing.

Nothing here reads a clock, a store or the network: the drift loop feeds
aggregates and incident records in and carries the decisions out.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from cloud.drift.aggregate import DriftAggregate, DriftKey, FleetDrift, Tally
from cloud.drift.incident import IncidentState, Stage
from cloud.errors import ValidationError

__all__ = ["CloseIncident", "Decision", "DriftPolicy", "OpenIncident", "evaluate"]


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValidationError(message)


def _real_in(value: object, low: float, high: float, *, open_low: bool = False) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return False
    return (low < value if open_low else low <= value) and value <= high


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


@dataclass(frozen=True)
class DriftPolicy:
    """When drift on a group opens an incident, and when the incident closes again.

    Attributes:
        psi_threshold: A device drifts when a PSI of its window is over this.
        accuracy_drop: ... or its labelled accuracy is more than this under
            the version's reference accuracy ...
        min_labelled: ... judged only on windows with this many labels.
        min_devices: Drifting devices an incident needs.
        min_share: Share of the counted devices' samples an incident needs on
            drifting devices.
        min_samples: Samples a device's window needs to count (a smaller
            window is ignored: it neither drifts nor hides a larger one).
        cooldown_s: Seconds after an incident closes before the next may open.
        window_s: Seconds a window stays its device's state.
        hold_s: Seconds the fleet must stay calm before an incident closes.
        release_ratio: Calm means a drifting share under ``release_ratio * min_share``.

    Raises:
        ValidationError: A setting that is out of range or not a number.
    """

    psi_threshold: float = 0.25
    accuracy_drop: float = 0.05
    min_labelled: int = 30
    min_devices: int = 3
    min_share: float = 0.2
    min_samples: int = 100
    cooldown_s: float = 3600.0
    window_s: float = 600.0
    hold_s: float = 900.0
    release_ratio: float = 0.5

    def __post_init__(self) -> None:
        """Check every setting."""
        day = 86_400.0 * 365
        ranges = {
            "psi_threshold": (0.0, 1e6, True),
            "accuracy_drop": (0.0, 1.0, False),
            "min_share": (0.0, 1.0, True),
            "cooldown_s": (0.0, day, False),
            "window_s": (0.0, day, True),
            "hold_s": (0.0, day, False),
            "release_ratio": (0.0, 1.0, True),
        }
        for name, (low, high, open_low) in ranges.items():
            value = getattr(self, name)
            span = f"{'(' if open_low else '['}{low:g}, {high:g}]"
            _check(_real_in(value, low, high, open_low=open_low), f"{name}={value!r} not in {span}")
        for name in ("min_labelled", "min_devices", "min_samples"):
            value = getattr(self, name)
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
            _check(ok, f"{name}={value!r} must be a whole number of at least 1")
        _check(_ms(self.window_s) >= 1, f"window_s={self.window_s!r} is under a millisecond")

    @property
    def window_ms(self) -> int:
        """``window_s`` in ms."""
        return _ms(self.window_s)

    @property
    def retention_ms(self) -> int:
        """How far back windows matter: a state's span plus the hold before it."""
        return _ms(self.window_s) + _ms(self.hold_s)

    def shift_start_ms(self, opened_ms: int) -> int:
        """Where the span that opened an incident at ``opened_ms`` began.

        The first instant of the shifted world as far as the hub knows: a
        retraining takes its samples from here on, and the canary's baseline is
        judged on telemetry from here on. What came before is the world before
        the shift, which the running model knows already.
        """
        return opened_ms - self.window_ms

    def fires(self, fleet: FleetDrift) -> bool:
        """Whether these fleet numbers open an incident."""
        return fleet.drifting >= self.min_devices and fleet.share >= self.min_share

    def calm(self, tally: Tally) -> bool:
        """Whether a fleet with these counts is back under the release threshold."""
        release = self.release_ratio * self.min_share
        enough = tally.counted >= self.min_devices
        return enough and tally.drifting_samples < release * tally.samples


@dataclass(frozen=True)
class OpenIncident:
    """Open a drift incident for a skill version on a group.

    Attributes:
        devices: The drifting devices that counted, sorted.
        numbers: The fleet numbers that fired the policy.
    """

    skill: str
    version: str
    group: str
    reason: str
    devices: tuple[str, ...]
    numbers: FleetDrift


@dataclass(frozen=True)
class CloseIncident:
    """Close (clear) a drift incident whose fleet has been calm for the hold."""

    incident_id: int
    skill: str
    version: str
    group: str
    reason: str
    numbers: FleetDrift


Decision = OpenIncident | CloseIncident


def evaluate(
    policy: DriftPolicy,
    aggregates: Iterable[DriftAggregate],
    incidents: Iterable[IncidentState],
    now_ms: int,
) -> list[Decision]:
    """Decide which incidents open and close at ``now_ms``.

    Args:
        policy: The drift policy.
        aggregates: The drift aggregates, at most one per skill version and group.
        incidents: The open incidents and those closed within the cooldown
            (older closed ones may be passed too; they change nothing).
        now_ms: The time to decide at, ms since the Unix epoch.

    Returns:
        The decisions, ordered by skill, version and group.

    Raises:
        ValidationError: A bad time, or two aggregates for one skill version and group.
    """
    _check(isinstance(now_ms, int) and not isinstance(now_ms, bool), f"bad time {now_ms!r}")
    by_key: dict[DriftKey, list[IncidentState]] = {}
    for incident in incidents:
        key = DriftKey(incident.skill, incident.version, incident.group)
        by_key.setdefault(key, []).append(incident)
    seen: set[DriftKey] = set()
    decisions: list[Decision] = []
    for agg in sorted(aggregates, key=lambda a: a.key):
        _check(agg.key not in seen, f"two drift aggregates for {agg.key}")
        seen.add(agg.key)
        decisions.extend(_decide(policy, agg, by_key.get(agg.key, []), now_ms))
    return decisions


def _decide(
    policy: DriftPolicy, agg: DriftAggregate, incidents: list[IncidentState], now_ms: int
) -> list[Decision]:
    live = sorted((i for i in incidents if i.closed_ms is None), key=lambda i: i.id)
    if live:
        return [c for i in live if (c := _maybe_close(policy, agg, i, now_ms)) is not None]
    cooldown = _ms(policy.cooldown_s)
    if any(now_ms - i.closed_ms < cooldown for i in incidents if i.closed_ms is not None):
        return []
    states = agg.devices(policy, now_ms)
    fleet = agg.fleet(policy, now_ms)
    if not policy.fires(fleet):
        return []
    drifting = tuple(d for d, s in states.items() if s.drifting)
    causes = Counter(c for d in drifting for c in sorted(states[d].causes))
    why = ", ".join(f"{c} on {causes[c]}" for c in ("psi", "alarm", "accuracy") if causes[c])
    reason = (
        f"{fleet.drifting} of {fleet.counted} devices drifting "
        f"({fleet.share:.0%} of samples >= {policy.min_share:.0%}): {why}"
    )
    k = agg.key
    return [OpenIncident(k.skill, k.version, k.group, reason, drifting, fleet)]


def _maybe_close(
    policy: DriftPolicy, agg: DriftAggregate, incident: IncidentState, now_ms: int
) -> CloseIncident | None:
    hold_ms = _ms(policy.hold_s)
    if incident.stage is not Stage.OPEN or now_ms - incident.opened_ms < hold_ms:
        return None
    timeline = agg.timeline(policy, now_ms - hold_ms, now_ms)
    if not all(policy.calm(tally) for tally in timeline):
        return None
    fleet = agg.fleet(policy, now_ms)
    release = policy.release_ratio * policy.min_share
    reason = (
        f"calm for {policy.hold_s:g}s: {fleet.drifting} of {fleet.counted} devices "
        f"drifting ({fleet.share:.0%} of samples < {release:.0%})"
    )
    k = agg.key
    return CloseIncident(incident.id, k.skill, k.version, k.group, reason, fleet)
