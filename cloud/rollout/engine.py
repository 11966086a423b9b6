"""The staged-rollout engine: a pure state machine, events and time in, decisions out.

:func:`step` folds one event into a :class:`RolloutState` and returns the
decisions it leads to: :class:`Admit` devices to a version, :class:`Revert`
them to their previous one, or report :class:`Completed`, :class:`Aborted` or
:class:`Paused`. Nothing here reads a clock or does I/O; time comes in with
the events, and the state is a frozen JSON-serialisable value, so a hub that
restarts, or another one, carries on from the stored state.

Device facts decide nothing by themselves; a :class:`Tick`, :class:`Command`,
:class:`FleetStop` or :class:`Targets` evaluates the rollout at ``max(state
clock, event time)`` and runs it to a fixed point, so evaluating twice at one
instant equals once, and facts that arrive duplicated, late or reordered
between two evaluations give the same result.

A ``rolling`` plan's first wave is its canary; after it has reported and
soaked, every evaluation fills the places its reports freed, up to
``max_in_flight``, while every gate passes: each such fill is a wave.

Invariants: no more devices in flight than the open wave allows; a wave opens
only while every gate passes, inside a maintenance window, neither paused nor
fleet-stopped; a failing gate reverts every admitted device to the version it
ran when admitted; no device is admitted twice.
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import statistics
from collections.abc import Iterable
from dataclasses import replace
from types import MappingProxyType

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
from cloud.rollout.gates import (
    GateResult,
    KpiTotals,
    Observations,
    Verdict,
    evaluate_gate,
)
from cloud.rollout.plan import PlanStrategy, RolloutPlan
from cloud.rollout.state import (
    ENDED,
    Admission,
    FactDraft,
    Phase,
    RolloutState,
    apply_control,
    empty,
)

__all__ = [
    "Aborted",
    "Admission",
    "Admit",
    "Command",
    "Completed",
    "Decision",
    "DeviceOutcome",
    "DevicePresence",
    "Event",
    "FleetStop",
    "KpiWindow",
    "Paused",
    "Phase",
    "Revert",
    "RolloutState",
    "Targets",
    "Tick",
    "gate_results",
    "in_flight",
    "observations",
    "run",
    "step",
]

_BAD = frozenset({"failed", "rolled_back"})

# --- reading the fleet -----------------------------------------------------------------------


@functools.lru_cache(maxsize=1 << 17)
def _order(key: str) -> bytes:
    """A stable, well-spread order of devices (canaries are not the alphabetically first).

    Kept: a rolling rollout orders the devices it has not moved yet every pass.
    """
    return hashlib.blake2b(key.encode(), digest_size=8).digest()


def _version_for(plan: RolloutPlan, state: RolloutState, device: str) -> str:
    if plan.ab is None:
        return state.version
    bucket = int.from_bytes(_order("ab:" + device), "big") % 100
    return state.version if bucket < plan.ab.weight else plan.ab.control


def _totals(windows: list[KpiWindow]) -> KpiTotals:
    p95s = [w.p95_ms for w in windows if w.inferences]
    return KpiTotals(
        devices=len(windows),
        inferences=sum(w.inferences for w in windows),
        labelled=sum(w.labelled for w in windows),
        correct=sum(w.correct for w in windows),
        errors=sum(w.errors for w in windows),
        p95_ms=statistics.median(p95s) if p95s else 0.0,
    )


def _kpis(plan: RolloutPlan, state: RolloutState) -> tuple[KpiTotals, KpiTotals]:
    """The new version's KPIs on admitted devices, and the baseline's on the same group."""
    cand: list[KpiWindow] = []
    base: list[KpiWindow] = []
    for (device, version), window in state.kpis.items():
        admission = state.admitted.get(device)
        if version == state.version:
            if admission is not None and admission.version == version:
                cand.append(window)
        elif (admission is not None or device in state.targets) and (
            plan.ab is None or version == plan.ab.control
        ):
            base.append(window)
    return _totals(cand), _totals(base)


def _scan(
    plan: RolloutPlan, state: RolloutState, now: int, *, kpis: bool = True
) -> tuple[Observations, frozenset[str]]:
    """Count what the gates read, and find the admitted devices still in flight.

    ``kpis=False`` leaves the KPI totals empty, for a plan none of whose gates reads
    them: summing every device's windows is most of a pass at 10,000 devices.
    """
    timeout_ms = plan.install_timeout_s * 1000
    flying: set[str] = set()
    finished = failed = ran = unhealthy = offline = 0
    # Bound once: this loop walks every admitted device, twice a pass at 10,000 devices.
    outcome_of, presence_of, ran_of = state.outcomes.get, state.presence.get, state.ran.get
    targets, bad = state.targets, _BAD
    for device, adm in state.admitted.items():
        fact = outcome_of(device)
        status = fact[2] if fact is not None and fact[1] == adm.version else None
        if status is None and adm.previous == adm.version:
            status = "running"  # it already ran this version
        if status is None and now - adm.at_ms < timeout_ms:
            if device in targets:
                flying.add(device)
        elif status is None or (status in bad and adm.version not in ran_of(device, ())):
            finished, failed = finished + 1, failed + 1  # failed, or timed out, before running
        else:
            finished, ran, unhealthy = finished + 1, ran + 1, unhealthy + (status in bad)
        seen = presence_of(device)
        if seen is not None and not seen[1] and seen[0] >= adm.at_ms:
            offline += 1
    cand, base = _kpis(plan, state) if kpis else (KpiTotals(), KpiTotals())
    obs = Observations(
        len(state.targets),
        len(state.admitted),
        finished,
        failed,
        ran,
        unhealthy,
        offline,
        cand,
        base,
    )
    return obs, frozenset(flying)


def _judge(plan: RolloutPlan, state: RolloutState, obs: Observations) -> tuple[GateResult, ...]:
    holding = state.hold_since_ms >= 0  # set when a wave's devices have all reported
    soaked_s = (state.clock_ms - state.hold_since_ms) / 1000 if holding else 0.0
    return tuple(
        evaluate_gate(g, obs, min_samples=plan.min_samples, soak_s=plan.soak_s, soaked_s=soaked_s)
        for g in plan.gates
    )


def observations(plan: RolloutPlan, state: RolloutState) -> Observations:
    """What the gates read now (for status views and tests)."""
    return _scan(plan, state, state.clock_ms)[0]


def in_flight(plan: RolloutPlan, state: RolloutState) -> frozenset[str]:
    """Targeted devices admitted that have neither reported nor timed out."""
    return _scan(plan, state, state.clock_ms)[1]


def gate_results(plan: RolloutPlan, state: RolloutState) -> tuple[GateResult, ...]:
    """Each gate's verdict at the state's clock, as the engine would judge it."""
    return _judge(plan, state, observations(plan, state))


# --- deciding --------------------------------------------------------------------------------


def _wave_size(plan: RolloutPlan, k: int, state: RolloutState, remaining: int) -> int:
    """Devices wave ``k`` may move: its plan size, but enough for the gates' samples."""
    if plan.canary is not None and k == 0:
        return plan.canary.size(len(state.targets), plan.device_samples)
    k -= plan.canary is not None
    if plan.rolling is not None:
        size = plan.rolling.max_in_flight
    else:
        size = plan.waves.size(k) if plan.waves is not None else remaining
    return max(size, plan.device_samples - len(state.admitted))


def _admit(
    plan: RolloutPlan, state: RolloutState, devices: Iterable[str], out: list[Decision]
) -> RolloutState:
    now = state.clock_ms
    moved = {
        d: Admission(_version_for(plan, state, d), state.previous.get(d, ""), now) for d in devices
    }
    for version in sorted({a.version for a in moved.values()}):
        out.append(Admit(frozenset(d for d, a in moved.items() if a.version == version), version))
    return replace(state, admitted=MappingProxyType({**state.admitted, **moved}))


def _open_wave(plan: RolloutPlan, state: RolloutState, out: list[Decision]) -> RolloutState:
    remaining = sorted(state.targets - state.admitted.keys(), key=_order)
    k = state.waves_opened
    size = _wave_size(plan, k, state, len(remaining))
    state = _admit(plan, state, remaining[:size], out)
    canary = plan.strategy is PlanStrategy.CANARY and k == 0
    return replace(
        state,
        stage=Phase.CANARY if canary else Phase.WAVE,
        waves_opened=k + 1,
        wave_limit=size,
        wave_opened_ms=state.clock_ms,
        hold_since_ms=-1,
    )


def _movable(plan: RolloutPlan, state: RolloutState) -> bool:
    """Whether devices may be moved now: neither held nor outside the maintenance windows."""
    return not state.paused_reason and plan.in_window(state.clock_ms)


def _complete(state: RolloutState, out: list[Decision]) -> RolloutState:
    out.append(Completed())
    return replace(state, stage=Phase.COMPLETED, reason="completed")


def _roll(
    plan: RolloutPlan,
    state: RolloutState,
    flying: frozenset[str],
    results: tuple[GateResult, ...],
    out: list[Decision],
) -> RolloutState:
    """A rolling rollout past its first wave: fill the places reports freed, or complete."""
    if any(r.verdict is not Verdict.PASS for r in results):
        return state
    remaining = state.targets - state.admitted.keys()
    if not remaining:
        return state if flying else _complete(state, out)
    limit = plan.rolling.max_in_flight if plan.rolling is not None else len(remaining)
    room = limit - len(flying)
    if room <= 0 or not _movable(plan, state):
        return state
    state = _admit(plan, state, heapq.nsmallest(room, remaining, key=_order), out)
    return replace(
        state,
        stage=Phase.WAVE,
        waves_opened=state.waves_opened + 1,
        wave_limit=limit,
        wave_opened_ms=state.clock_ms,
    )


def _revert(state: RolloutState, reason: str) -> tuple[RolloutState, list[Decision]]:
    previous = {d: a.previous for d, a in state.admitted.items()}
    out: list[Decision] = (
        [Revert(frozenset(previous), MappingProxyType(previous))] if previous else []
    )
    ended = replace(
        state,
        stage=Phase.ROLLED_BACK,
        admitted=empty(),
        reverted=MappingProxyType(previous),
        reason=reason,
    )
    return ended, [*out, Aborted(reason)]


def _hold(state: RolloutState, out: list[Decision]) -> RolloutState:
    """Note (and announce) a pause or the fleet stop switch."""
    reason = "fleet stop switch is on" if state.fleet_stop[1] else ""
    reason = reason or ("paused by operator" if state.hold[1] else "")
    if reason and reason != state.paused_reason and state.stage is not Phase.COMPLETED:
        out.append(Paused(reason))
    return replace(state, paused_reason=reason) if reason != state.paused_reason else state


def _advance(
    plan: RolloutPlan,
    state: RolloutState,
    flying: frozenset[str],
    results: tuple[GateResult, ...],
    out: list[Decision],
) -> RolloutState:
    """One move along the stages, or ``state`` itself when there is none to make."""
    movable = _movable(plan, state)
    if state.stage is Phase.PENDING:
        return _open_wave(plan, state, out) if movable and state.targets_at_ms >= 0 else state
    if flying:
        return state
    if state.stage is not Phase.SOAKING:
        return replace(state, stage=Phase.SOAKING, hold_since_ms=state.clock_ms)
    if any(r.verdict is not Verdict.PASS for r in results):
        return state
    if not state.targets - state.admitted.keys():
        return _complete(state, out)
    due = state.clock_ms - state.wave_opened_ms >= plan.wave_interval_s * 1000
    return _open_wave(plan, state, out) if movable and due else state


def _after_completion(plan: RolloutPlan, state: RolloutState, out: list[Decision]) -> RolloutState:
    """A finished rollout reaches devices that join its group later (inside the windows)."""
    newcomers = state.targets - state.admitted.keys()
    if not newcomers or not _movable(plan, state):
        return state
    state = _admit(plan, state, sorted(newcomers, key=_order), out)
    return replace(state, wave_limit=len(_scan(plan, state, state.clock_ms, kpis=False)[1]))


def _stop(
    state: RolloutState, results: tuple[GateResult, ...], out: list[Decision]
) -> RolloutState | None:
    """End the rollout on a failing gate (reverting it) or the operator's abort; else None."""
    failed = [r.reason for r in results if r.verdict is Verdict.FAIL]
    if failed:
        ended, decisions = _revert(state, f"gate failed: {failed[0]}")
        out.extend(decisions)
        return ended
    if state.abort_at_ms >= 0:
        out.append(Aborted("aborted by operator"))
        return replace(state, stage=Phase.ABORTED, reason="aborted by operator")
    return None


def _run_stages(plan: RolloutPlan, state: RolloutState, out: list[Decision]) -> RolloutState:
    """Move a running rollout along until nothing more changes at its clock."""
    for _ in range(2 * len(state.targets) + 8):  # each change admits a device or moves a stage
        obs, flying = _scan(plan, state, state.clock_ms, kpis=plan.judges_kpis)
        results = _judge(plan, state, obs)
        ended = _stop(state, results, out)
        if ended is not None:
            return ended
        rolling = plan.rolling is not None and state.hold_since_ms >= 0  # past its first wave
        moved = (_roll if rolling else _advance)(plan, state, flying, results, out)
        if moved is state or moved.stage is Phase.COMPLETED:
            return moved
        state = moved
    return state


def _evaluate(plan: RolloutPlan, state: RolloutState) -> tuple[RolloutState, list[Decision]]:
    """Run the rollout at its clock: commands first, then gates, then the next stage."""
    if state.stage in ENDED:
        return state, []
    if state.rollback_at_ms >= 0:
        return _revert(state, "rolled back by operator")
    out: list[Decision] = []
    state = _hold(state, out)
    if state.stage is Phase.COMPLETED:
        return _after_completion(plan, state, out), out
    return _run_stages(plan, state, out), out


def run(
    plan: RolloutPlan, state: RolloutState, events: Iterable[Event]
) -> tuple[RolloutState, tuple[Decision, ...]]:
    """Fold many events in order; the same result as :func:`step` one by one, but faster.

    Args:
        plan: The rollout's plan.
        state: Where the rollout is.
        events: Events in the order they arrived.

    Returns:
        The new state and every decision taken, in order.
    """
    draft = FactDraft(state)
    out: list[Decision] = []
    settled: RolloutState | None = None  # a state the last evaluation left as it found it
    for event in events:
        if isinstance(event, DeviceOutcome | DevicePresence | KpiWindow):
            draft.join(event)
            continue
        ready = apply_control(draft.freeze(), event)
        if ready is settled:
            continue  # evaluating is pure: the same state again decides nothing again
        state, decisions = _evaluate(plan, ready)
        out.extend(decisions)
        settled = state if state is ready and not decisions else None
        draft = FactDraft(state)
    return draft.freeze(), tuple(out)


def step(
    plan: RolloutPlan, state: RolloutState, event: Event
) -> tuple[RolloutState, tuple[Decision, ...]]:
    """Fold one event into the rollout.

    Args:
        plan: The rollout's plan.
        state: Where the rollout is.
        event: A device fact, a tick of time, or an operator's or the group's change.

    Returns:
        The new state and the decisions to carry out, in order.
    """
    return run(plan, state, (event,))
