"""Rollout plans: how a deployment moves through the devices its group selects (pure, no I/O).

A plan names a strategy (``all-at-once``, ``canary``, ``waves``, ``rolling``
or ``ab``), the gates that must hold between waves, how long to soak, maintenance windows
and a priority. It is read from a small TOML text or the equivalent mapping,
and written back with :meth:`RolloutPlan.to_dict`, so it can be stored beside
its deployment. Every mistake is a :class:`~cloud.errors.ValidationError`
whose one-line message names the bad value.

Example::

    strategy = "canary"
    canary = "10%"          # or a device count
    then = "waves"          # or "all"
    soak_s = 600
    windows = ["mon-fri 01:00-05:00"]
    [waves]
    base_rate_per_min = 10
    increment_factor = 2.0
    max_per_min = 500
    [gates]
    install_failure = "10%"
    accuracy_drop = 2.0

A ``rolling`` plan keeps a bounded number of devices in flight instead of
opening waves of growing size: its first ``max_in_flight`` devices (at least
the gates' samples) are a canary that must report, soak and pass the gates;
after that, each device that reports frees its place for the next one while
every gate passes, and a failing gate stops it and reverts every moved device
as for waves. ``wave_interval_s`` does not apply (``soak_s`` holds after the
first devices)::

    strategy = "rolling"
    [rolling]
    max_in_flight = 300

A plan may also set ``baseline_since_ms`` (ms since the Unix epoch): the KPI
gates then judge the baseline versions only on telemetry windows that end at
or after it. The drift loop sets it to the start of the window that raised a
drift alarm, so a canary is compared with the running version on today's
inputs, not on its record from before the shift.
"""

from __future__ import annotations

import enum
import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cloud.errors import ValidationError
from cloud.rollout.gates import DEFAULT_GATES, DEVICE_GATES, Gate, parse_gates

__all__ = [
    "AbSplit",
    "Canary",
    "PlanStrategy",
    "Rolling",
    "RolloutPlan",
    "Waves",
    "Window",
    "parse_plan",
    "parse_window",
    "plan_from_dict",
]

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_DAY_MIN = 24 * 60
_WEEK_MIN = 7 * _DAY_MIN
_EPOCH_WEEKDAY = 3  # 1970-01-01 was a Thursday
_MAX_FACTOR_POWER = 64  # past this a wave is at its maximum anyway


class PlanStrategy(enum.StrEnum):
    """The ways a plan moves devices; the value is the name in plans."""

    ALL_AT_ONCE = "all-at-once"
    CANARY = "canary"
    WAVES = "waves"
    ROLLING = "rolling"
    AB = "ab"


@dataclass(frozen=True)
class Window:
    """A weekly UTC maintenance window: some weekdays, from ``start_min`` for ``length_min``.

    A window whose end is before its start runs over midnight into the next day.
    """

    text: str
    days: frozenset[int]
    start_min: int
    length_min: int

    def contains(self, now_ms: int) -> bool:
        """Whether the instant ``now_ms`` (ms since the Unix epoch) falls in this window."""
        minute = now_ms // 60_000
        of_week = ((minute // _DAY_MIN + _EPOCH_WEEKDAY) % 7) * _DAY_MIN + minute % _DAY_MIN
        return any(
            (of_week - (day * _DAY_MIN + self.start_min)) % _WEEK_MIN < self.length_min
            for day in self.days
        )


def _day(name: str, text: str) -> int:
    if name not in DAYS:
        raise ValidationError(f"window {text!r}: unknown day {name!r}; days are {', '.join(DAYS)}")
    return DAYS.index(name)


def _days(spec: str, text: str) -> frozenset[int]:
    if spec in ("daily", "*"):
        return frozenset(range(7))
    days: set[int] = set()
    for part in spec.split(","):
        first, _, last = part.partition("-")
        a = _day(first, text)
        b = _day(last, text) if last else a
        days.update((a + i) % 7 for i in range((b - a) % 7 + 1))
    return frozenset(days)


def _minute(hh: str, mm: str, text: str, *, end: bool) -> int:
    value = int(hh) * 60 + int(mm)
    if int(mm) > 59 or value > _DAY_MIN or (value == _DAY_MIN and not end):
        raise ValidationError(f"window {text!r}: bad time {hh}:{mm}; use 00:00 to 24:00")
    return value


_WINDOW_RE = re.compile(r"(\S+)\s+(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})")


def parse_window(text: str) -> Window:
    """Read a window such as ``"mon-fri 01:00-05:00"`` or ``"sat,sun 22:00-02:00"``.

    Args:
        text: Days (``daily``, ``*``, or a comma list of days and day ranges)
            then ``HH:MM-HH:MM`` in UTC.

    Returns:
        The window.

    Raises:
        ValidationError: Unreadable text, an unknown day, a bad time, or an empty window.
    """
    match = _WINDOW_RE.fullmatch(text.strip().lower()) if isinstance(text, str) else None
    if match is None:
        raise ValidationError(f"bad window {text!r}; expected e.g. 'mon-fri 01:00-05:00' (UTC)")
    days = _days(match[1], text)
    start = _minute(match[2], match[3], text, end=False)
    stop = _minute(match[4], match[5], text, end=True)
    if start == stop:
        raise ValidationError(f"window {text!r} is empty: it starts when it ends")
    return Window(text.strip(), days, start, (stop - start) % _DAY_MIN or _DAY_MIN)


@dataclass(frozen=True)
class Canary:
    """The first wave: ``count`` devices or ``percent`` of the group; ``then`` all or waves."""

    count: int = 0
    percent: float = 0.0
    then: str = "all"

    def size(self, targets: int, floor: int) -> int:
        """Canary devices in a group of ``targets`` (a percentage takes at least ``floor``)."""
        if self.count:
            return min(targets, self.count)
        return min(targets, max(1, math.ceil(targets * self.percent / 100), floor))


@dataclass(frozen=True)
class Waves:
    """Exponential waves: wave ``k`` moves ``base_rate_per_min * increment_factor**k``, capped."""

    base_rate_per_min: int = 10
    increment_factor: float = 2.0
    max_per_min: int = 1000

    def size(self, k: int) -> int:
        """Devices wave ``k`` (from 0) may move."""
        rate = self.base_rate_per_min * self.increment_factor ** min(k, _MAX_FACTOR_POWER)
        return max(1, min(self.max_per_min, math.floor(rate)))


@dataclass(frozen=True)
class Rolling:
    """A rolling rollout: at most ``max_in_flight`` devices moved and not yet reported."""

    max_in_flight: int = 100


@dataclass(frozen=True)
class AbSplit:
    """An A/B test: ``weight`` percent of the group takes the new version, the rest ``control``."""

    control: str
    weight: int = 50


@dataclass(frozen=True)
class RolloutPlan:
    """How one deployment rolls out; see the module docstring for the text form."""

    strategy: PlanStrategy = PlanStrategy.ALL_AT_ONCE
    canary: Canary | None = None
    waves: Waves | None = None
    rolling: Rolling | None = None
    ab: AbSplit | None = None
    gates: tuple[Gate, ...] = DEFAULT_GATES
    soak_s: float = 0.0
    min_samples: int = 10
    install_timeout_s: float = 900.0
    wave_interval_s: float = 60.0
    windows: tuple[Window, ...] = ()
    priority: int = 0
    baseline_since_ms: int | None = None

    def __post_init__(self) -> None:
        """Check the strategy has its settings and a canary can satisfy its gates.

        Raises:
            ValidationError: A missing canary, waves or A/B setting, a too-small canary,
                or a negative ``baseline_since_ms``.
        """
        wants = {
            PlanStrategy.CANARY: self.canary,
            PlanStrategy.WAVES: self.waves,
            PlanStrategy.ROLLING: self.rolling,
            PlanStrategy.AB: self.ab,
        }
        if self.strategy in wants and wants[self.strategy] is None:
            raise ValidationError(f"strategy {self.strategy.value!r} needs its settings")
        if self.canary is not None and 0 < self.canary.count < self.device_samples:
            raise ValidationError(
                f"canary of {self.canary.count} devices is under the {self.device_samples}"
                " samples its gates need"
            )
        since = self.baseline_since_ms
        if since is not None and (type(since) is not int or since < 0):
            raise ValidationError(f"baseline_since_ms {since!r} must be a time in ms (>= 0)")

    @property
    def device_samples(self) -> int:
        """Devices a rollout's first wave takes at least, so its device gates can pass."""
        needs = [g.min_samples or 0 for g in self.gates if g.kind in DEVICE_GATES]
        return max([self.min_samples, *needs])

    @property
    def judges_kpis(self) -> bool:
        """Whether a gate judges KPIs (accuracy, p95, errors), not only devices."""
        return any(g.kind not in DEVICE_GATES for g in self.gates)

    def in_window(self, now_ms: int) -> bool:
        """Whether devices may be moved at ``now_ms``: inside any window, or always with none."""
        return not self.windows or any(w.contains(now_ms) for w in self.windows)

    def to_dict(self) -> dict[str, Any]:
        """The plan as a JSON- and TOML-ready mapping that :func:`plan_from_dict` reads back."""
        out: dict[str, Any] = {
            "strategy": self.strategy.value,
            "gates": {g.kind.value: g.to_dict() for g in self.gates},
            "soak_s": self.soak_s,
            "min_samples": self.min_samples,
            "install_timeout_s": self.install_timeout_s,
            "wave_interval_s": self.wave_interval_s,
            "windows": [w.text for w in self.windows],
            "priority": self.priority,
        }
        if self.canary is not None:
            out["canary"] = self.canary.count or f"{self.canary.percent:g}%"
            out["then"] = self.canary.then
        if self.waves is not None:
            out["waves"] = {
                "base_rate_per_min": self.waves.base_rate_per_min,
                "increment_factor": self.waves.increment_factor,
                "max_per_min": self.waves.max_per_min,
            }
        if self.rolling is not None:
            out["rolling"] = {"max_in_flight": self.rolling.max_in_flight}
        if self.ab is not None:
            out["ab"] = {"control": self.ab.control, "weight": self.ab.weight}
        if self.baseline_since_ms is not None:  # left out when unset, as in plans stored before it
            out["baseline_since_ms"] = self.baseline_since_ms
        return out


_KEYS = frozenset(RolloutPlan.__dataclass_fields__) | {"then"}


def _number(data: Mapping[str, Any], key: str, default: float, lo: float, hi: float) -> float:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise ValidationError(f"{key} {value!r} must be a number from {lo:g} to {hi:g}")
    return float(value)


def _whole(data: Mapping[str, Any], key: str, default: int, lo: int, hi: int) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValidationError(f"{key} {value!r} must be a whole number from {lo} to {hi}")
    return value


_MAX_MS = 2**53  # the latest instant a plan may name, still exact as a JSON double


def _since(data: Mapping[str, Any]) -> int | None:
    if data.get("baseline_since_ms") is None:
        return None
    return _whole(data, "baseline_since_ms", 0, 0, _MAX_MS)


def _table(data: Mapping[str, Any], key: str, known: tuple[str, ...]) -> Mapping[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, Mapping):
        raise ValidationError(f"{key} must be a table with {', '.join(known)}, not {value!r}")
    extra = sorted(set(value) - set(known))
    if extra:
        raise ValidationError(f"{key} has unknown key {extra[0]!r}; known: {', '.join(known)}")
    return value


def _canary(data: Mapping[str, Any]) -> Canary:
    spec, then = data.get("canary", "10%"), data.get("then", "all")
    if then not in ("all", "waves"):
        raise ValidationError(f"then {then!r} must be 'all' or 'waves'")
    if isinstance(spec, str) and spec.strip().endswith("%"):
        try:
            percent = float(spec.strip()[:-1])
        except ValueError:
            percent = math.nan
        if not 0 < percent < 100:
            raise ValidationError(f"canary {spec!r} must be more than 0% and less than 100%")
        return Canary(percent=percent, then=then)
    if isinstance(spec, bool) or not isinstance(spec, int) or spec < 1:
        raise ValidationError(f"canary {spec!r} must be a device count or a percentage like '10%'")
    return Canary(count=spec, then=then)


def _waves(data: Mapping[str, Any]) -> Waves:
    spec = _table(data, "waves", ("base_rate_per_min", "increment_factor", "max_per_min"))
    base = _whole(spec, "base_rate_per_min", 10, 1, 100_000)
    top = _whole(spec, "max_per_min", max(base, 1000), base, 100_000)
    return Waves(base, _number(spec, "increment_factor", 2.0, 1.0, 5.0), top)


def _rolling(data: Mapping[str, Any]) -> Rolling:
    spec = _table(data, "rolling", ("max_in_flight",))
    return Rolling(_whole(spec, "max_in_flight", 100, 1, 100_000))


def _ab(data: Mapping[str, Any]) -> AbSplit:
    spec = _table(data, "ab", ("control", "weight"))
    control = spec.get("control")
    if not isinstance(control, str) or not control.strip():
        raise ValidationError(f"ab control {control!r} must name the version to compare with")
    return AbSplit(control.strip(), _whole(spec, "weight", 50, 1, 99))


def _only_for(data: Mapping[str, Any], strategy: PlanStrategy, uses_waves: bool) -> None:
    """Refuse settings the chosen strategy would silently ignore."""
    applies = {
        "canary": strategy is PlanStrategy.CANARY,
        "then": strategy is PlanStrategy.CANARY,
        "waves": uses_waves,
        "rolling": strategy is PlanStrategy.ROLLING,
        "ab": strategy is PlanStrategy.AB,
    }
    for key, ok in applies.items():
        if key in data and not ok:
            raise ValidationError(f"{key} does not apply to strategy {strategy.value!r}")


def plan_from_dict(data: Mapping[str, Any]) -> RolloutPlan:
    """Build a plan from its mapping form (as :meth:`RolloutPlan.to_dict` writes it).

    Args:
        data: The plan's keys; every key is optional and ``strategy`` defaults to all-at-once.

    Returns:
        The plan.

    Raises:
        ValidationError: An unknown key or strategy, or a value out of range.
    """
    if not isinstance(data, Mapping):
        raise ValidationError(f"a rollout plan must be a table, not {data!r}")
    extra = sorted(set(data) - _KEYS)
    if extra:
        raise ValidationError(
            f"unknown rollout plan key {extra[0]!r}; known: {', '.join(sorted(_KEYS))}"
        )
    name = data.get("strategy", PlanStrategy.ALL_AT_ONCE.value)
    try:
        strategy = PlanStrategy(name)
    except ValueError:
        known = ", ".join(s.value for s in PlanStrategy)
        raise ValidationError(f"unknown rollout strategy {name!r}; known: {known}") from None
    min_samples = _whole(data, "min_samples", 10, 1, 1_000_000)
    canary = _canary(data) if strategy is PlanStrategy.CANARY else None
    uses_waves = strategy is PlanStrategy.WAVES or (canary is not None and canary.then == "waves")
    _only_for(data, strategy, uses_waves)
    windows = data.get("windows", [])
    if isinstance(windows, str) or not isinstance(windows, list | tuple):
        raise ValidationError(f"windows {windows!r} must be a list like ['mon-fri 01:00-05:00']")
    return RolloutPlan(
        strategy=strategy,
        canary=canary,
        waves=_waves(data) if uses_waves else None,
        rolling=_rolling(data) if strategy is PlanStrategy.ROLLING else None,
        ab=_ab(data) if strategy is PlanStrategy.AB else None,
        gates=parse_gates(data["gates"]) if "gates" in data else DEFAULT_GATES,
        soak_s=_number(data, "soak_s", 0.0, 0, 30 * 86_400),
        min_samples=min_samples,
        install_timeout_s=_number(data, "install_timeout_s", 900.0, 1, 7 * 86_400),
        wave_interval_s=_number(data, "wave_interval_s", 60.0, 0, 86_400),
        windows=tuple(parse_window(w) for w in windows),
        priority=_whole(data, "priority", 0, -1_000_000, 1_000_000),
        baseline_since_ms=_since(data),
    )


def parse_plan(text: str) -> RolloutPlan:
    """Read a plan from text: a bare strategy name, or the TOML form of the module docstring.

    Args:
        text: ``"canary"`` or TOML such as ``strategy = "waves"``.

    Returns:
        The plan.

    Raises:
        ValidationError: Unreadable TOML, or anything :func:`plan_from_dict` refuses.
    """
    bare = text.strip()
    if bare in {s.value for s in PlanStrategy}:
        return plan_from_dict({"strategy": bare})
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValidationError(f"rollout plan is not valid TOML: {exc}") from None
    return plan_from_dict(data)
