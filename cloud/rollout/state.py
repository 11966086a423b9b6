"""A rollout's state: the facts the engine has joined and how far it has gone.

:class:`RolloutState` is a frozen value with a canonical JSON form, so the
store can keep it and another hub process can carry on from it. Facts are
joined order-free: for each device (and version) the newest ``at_ms`` wins,
ties go to the worse news, the versions a device has reported running only
grow, the operator's pause or resume is the newest of them, and abort and
rollback stick once seen.
"""

from __future__ import annotations

import enum
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from cloud.errors import ValidationError
from cloud.parsed_texts import ParsedTexts
from cloud.rollout.events import (
    OUTCOMES,
    Command,
    DeviceOutcome,
    DevicePresence,
    FleetStop,
    KpiWindow,
    Targets,
    Tick,
)

__all__ = ["Admission", "FactDraft", "Phase", "RolloutState", "apply_control"]


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValidationError(message)


class Phase(enum.StrEnum):
    """Where a rollout is; ``paused`` is shown over a running phase, never stored."""

    PENDING = "pending"
    CANARY = "canary"
    SOAKING = "soaking"
    WAVE = "wave"
    PAUSED = "paused"
    COMPLETED = "completed"
    ABORTED = "aborted"
    ROLLED_BACK = "rolled_back"


#: Stages a rollout never leaves.
ENDED = frozenset({Phase.ABORTED, Phase.ROLLED_BACK})


@dataclass(frozen=True)
class Admission:
    """A device the engine admitted: to which version, from which, and when."""

    version: str
    previous: str
    at_ms: int


def empty() -> Mapping[Any, Any]:
    """A fresh read-only empty mapping."""
    return MappingProxyType({})


@dataclass(frozen=True)
class RolloutState:
    """Everything the engine knows about one rollout (build it with the new version only).

    ``admitted`` maps each device the deployment reaches now to its :class:`Admission`.
    Times are ms; -1 means never.
    """

    version: str
    stage: Phase = Phase.PENDING
    clock_ms: int = -1
    targets: frozenset[str] = frozenset()
    targets_at_ms: int = -1
    previous: Mapping[str, str] = field(default_factory=empty)
    outcomes: Mapping[str, tuple[int, str, str]] = field(default_factory=empty)
    ran: Mapping[str, frozenset[str]] = field(default_factory=empty)
    presence: Mapping[str, tuple[int, bool]] = field(default_factory=empty)
    kpis: Mapping[tuple[str, str], KpiWindow] = field(default_factory=empty)
    hold: tuple[int, bool] = (-1, False)  # newest pause (True) or resume
    fleet_stop: tuple[int, bool] = (-1, False)
    abort_at_ms: int = -1
    rollback_at_ms: int = -1
    admitted: Mapping[str, Admission] = field(default_factory=empty)
    reverted: Mapping[str, str] = field(default_factory=empty)
    waves_opened: int = 0
    wave_limit: int = 0
    wave_opened_ms: int = -1
    hold_since_ms: int = -1
    paused_reason: str = ""
    reason: str = ""

    def __post_init__(self) -> None:
        """Refuse a state without the version it rolls out."""
        _check(isinstance(self.version, str) and bool(self.version), "a rollout needs a version")

    @property
    def phase(self) -> Phase:
        """The stage, or ``paused`` while a running rollout holds."""
        running = self.stage not in ENDED and self.stage is not Phase.COMPLETED
        return Phase.PAUSED if self.paused_reason and running else self.stage

    def to_json(self) -> str:
        """The state as canonical JSON text (sorted keys, no spaces).

        A pass changes few of the per-device tables and hands the others on as
        they were, so each table's text is kept by the table (see :data:`_TABLES`):
        at 10,000 devices writing the whole state took a tenth of a second.
        """
        parts = {name: _TABLES.text(name, getattr(self, name)) for name in _TABLE_NAMES}
        parts["schema"] = "1"
        for name in ("version", "hold", "fleet_stop", *_SCALARS):
            parts[name] = _dumps(getattr(self, name))
        parts["stage"] = _dumps(self.stage.value)
        text = "{" + ",".join(f"{_dumps(k)}:{v}" for k, v in sorted(parts.items())) + "}"
        if type(self) is RolloutState:
            _PARSED.keep(text, self)  # the leader reads back what it stored: no parse then
        return text

    @classmethod
    def from_json(cls, text: str) -> RolloutState:
        """Read a state written by :meth:`to_json`.

        A state is immutable, so the last few read or written are kept by their
        text: the leader reads back the state it stored, or the one left unchanged,
        every pass (at 10,000 devices a parse took 75 ms, twice a pass).

        Raises:
            ValidationError: The text is not a stored rollout state.
        """
        return _PARSED.get(text) if cls is RolloutState else cls._parse(text)

    @classmethod
    def _parse(cls, text: str) -> RolloutState:
        try:
            d = json.loads(text)
            _check(d.pop("schema", None) == 1, "unknown schema")
            return cls(
                version=d["version"],
                stage=Phase(d["stage"]),
                targets=frozenset(d["targets"]),
                previous=MappingProxyType(dict(d["previous"])),
                outcomes=MappingProxyType({k: tuple(v) for k, v in d["outcomes"].items()}),
                ran=MappingProxyType({k: frozenset(v) for k, v in d["ran"].items()}),
                presence=MappingProxyType({k: tuple(v) for k, v in d["presence"].items()}),
                kpis=MappingProxyType({(r[0], r[1]): _kpi_from_row(r) for r in d["kpis"]}),
                admitted=MappingProxyType({k: Admission(*v) for k, v in d["admitted"].items()}),
                reverted=MappingProxyType(dict(d["reverted"])),
                hold=tuple(d["hold"]),
                fleet_stop=tuple(d["fleet_stop"]),
                **{name: d[name] for name in _SCALARS},
            )
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
            raise ValidationError(f"not a stored rollout state: {exc}") from None


_SCALARS = (
    "clock_ms",
    "targets_at_ms",
    "abort_at_ms",
    "rollback_at_ms",
    "waves_opened",
    "wave_limit",
    "wave_opened_ms",
    "hold_since_ms",
    "paused_reason",
    "reason",
)


def _dumps(value: Any) -> str:
    return _ENCODE(value)


#: The canonical form's encoder, made once: ``json.dumps`` with arguments makes one a call,
#: which was a third of the cost of writing an entry (hundreds a pass, all on a first pass).
_ENCODE = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode


#: The tables written entry by entry: how one entry is written (its key and value), and
#: whether the table is a JSON list of entries (``kpis``) rather than an object.
_ENTRIES: Mapping[str, tuple[Callable[[Any, Any], str], bool]] = {
    "previous": (lambda d, v: f"{_dumps(d)}:{_dumps(v)}", False),
    "outcomes": (lambda d, v: f"{_dumps(d)}:{_dumps(list(v))}", False),
    "ran": (lambda d, v: f"{_dumps(d)}:{_dumps(sorted(v))}", False),
    "presence": (lambda d, v: f"{_dumps(d)}:{_dumps(list(v))}", False),
    "kpis": (lambda k, w: _dumps([*k, *_kpi_row(w)]), True),
    "admitted": (lambda d, a: f"{_dumps(d)}:{_dumps([a.version, a.previous, a.at_ms])}", False),
    "reverted": (lambda d, v: f"{_dumps(d)}:{_dumps(v)}", False),
}


@dataclass
class _Entries:
    """One table's entries as last written: its keys, in order, and each entry's text."""

    keys: set[Any] = field(default_factory=set)
    order: list[Any] = field(default_factory=list)
    texts: dict[Any, tuple[object, str]] = field(default_factory=dict)

    def text(self, name: str, table: Mapping[Any, Any]) -> str:
        """The table's JSON text, writing again only the entries whose value is a new one.

        A pass changes some entries of a 10,000-device table and hands the others on
        as the same objects; writing every entry of every changed table again took
        most of a rolling rollout's pass (30 ms a table).
        """
        if self.keys != table.keys():
            gone = self.keys - table.keys()
            kept = [k for k in self.order if k not in gone] if gone else self.order
            self.order = sorted([*kept, *(table.keys() - self.keys)])  # mostly in order: fast
            self.keys = set(table)
            for key in gone:
                del self.texts[key]
        write, listed = _ENTRIES[name]
        texts, parts = self.texts, []
        for key in self.order:
            value = table[key]
            kept_text = texts.get(key)
            if kept_text is None or kept_text[0] is not value:  # held: its id stays its own
                kept_text = texts[key] = (value, write(key, value))
            parts.append(kept_text[1])
        body = ",".join(parts)
        return f"[{body}]" if listed else f"{{{body}}}"


#: Every table of a state, by its field.
_TABLE_NAMES = ("targets", *_ENTRIES)


class _Texts:
    """The JSON text of the last tables written, by the table itself (not an equal one)."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._texts: OrderedDict[tuple[str, int], tuple[object, str]] = OrderedDict()
        self._entries: dict[str, _Entries] = {}
        self._lock = threading.Lock()

    def text(self, name: str, table: Any) -> str:
        key = (name, id(table))
        with self._lock:
            kept = self._texts.get(key)
            if kept is not None and kept[0] is table:  # holding the table keeps its id its own
                return kept[1]
            if name in _ENTRIES:
                text = self._entries.setdefault(name, _Entries()).text(name, table)
            else:  # the targets: a sorted list of ids, changed only with the group
                text = _dumps(sorted(table))
            self._texts[key] = (table, text)
            while len(self._texts) > self._size:
                self._texts.popitem(last=False)
        return text


#: Two states of a few rollouts, table by table.
_TABLES = _Texts(8 * len(_TABLE_NAMES))


def _kpi_row(w: KpiWindow) -> tuple[Any, ...]:
    return (w.at_ms, w.inferences, w.labelled, w.correct, w.errors, w.p95_ms)


def _kpi_from_row(r: list[Any]) -> KpiWindow:
    device, version, at_ms, inferences, labelled, correct, errors, p95_ms = r
    return KpiWindow(device, version, inferences, labelled, correct, errors, p95_ms, at_ms)


# --- joining facts: the newest at_ms wins, ties go to the worse news -------------------------

_RANKS: Mapping[str, Any] = {
    "outcomes": lambda v: (v[0], OUTCOMES.index(v[2]), v[1]),
    "presence": lambda v: (v[0], not v[1]),
    "kpis": _kpi_row,
}


class FactDraft:
    """Device facts being joined into a state; a table is copied on its first write only."""

    def __init__(self, state: RolloutState) -> None:
        self.state = state
        self.tables: dict[str, dict[Any, Any]] = {}

    def _table(self, name: str) -> dict[Any, Any]:
        """The draft's own copy of table ``name``, made on the first write only.

        Not ``setdefault(name, dict(...))``: that copies the whole table on every
        write, which made joining a 10,000-device pass's facts quadratic (8-14 s).
        """
        table = self.tables.get(name)
        if table is None:
            table = self.tables[name] = dict(getattr(self.state, name))
        return table

    def _put(self, name: str, key: Any, value: Any) -> None:
        table = self.tables.get(name)
        old = (getattr(self.state, name) if table is None else table).get(key)
        if old is None or _RANKS[name](value) > _RANKS[name](old):
            self._table(name)[key] = value

    def join(self, event: DeviceOutcome | DevicePresence | KpiWindow) -> None:
        """Join one device fact (a stale or duplicate one changes nothing)."""
        d = event.device_id
        if isinstance(event, DeviceOutcome):
            self._put("outcomes", d, (event.at_ms, event.version, event.outcome))
            ran = self.tables.get("ran", self.state.ran)
            if event.outcome == "running" and event.version not in ran.get(d, ()):
                table = self._table("ran")
                table[d] = table.get(d, frozenset()) | {event.version}
        elif isinstance(event, DevicePresence):
            self._put("presence", d, (event.at_ms, event.online))
        else:
            self._put("kpis", (d, event.version), event)

    def freeze(self) -> RolloutState:
        """The state with the facts joined so far."""
        frozen: dict[str, Any] = {k: MappingProxyType(v) for k, v in self.tables.items()}
        return replace(self.state, **frozen) if frozen else self.state


def apply_control(state: RolloutState, event: Tick | Command | FleetStop | Targets) -> RolloutState:
    """Join a control event's fact (if it carries one) and move the clock to its time.

    An event that changes nothing (a tick at or before the clock) returns ``state`` itself.
    """
    at = event.now_ms if isinstance(event, Tick) else event.at_ms
    if at > state.clock_ms:
        state = replace(state, clock_ms=at)
    if isinstance(event, Targets):
        if not _newer_targets(event, state):
            return state
        # Equal tables are kept as they are: the state's text is kept by the table.
        devices = state.targets if state.targets == event.devices else frozenset(event.devices)
        same = state.previous == event.previous
        previous = state.previous if same else MappingProxyType(dict(event.previous))
        return replace(state, targets=devices, previous=previous, targets_at_ms=at)
    changes: dict[str, Any] = {}
    if isinstance(event, Command) and event.kind in ("pause", "resume"):
        changes["hold"] = max(state.hold, (at, event.kind == "pause"))
    elif isinstance(event, Command) and event.kind == "abort":  # abort and rollback stick
        changes["abort_at_ms"] = _first(state.abort_at_ms, at)
    elif isinstance(event, Command):
        changes["rollback_at_ms"] = _first(state.rollback_at_ms, at)
    elif isinstance(event, FleetStop):
        changes["fleet_stop"] = max(state.fleet_stop, (at, event.on))
    if all(getattr(state, name) == value for name, value in changes.items()):
        return state
    return replace(state, **changes)


def _first(seen: int, at: int) -> int:
    return min(seen, at) if seen >= 0 else at


def _newer_targets(event: Targets, state: RolloutState) -> bool:
    if event.at_ms != state.targets_at_ms:
        return event.at_ms > state.targets_at_ms
    mine = (sorted(event.devices), sorted(event.previous.items()))
    return mine > (sorted(state.targets), sorted(state.previous.items()))


#: A pass reads one state and writes two (the unchanged check and the new one).
_PARSED: ParsedTexts[RolloutState] = ParsedTexts(RolloutState._parse, 8)
