"""The leader's rollout loop: the pure rollout engine driven from the store.

Every tick (about a second) the leader reads each staged rollout the engine
still moves, turns what the fleet shows into engine events (each target's
reported state of the skill, its derived presence, its telemetry totals per
version, the group's devices and what they run, the operator's commands, the
fleet stop switch, and the time), runs :func:`cloud.rollout.engine.run`, and
stores the outcome with :meth:`cloud.store.Store.save_rollout`: the new state,
the desired state of the devices it moved and the events that say why, in one
transaction that is refused if another process wrote the rollout first.

All state is in the store, so a hub killed mid-rollout, or a new leader,
carries on from the last stored pass; facts are joined order-free by the
engine, so reading them again is harmless. The loop keeps each rollout's last
pass (:class:`LastPass`) only to spare work: a pass reads the targets' rows
only when the fleet stamp says a write may have changed them since, and only the
rows of the reports stored lately when only reports moved it
(:mod:`cloud.store.fleet_stamp`; heartbeats of devices online anyway count only
once one of them may have gone quiet), and builds facts and events only for
the devices whose rows changed (and every target's presence once one may have
gone quiet), as long as the stored state is the one that pass left; otherwise
it joins everything again. A new leader starts with no last pass, so it reads
everything. The engine still runs every pass, since time alone moves timeouts,
soaks and maintenance windows. A plan that is no A/B test and none of whose
gates judges KPIs has its KPI totals (shown in its status, waited on by
nothing) read every :data:`KPI_STATUS_MS`, not every pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from operator import attrgetter

from cloud.errors import NotFoundError, ValidationError
from cloud.loops import LoopFactory
from cloud.presence import presence, stale_after_ms
from cloud.rollout.engine import gate_results, run
from cloud.rollout.events import (
    Aborted,
    Admit,
    Command,
    Completed,
    Decision,
    DeviceOutcome,
    DevicePresence,
    Event,
    FleetStop,
    KpiWindow,
    Paused,
    Revert,
    Targets,
    Tick,
)
from cloud.rollout.gates import Verdict
from cloud.rollout.plan import RolloutPlan, plan_from_dict
from cloud.rollout.state import Phase, RolloutState
from cloud.store import Store
from cloud.store.rollout_facts import KpiTally
from cloud.store.rollouts import RolloutFacts, RolloutRecord, RolloutUpdate
from protos.envelope import now_ms

__all__ = [
    "KPI_STATUS_MS",
    "ROLLING_TICK_S",
    "ROLLOUT_TICK_S",
    "LastPass",
    "RolloutLoop",
    "engine_events",
    "plan_of",
    "update_for",
]

log = logging.getLogger(__name__)

#: How often the leader moves rollouts along.
ROLLOUT_TICK_S = 1.0
#: How often while a rolling rollout is under way: a place its reports free waits
#: for the next pass to be filled, and a whole tick of it idles the fleet's upgrade.
ROLLING_TICK_S = 0.25
#: Longest a pass takes the fleet stamp's word that no target's row changed (or only reports).
REREAD_MS = 30_000
#: How old the KPI totals of a rollout may grow when it is no A/B test and none of its gates
#: judges KPIs: they are then only shown (the status's candidate and baseline), not waited on;
#: reading and joining them every pass was a third of a pass at 10,000 devices.
KPI_STATUS_MS = 5_000


def plan_of(rollout: RolloutRecord) -> RolloutPlan:
    """The stored plan of a rollout.

    Raises:
        ValidationError: The stored plan is not one the hub writes.
    """
    try:
        return plan_from_dict(json.loads(rollout.plan))
    except ValueError as exc:
        raise ValidationError(f"deployment {rollout.deployment.id}: stored plan: {exc}") from None


#: A KPI window as the facts read it: ``(device, version, inferences, ..., at_ms)``.
_kpi_fact = attrgetter(
    "device_id", "version", "inferences", "labelled", "correct", "errors", "p95_ms", "at_ms"
)


def _outcome(at_ms: int, state: str, version: str, wanted: str) -> tuple[int, str, str] | None:
    """A reported state as the rollout state keeps outcomes, ``(at_ms, version, outcome)``."""
    if state == "running" and version:
        return at_ms, version, "running"
    if state in ("failed", "rolled_back") and (wanted or version):
        return at_ms, wanted or version, state
    return None


@dataclass(frozen=True)
class LastPass:
    """What the loop's last pass of a rollout read and left, for the next pass to diff against.

    ``revision``: the revision of the stored state the pass left (written, or
    found unchanged), None when another process stored over it first. ``facts``: what the pass read.
    ``now_ms``: its time. ``quiet_ms``: the earliest time a target it last saw
    online turns offline by silence alone. ``targets``: its :class:`Targets` event.
    ``rows_read_ms``: when the targets' rows in ``facts`` were last read whole (not
    kept, all or most of them, on the fleet stamp's word). ``kpis_read_ms``: when
    its KPI totals were last read (see :data:`KPI_STATUS_MS`).
    """

    revision: int | None
    facts: RolloutFacts
    now_ms: int
    quiet_ms: int
    targets: Targets
    rows_read_ms: int = 0
    kpis_read_ms: int = 0


@dataclass(frozen=True)
class _Events:
    facts: list[Event]
    controls: list[Event]
    quiet_ms: int
    targets: Targets


def engine_events(
    state: RolloutState,
    facts: RolloutFacts,
    commands: tuple[tuple[str, int], ...],
    now: int,
    last: LastPass | None = None,
) -> tuple[list[Event], list[Event]]:
    """The engine events for one pass: device facts, then controls ending with a tick.

    Outcome, presence and KPI facts the state already holds are left out, so an
    unchanged fleet gives an unchanged state, and a pass joins only what changed
    (joining every target's outcome again was a tenth of a 3,000-device hub's CPU
    during a rollout in waves). ``last``: the pass that left ``state`` and whose
    read ``facts`` was read against (see :class:`LastPass`); only the devices that
    changed since are looked at then, all of them once one may have gone quiet.
    """
    events = _events(state, facts, commands, now, last)
    return events.facts, events.controls


def _events(
    state: RolloutState,
    facts: RolloutFacts,
    commands: tuple[tuple[str, int], ...],
    now: int,
    last: LastPass | None,
) -> _Events:
    # Facts the last pass saw again, at a time no target's presence moved since,
    # were joined into ``state`` then (or lost to newer ones it holds): joining
    # them again changes nothing, so only the changed devices are looked at.
    changed = None if last is None else facts.changed
    timely = changed is not None and last is not None and last.now_ms <= now < last.quiet_ms
    reported = facts.reports.keys() if changed is None else changed
    outcomes = _outcome_events(state, facts, reported)
    presences, quiet_ms = _presence_events(state, facts, changed if timely else None, now)
    if timely and last is not None:
        quiet_ms = min(quiet_ms, last.quiet_ms)
    kept = changed is not None and last is not None and facts.kpis is last.facts.kpis
    controls: list[Event] = [Command(kind, at) for kind, at in commands]
    if facts.fleet_stop[1] >= 0:
        controls.append(FleetStop(facts.fleet_stop[0], facts.fleet_stop[1]))
    targets = _targets(facts, now, last if changed is not None else None)
    controls += [targets, Tick(now)]
    kpis = [] if kept else _kpi_events(state, facts)
    return _Events([*outcomes, *presences, *kpis], controls, quiet_ms, targets)


def _outcome_events(
    state: RolloutState, facts: RolloutFacts, devices: Iterable[str]
) -> list[Event]:
    out: list[Event] = []
    outcomes, reports = state.outcomes, facts.reports
    for device in devices:
        report = reports.get(device)
        if report is not None and device in facts.targets:
            at_ms, st = report
            fact = _outcome(at_ms, st.state, st.version, st.desired_version)
            if fact is not None and outcomes.get(device) != fact:
                out.append(DeviceOutcome(device, fact[1], fact[2], at_ms))
    return out


def _presence_events(
    state: RolloutState, facts: RolloutFacts, devices: Iterable[str] | None, now: int
) -> tuple[list[Event], int]:
    """The presence changes of ``devices`` (None: every target), and when the first of
    those online turns offline unless it speaks (an offline one stays so until it does)."""
    out: list[Event] = []
    quiet_ms = sys.maxsize
    for device in facts.targets if devices is None else devices:
        row = facts.targets.get(device)
        if row is None:
            continue
        seen_ms, heartbeat_ms, connected = row
        online = presence(seen_ms, heartbeat_ms, connected, now) == "online"
        if online:
            quiet_ms = min(quiet_ms, seen_ms + stale_after_ms(heartbeat_ms) + 1)
        known = state.presence.get(device)
        if known is None or known[1] != online:
            out.append(DevicePresence(device, online, seen_ms))
    return out, quiet_ms


def _kpi_events(state: RolloutState, facts: RolloutFacts) -> list[Event]:
    out: list[Event] = []
    for row in facts.kpis:
        device, version, inferences, labelled, correct, errors, _, _ = row
        if not 0 <= correct <= labelled or inferences < 0 or not 0 <= errors <= inferences:
            continue  # a device's own nonsense never stops the pass
        held = state.kpis.get((device, version))
        if held is None or _kpi_fact(held) != row:
            out.append(KpiWindow(*row))
    return out


def _running(facts: RolloutFacts, device: str) -> str:
    report = facts.reports.get(device)
    return "" if report is None else report[1].version


def _targets(facts: RolloutFacts, now: int, last: LastPass | None) -> Targets:
    """The group's devices and what each runs; the last pass's when neither changed."""
    if last is not None and facts.targets.keys() == last.targets.devices:
        previous = last.targets.previous
        if all(previous[d] == _running(facts, d) for d in facts.changed or ()):
            return Targets(last.targets.devices, previous, now)
    return Targets(frozenset(facts.targets), {d: _running(facts, d) for d in facts.targets}, now)


def _admitted(plan: RolloutPlan, state: RolloutState) -> dict[str, str] | None:
    if state.stage is Phase.COMPLETED and plan.ab is None:
        return None  # a finished rollout reaches every device its group selects
    return {d: a.version for d, a in state.admitted.items()}


def _moved(old: Mapping[str, str] | None, new: Mapping[str, str] | None) -> frozenset[str]:
    if old is None or new is None:
        return frozenset()  # reaching everyone: the whole group is recomputed
    return frozenset(d for d in old.keys() | new.keys() if old.get(d) != new.get(d))


def _messages(
    plan: RolloutPlan,
    old: RolloutState,
    new: RolloutState,
    joined: RolloutState,
    decisions: tuple[Decision, ...],
) -> list[str]:
    """What the pass did, in words, for the event log."""
    out: list[str] = []
    admits = [d for d in decisions if isinstance(d, Admit)]
    later_wave = new.waves_opened > old.waves_opened and old.waves_opened > 0
    # A rolling rollout opens a wave a pass once past its first: the gates it passed
    # are said when it leaves the first and at the end, not a few times a second.
    refill = plan.rolling is not None and old.waves_opened > 1
    if (later_wave and not refill) or any(isinstance(d, Completed) for d in decisions):
        passed = [r.reason for r in gate_results(plan, joined) if r.verdict is Verdict.PASS]
        out.append("gates passed: " + ("; ".join(passed) or "no gate"))
    if admits:
        moved = ", ".join(f"{len(a.devices)} -> {a.version}" for a in admits)
        if new.waves_opened > old.waves_opened:
            name = "canary" if new.stage is Phase.CANARY else f"wave {new.waves_opened}"
            out.append(f"{name} opened: {moved} (of {len(new.targets)} devices)")
        else:
            out.append(f"devices that joined the group admitted: {moved}")
    for decision in decisions:
        if isinstance(decision, Paused):
            out.append(f"rollout paused: {decision.reason}")
        elif isinstance(decision, Completed):
            out.append(f"rollout completed: {len(new.admitted)} devices moved")
        elif isinstance(decision, Aborted):
            reverted = sum(len(d.devices) for d in decisions if isinstance(d, Revert))
            back = f"; {reverted} devices return to their previous version" if reverted else ""
            out.append(f"rollout {new.stage.value.replace('_', ' ')}: {decision.reason}{back}")
    if old.paused_reason and not new.paused_reason and new.stage not in (Phase.ABORTED,):
        out.append("rollout resumed")
    return out


def update_for(
    rollout: RolloutRecord, plan: RolloutPlan, events: tuple[list[Event], list[Event]]
) -> RolloutUpdate | None:
    """Run the engine over one pass's events; what to store, or None when nothing changed."""
    old = RolloutState.from_json(rollout.state)
    facts, controls = events
    joined = run(plan, old, facts)[0]
    now = max((e.now_ms for e in controls if isinstance(e, Tick)), default=old.clock_ms)
    new, decisions = run(plan, joined, controls)
    steady = replace(new, clock_ms=old.clock_ms, targets_at_ms=old.targets_at_ms)
    # Equal states write the same text; comparing them first spares writing a
    # 10,000-device state out on every pass that changed nothing.
    if not decisions and (steady == old or steady.to_json() == rollout.state):
        return None
    dep = rollout.deployment
    head = f"deployment {dep.id} ({dep.skill} {dep.version} -> group {dep.group}): "
    judged = replace(joined, clock_ms=max(now, joined.clock_ms))
    messages = _messages(plan, old, new, judged, decisions)
    admitted = _admitted(plan, new)
    return RolloutUpdate(
        deployment_id=dep.id,
        expected_revision=rollout.revision,
        state=new.to_json(),
        phase=new.phase.value,
        admitted=admitted,
        touched=_moved(rollout.admitted, admitted),
        complete=any(isinstance(d, Completed) for d in decisions),
        withdraw=new.stage is Phase.ROLLED_BACK,
        messages=tuple(head + m for m in messages),
    )


class RolloutLoop:
    """Moves every staged rollout along, one pass per tick, on the leader only."""

    def __init__(
        self,
        store: Store,
        *,
        clock: Callable[[], int] = now_ms,
        tick_s: float = ROLLOUT_TICK_S,
        rolling_tick_s: float = ROLLING_TICK_S,
        on_write: Callable[[], None] | None = None,
    ) -> None:
        """Drive the rollouts of ``store``; ``clock`` gives ms.

        ``tick_s`` is the pause between passes, ``rolling_tick_s`` the pause
        after a pass that found a rolling rollout under way. ``on_write`` is
        called (in the pass's thread) after a pass that stored anything: the
        hub nudges its desired-state notifier with it.
        """
        if not 0 < rolling_tick_s <= tick_s:
            raise ValueError(f"rolling_tick_s {rolling_tick_s} must be in (0, {tick_s}]")
        self._store = store
        self._clock = clock
        self._tick_s = tick_s
        self._rolling_tick_s = rolling_tick_s
        self._on_write = on_write
        #: Whether the last pass drove a rolling rollout still under way.
        self.rolling = False
        self._rolling_seen = False  # the same, for the pass being run
        self._places = 0  # the places of the rolling rollouts the pass being run drove
        #: Each driven rollout's KPI totals, read on pass after pass (a new leader sums once).
        self._tallies: dict[int, KpiTally] = {}
        #: Each driven rollout's last pass, if it ended well: the next one diffs against it.
        self._last: dict[int, LastPass] = {}
        #: Each driven rollout as its last pass left it stored: its state is not read again.
        self._held: dict[int, RolloutRecord] = {}
        #: Devices heard settling (:meth:`heard`) since the last pass began reading.
        self._heard: set[str] = set()
        #: How many of them make the next pass worth running before its pause ends: half
        #: the places of the rolling rollouts under way (0: none under way, wait the pause).
        self._wake_at = 0
        self._wake: asyncio.Event | None = None

    def factory(self) -> LoopFactory:
        """The loop for :class:`cloud.loops.LoopHost` (register it leader-only)."""

        async def run() -> None:
            self._wake = wake = asyncio.Event()
            try:
                while True:
                    wake.clear()
                    self._heard.clear()  # the pass reads what was stored before it starts
                    await asyncio.to_thread(self.pass_once)
                    if self._wake_at and len(self._heard) >= self._wake_at:
                        continue  # freed places are waiting already
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(wake.wait(), self.pause_s)
            finally:
                self._wake = None

        return run

    def heard(self, device_id: str) -> None:
        """Count a device whose report says it settled (running what it was sent, or failed).

        The hub calls it, on its event loop, as it stores them. While a rolling rollout
        is under way, the next pass then starts as soon as half its places may be
        free, not at the end of the pause: a pass reads the reports stored before it,
        so one that came at the end of a fixed pause found most of the last wave still
        installing and the one after it found them all, which held every place about
        two passes (10,000 devices over MQTT). Reports stored by other hub processes
        wake nothing here; the pause still bounds the wait. Each device counts once a
        pass: one that sends report after report (its own, each stored) frees one
        place at most, and cannot run the passes back to back.
        """
        self._heard.add(device_id)
        if self._wake is not None and self._wake_at and len(self._heard) >= self._wake_at:
            self._wake.set()

    @property
    def wake_at(self) -> int:
        """Settled devices after which the next pass starts before its pause ends (0: never)."""
        return self._wake_at

    @property
    def pause_s(self) -> float:
        """The pause before the next pass: shorter while a rolling rollout is under way."""
        return self._rolling_tick_s if self.rolling else self._tick_s

    def pass_once(self) -> int:
        """Move every driven rollout one pass; how many were stored.

        A rollout whose stored plan or state is corrupt, or whose group is gone,
        is logged and skipped; the others carry on.

        Raises:
            StoreError: The database failed.
        """
        stored = 0
        driven = self._store.driven_rollouts(self._held)
        ids = {r.deployment.id for r in driven}
        for kept in (self._tallies, self._last, self._held):
            for gone in kept.keys() - ids:
                del kept[gone]
        self._rolling_seen = False
        self._places = 0
        for rollout in driven:
            try:
                stored += self.advance(rollout)
            except ValidationError as exc:
                log.error("deployment %d: rollout skipped: %s", rollout.deployment.id, exc)
        self.rolling = self._rolling_seen
        self._wake_at = (self._places + 1) // 2
        if stored and self._on_write is not None:
            self._on_write()
        return stored

    def advance(self, rollout: RolloutRecord) -> bool:
        """Run one pass of one rollout and store it; whether anything was stored.

        The pass reads and joins only what changed since the last one of this
        rollout, when that one ended well and its state is the stored one (and
        reads no target's row while the fleet stamp stands); a pass that fails
        leaves the next one to read and join everything.

        Raises:
            ValidationError: The stored plan or state is corrupt.
            StoreError: The database failed.
        """
        dep_id = rollout.deployment.id
        last = self._last.pop(dep_id, None)
        self._held.pop(dep_id, None)
        plan = plan_of(rollout)
        if plan.rolling is not None and rollout.phase != Phase.COMPLETED:
            self._rolling_seen = True
            self._places += plan.rolling.max_in_flight
        now = self._clock()
        # Heartbeats of devices online anyway change no presence before the first
        # device the last read saw online could go quiet: until then its rows stand.
        moot = last is not None and last.now_ms <= now < last.quiet_ms
        # The stamp's word is taken for a while only: a writer that does not bump it
        # (a hub process of an older version, during a rolling upgrade) is read late,
        # never missed.
        reread = last is not None and not 0 <= now - last.rows_read_ms < REREAD_MS
        # An A/B test exists to set its versions' KPIs side by side: read every pass.
        judged = plan.ab is not None or plan.judges_kpis
        kpis_due = judged or last is None or not 0 <= now - last.kpis_read_ms < KPI_STATUS_MS
        try:
            tally = self._tallies.setdefault(dep_id, KpiTally())
            facts = self._store.rollout_facts(
                rollout,
                tally,
                None if last is None else last.facts,
                refreshes_moot=moot,
                reread=reread,
                kpis_due=kpis_due,
            )
        except NotFoundError as exc:
            raise ValidationError(f"cannot read its fleet: {exc}") from None
        state = RolloutState.from_json(rollout.state)
        held = last if last is not None and last.revision == rollout.revision else None
        events = _events(state, facts, rollout.commands, now, held)
        change = update_for(rollout, plan, (events.facts, events.controls))
        written = change is not None and self._store.save_rollout(change, now_ms=now)
        if change is None:
            self._held[dep_id] = rollout
        elif written:
            self._held[dep_id] = replace(
                rollout,
                state=change.state,
                phase=change.phase,
                admitted=change.admitted,
                updated_ms=now,
                revision=change.expected_revision + 1,
            )
        left = self._held[dep_id].revision if dep_id in self._held else None
        read_ms = last.rows_read_ms if last is not None and not facts.whole else now
        kpis_ms = now
        if last is not None and not kpis_due and facts.kpis is last.facts.kpis:
            kpis_ms = last.kpis_read_ms  # kept unread
        self._last[dep_id] = LastPass(
            left,
            facts,
            now,
            events.quiet_ms,
            events.targets,
            rows_read_ms=read_ms,
            kpis_read_ms=kpis_ms,
        )
        for message in change.messages if change is not None and written else ():
            log.info("%s", message)
        return written
