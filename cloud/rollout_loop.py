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
engine, so reading them again is harmless.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from operator import attrgetter

from cloud.errors import NotFoundError, ValidationError
from cloud.loops import LoopFactory, periodic
from cloud.presence import presence
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

__all__ = ["ROLLOUT_TICK_S", "RolloutLoop", "engine_events", "plan_of", "update_for"]

log = logging.getLogger(__name__)

#: How often the leader moves rollouts along.
ROLLOUT_TICK_S = 1.0


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


def engine_events(
    state: RolloutState, facts: RolloutFacts, commands: tuple[tuple[str, int], ...], now: int
) -> tuple[list[Event], list[Event]]:
    """The engine events for one pass: device facts, then controls ending with a tick.

    Outcome, presence and KPI facts the state already holds are left out, so an
    unchanged fleet gives an unchanged state, and a pass joins only what changed
    (joining every target's outcome again was a tenth of a 3,000-device hub's CPU
    during a rollout in waves).
    """
    facts_out: list[Event] = []
    outcomes = state.outcomes
    for device, (at_ms, st) in facts.reports.items():
        if device in facts.targets:
            fact = _outcome(at_ms, st.state, st.version, st.desired_version)
            if fact is not None and outcomes.get(device) != fact:
                facts_out.append(DeviceOutcome(device, fact[1], fact[2], at_ms))
    for device, (seen_ms, heartbeat_ms, connected) in facts.targets.items():
        online = presence(seen_ms, heartbeat_ms, connected, now) == "online"
        known = state.presence.get(device)
        if known is None or known[1] != online:
            facts_out.append(DevicePresence(device, online, seen_ms))
    for row in facts.kpis:
        device, version, inferences, labelled, correct, errors, _, _ = row
        if not 0 <= correct <= labelled or inferences < 0 or not 0 <= errors <= inferences:
            continue  # a device's own nonsense never stops the pass
        held = state.kpis.get((device, version))
        if held is None or _kpi_fact(held) != row:
            facts_out.append(KpiWindow(*row))
    controls: list[Event] = [Command(kind, at) for kind, at in commands]
    if facts.fleet_stop[1] >= 0:
        controls.append(FleetStop(facts.fleet_stop[0], facts.fleet_stop[1]))
    running = {d: st.version for d, (_, st) in facts.reports.items() if d in facts.targets}
    previous = {d: running.get(d, "") for d in facts.targets}
    controls += [Targets(frozenset(facts.targets), previous, now), Tick(now)]
    return facts_out, controls


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
    if later_wave or any(isinstance(d, Completed) for d in decisions):
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
        expected_state=rollout.state,
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
        self, store: Store, *, clock: Callable[[], int] = now_ms, tick_s: float = ROLLOUT_TICK_S
    ) -> None:
        """Drive the rollouts of ``store``; ``clock`` gives ms, ``tick_s`` the pass interval."""
        self._store = store
        self._clock = clock
        self._tick_s = tick_s
        #: Each driven rollout's KPI totals, read on pass after pass (a new leader sums once).
        self._tallies: dict[int, KpiTally] = {}

    def factory(self) -> LoopFactory:
        """The loop for :class:`cloud.loops.LoopHost` (register it leader-only)."""
        return periodic(self._pass, self._tick_s, first_now=True)

    async def _pass(self) -> None:
        await asyncio.to_thread(self.pass_once)

    def pass_once(self) -> int:
        """Move every driven rollout one pass; how many were stored.

        A rollout whose stored plan or state is corrupt, or whose group is gone,
        is logged and skipped; the others carry on.

        Raises:
            StoreError: The database failed.
        """
        stored = 0
        driven = self._store.driven_rollouts()
        for gone in self._tallies.keys() - {r.deployment.id for r in driven}:
            del self._tallies[gone]
        for rollout in driven:
            try:
                stored += self.advance(rollout)
            except ValidationError as exc:
                log.error("deployment %d: rollout skipped: %s", rollout.deployment.id, exc)
        return stored

    def advance(self, rollout: RolloutRecord) -> bool:
        """Run one pass of one rollout and store it; whether anything was stored.

        Raises:
            ValidationError: The stored plan or state is corrupt.
            StoreError: The database failed.
        """
        plan = plan_of(rollout)
        try:
            tally = self._tallies.setdefault(rollout.deployment.id, KpiTally())
            facts = self._store.rollout_facts(rollout, tally)
        except NotFoundError as exc:
            raise ValidationError(f"cannot read its fleet: {exc}") from None
        now = self._clock()
        state = RolloutState.from_json(rollout.state)
        change = update_for(rollout, plan, engine_events(state, facts, rollout.commands, now))
        if change is None:
            return False
        written = self._store.save_rollout(change, now_ms=now)
        for message in change.messages if written else ():
            log.info("%s", message)
        return written
