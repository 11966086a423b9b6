"""Staged rollouts in the store: each one's plan and engine state, and the fleet stop switch.

A staged deployment (see :func:`staged`) has a row in ``rollouts`` beside its
``deployments`` row: the plan as canonical JSON, the engine's state
(:meth:`cloud.rollout.state.RolloutState.to_json`), its phase, the devices it
reaches now (``admitted``, which the desired-state rule reads), and the
operator's commands. The leader's rollout loop reads a rollout and its facts
with :meth:`RolloutTables.rollout_facts`, runs the pure engine, and writes the
result back with :meth:`RolloutTables.save_rollout`: the new state, the
desired state of the devices it moved and the events, in one transaction,
and only if nobody wrote the rollout in between (its ``revision`` moves with
every pass stored). A 10,000-device rollout's state is megabytes of text: the
leader hands :meth:`RolloutTables.driven_rollouts` the revisions it holds and
reads a state again only when another process stored over it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Row, and_, select, update

from cloud.errors import NotFoundError, StoreError, ValidationError
from cloud.rollout.events import COMMANDS
from cloud.rollout.plan import PlanStrategy, RolloutPlan
from cloud.rollout.state import RolloutState
from cloud.selectors import parse_selector
from cloud.store import checks as check
from cloud.store.base import StoreBase
from cloud.store.desired import recompute, selector_clause
from cloud.store.events import EVENT_DEPLOYMENT, NewEvent, insert_events
from cloud.store.fleet_stamp import read_stamp
from cloud.store.records import (
    DEPLOYMENT_ABORTED,
    DEPLOYMENT_ACTIVE,
    DEPLOYMENT_SUPERSEDED,
    DeploymentRecord,
)
from cloud.store.rollout_facts import FLEET_ROW, KpiTally, RolloutFacts, read_facts
from cloud.store.schema import (
    deployments,
    device_groups,
    devices,
    fleet_controls,
    rollouts,
)

__all__ = [
    "RolloutFacts",
    "RolloutRecord",
    "RolloutTables",
    "RolloutUpdate",
    "deployment_record",
    "group_clause",
    "insert_rollout",
    "staged",
    "supersede_older",
]

_ENDED = ("aborted", "rolled_back")


def staged(plan: RolloutPlan) -> bool:
    """Whether a plan needs the rollout engine (anything but all at once with no window)."""
    return plan.strategy is not PlanStrategy.ALL_AT_ONCE or bool(plan.windows)


def deployment_record(row: Row[Any]) -> DeploymentRecord:
    """Turn a ``deployments`` row into a record."""
    return DeploymentRecord(
        row.id, row.skill, row.version, row.group_name, row.strategy, json.loads(row.config),
        row.state, row.created_ms, row.project,
    )  # fmt: skip


def group_clause(conn: Connection, group: str, project: str | None = None) -> Any:
    """A WHERE clause on ``devices`` keeping the devices group ``group`` selects now.

    A group selects only devices of its own project.

    Args:
        conn: A connection in a transaction.
        group: The group's name.
        project: The project the group must be in (None: any).

    Raises:
        NotFoundError: No such group (in ``project``).
        StoreError: Its stored selector is corrupt.
    """
    query = select(device_groups.c.selector, device_groups.c.project).where(
        device_groups.c.name == group
    )
    if project is not None:
        query = query.where(device_groups.c.project == project)
    row = conn.execute(query).first()
    if row is None:
        raise NotFoundError(f"no group {group!r}")
    try:
        selected = selector_clause(parse_selector(row.selector))
    except ValidationError as exc:
        raise StoreError(f"group {group!r} has a corrupt selector: {exc}") from exc
    return and_(selected, devices.c.project == row.project)


def supersede_older(conn: Connection, skill: str, group: str, newer: int) -> list[int]:
    """Mark the active deployments of ``skill`` on ``group`` older than ``newer`` superseded."""
    t = deployments.c
    stmt = (
        update(deployments)
        .where(t.skill == skill, t.group_name == group, t.state == DEPLOYMENT_ACTIVE, t.id < newer)
        .values(state=DEPLOYMENT_SUPERSEDED)
        .returning(t.id)
    )
    return sorted(int(i) for i in conn.execute(stmt).scalars())


def _canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def insert_rollout(
    conn: Connection, deployment_id: int, plan: RolloutPlan, version: str, now_ms: int
) -> None:
    """Add the rollout of a new staged deployment (inside the caller's transaction)."""
    state = RolloutState(version)
    conn.execute(
        rollouts.insert().values(
            deployment_id=deployment_id,
            plan=_canonical(plan.to_dict()),
            state=state.to_json(),
            phase=state.phase.value,
            admitted="{}",
            commands="[]",
            updated_ms=now_ms,
        )
    )


@dataclass(frozen=True)
class RolloutRecord:
    """A staged deployment's rollout as stored.

    ``admitted`` is None once the deployment reaches every device its group
    selects; ``commands`` are the operator's ``(kind, at_ms)``; ``revision``
    moves with each pass stored.
    """

    deployment: DeploymentRecord
    priority: int
    plan: str
    state: str
    phase: str
    admitted: Mapping[str, str] | None
    commands: tuple[tuple[str, int], ...]
    updated_ms: int
    revision: int = 0


@dataclass(frozen=True)
class RolloutUpdate:
    """The outcome of one engine pass, to store at once.

    ``expected_revision``: the revision the pass read; nothing is stored over
    another. ``touched``: devices whose desired state may change. ``complete``: the
    rollout finished (older deployments of the skill on the group are
    superseded). ``withdraw``: it was rolled back (the deployment is no longer
    wanted). ``messages``: events to log.
    """

    deployment_id: int
    expected_revision: int
    state: str
    phase: str
    admitted: Mapping[str, str] | None
    touched: frozenset[str] = frozenset()
    complete: bool = False
    withdraw: bool = False
    messages: tuple[str, ...] = ()


def _record(
    row: Row[Any], held: tuple[str, Mapping[str, str] | None] | None = None
) -> RolloutRecord:
    """A rollout's record from its row; ``held``: its state and admitted map, when the
    row was read without them."""
    state, admitted = (row.rollout_state, _admitted(row.id, row.admitted)) if held is None else held
    try:
        commands = tuple((str(k), int(at)) for k, at in json.loads(row.commands))
    except (ValueError, TypeError) as exc:
        raise StoreError(f"rollout of deployment {row.id} is corrupt: {exc}") from exc
    return RolloutRecord(
        deployment_record(row), int(row.priority), row.plan, state, row.phase, admitted,
        commands, int(row.updated_ms), int(row.revision),
    )  # fmt: skip


def _admitted(deployment_id: int, text: str | None) -> dict[str, str] | None:
    try:
        return None if text is None else dict(json.loads(text))
    except (ValueError, TypeError) as exc:
        raise StoreError(f"rollout of deployment {deployment_id} is corrupt: {exc}") from exc


def _compact(commands: Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
    """The commands that still matter: the newest pause or resume, the first abort and rollback."""
    holds = [c for c in commands if c[0] in ("pause", "resume")]
    kept = [max(holds, key=lambda c: (c[1], c[0] == "pause"))] if holds else []
    for kind in ("abort", "rollback"):
        firsts = [c for c in commands if c[0] == kind]
        kept += [min(firsts)] if firsts else []
    return sorted(kept, key=lambda c: c[1])


def _joined(*, texts: bool = True) -> Any:
    """The deployments with their rollouts; without ``texts``, no state or admitted map."""
    r = rollouts.c
    big = (r.state.label("rollout_state"), r.admitted) if texts else ()
    return select(deployments, r.plan, r.phase, r.commands, r.updated_ms, r.revision, *big).join(
        rollouts, r.deployment_id == deployments.c.id
    )


class RolloutTables(StoreBase):
    """Transactional access to rollouts and the fleet stop switch."""

    def rollouts_of(self, deployment_ids: Sequence[int] | None = None) -> dict[int, RolloutRecord]:
        """The rollouts of these deployments (all with None) that have one, by deployment id.

        Raises:
            StoreError: The database failed or holds corrupt data.
        """
        query = _joined()
        if deployment_ids is not None:
            query = query.where(deployments.c.id.in_(sorted(set(deployment_ids))))
        with self._tx() as conn:
            return {int(row.id): _record(row) for row in conn.execute(query)}

    def deployment_priorities(self) -> dict[int, int]:
        """Every deployment's priority, by id.

        Raises:
            StoreError: The database failed.
        """
        with self._tx() as conn:
            query = select(deployments.c.id, deployments.c.priority)
            return {int(r.id): int(r.priority) for r in conn.execute(query)}

    def driven_rollouts(
        self, held: Mapping[int, RolloutRecord] | None = None
    ) -> list[RolloutRecord]:
        """The rollouts the engine still moves: active, not ended, and not reaching everyone.

        ``held``: records the caller holds, by deployment id; the state and admitted
        map of one whose revision is still the stored one are taken from it, not read.

        Raises:
            StoreError: The database failed or holds corrupt data.
        """
        r = rollouts.c
        query = _joined(texts=False).where(
            deployments.c.state == DEPLOYMENT_ACTIVE,
            r.admitted.is_not(None),
            r.phase.not_in(_ENDED),
        )
        held = held or {}
        with self._tx() as conn:
            rows = {int(row.id): row for row in conn.execute(query.order_by(deployments.c.id))}
            texts = {
                dep_id: (h.state, h.admitted)
                for dep_id, row in rows.items()
                if (h := held.get(dep_id)) is not None and h.revision == row.revision
            }
            unread = [dep_id for dep_id in rows if dep_id not in texts]
            if unread:
                read = select(r.deployment_id, r.state, r.admitted, r.revision)
                for t in conn.execute(read.where(r.deployment_id.in_(unread))):
                    dep_id = int(t.deployment_id)
                    if t.revision == rows[dep_id].revision:  # else stored over since: next pass
                        texts[dep_id] = (t.state, _admitted(dep_id, t.admitted))
        return [_record(row, texts[dep_id]) for dep_id, row in rows.items() if dep_id in texts]

    def rollout_facts(
        self,
        rollout: RolloutRecord,
        tally: KpiTally | None = None,
        last: RolloutFacts | None = None,
        *,
        refreshes_moot: bool = False,
        reread: bool = False,
        kpis_due: bool = True,
    ) -> RolloutFacts:
        """Read what the fleet shows ``rollout`` now, in one transaction.

        ``tally``: the caller's running KPI totals of this rollout, read on from its
        last read rather than summed again (the leader keeps one per rollout).
        ``last``: the caller's last read of this rollout (with the same tally): the
        devices whose rows did not change are taken from it, and the new facts say
        which changed; while the fleet stamp says no row could have changed, none
        is read (see :func:`cloud.store.rollout_facts.read_facts`).
        ``refreshes_moot``: heartbeats of devices online anyway change nothing the
        caller derives from ``last`` yet (see :mod:`cloud.store.fleet_stamp`).
        ``reread``: read the rows whatever the stamp says.
        ``kpis_due``: False keeps ``last``'s KPI totals unread (see ``read_facts``).

        Raises:
            NotFoundError: The deployment's group is gone.
            StoreError: The database failed or holds corrupt data.
        """
        with self._tx() as conn:
            # Read first: a write it does not count commits after it, so the next
            # pass finds it moved and reads the rows again.
            stamp = read_stamp(conn)
            where = group_clause(conn, rollout.deployment.group)
            return read_facts(
                conn,
                rollout.deployment,
                where,
                tally,
                last,
                stamp=stamp,
                refreshes_moot=refreshes_moot,
                reread=reread,
                kpis_due=kpis_due,
            )

    def save_rollout(self, change: RolloutUpdate, *, now_ms: int) -> bool:
        """Store one engine pass: the state, the desired state it changes and its events.

        Nothing is written when the stored state is no longer ``expected_state``
        (another hub process wrote it first) or the deployment is no longer active.

        Returns:
            True when written.

        Raises:
            StoreError: The database failed or holds corrupt data.
        """
        check.counter(now_ms, "now_ms")
        admitted = None if change.admitted is None else _canonical(dict(change.admitted))
        with self._tx(write=True, lock="exclusive") as conn:
            dep_row = conn.execute(
                select(deployments).where(deployments.c.id == change.deployment_id)
            ).first()
            if dep_row is None or dep_row.state != DEPLOYMENT_ACTIVE:
                return False
            dep = deployment_record(dep_row)
            written = conn.execute(
                update(rollouts)
                .where(
                    rollouts.c.deployment_id == change.deployment_id,
                    rollouts.c.revision == change.expected_revision,
                )
                .values(
                    state=change.state,
                    phase=change.phase,
                    admitted=admitted,
                    updated_ms=now_ms,
                    revision=change.expected_revision + 1,
                )
            ).rowcount
            if not written:
                return False
            news = [NewEvent(EVENT_DEPLOYMENT, m) for m in change.messages]
            if change.withdraw:
                conn.execute(
                    update(deployments)
                    .where(deployments.c.id == dep.id)
                    .values(state=DEPLOYMENT_ABORTED)
                )
            if change.complete:
                for old in supersede_older(conn, dep.skill, dep.group, dep.id):
                    news.append(
                        NewEvent(
                            EVENT_DEPLOYMENT,
                            f"deployment {old} superseded by deployment {dep.id} "
                            "(its rollout completed)",
                        )
                    )
            if change.complete or change.withdraw:
                recompute(conn, group_clause(conn, dep.group))
            elif change.touched:
                recompute(conn, devices.c.device_id.in_(sorted(change.touched)))
            if news:
                insert_events(conn, news, at_ms=now_ms)
        return True

    def add_rollout_command(self, deployment_id: int, kind: str, *, now_ms: int) -> RolloutRecord:
        """Hand the rollout an operator's command (``pause``, ``resume``, ``abort``, ``rollback``).

        The leader's rollout loop carries it out on its next pass.

        Raises:
            ValidationError: An unknown command, a deployment that is not staged,
                or a rollout that has ended.
            NotFoundError: No deployment with that id.
            StoreError: The database failed.
        """
        if kind not in COMMANDS:
            raise ValidationError(f"unknown rollout command {kind!r}; known: {', '.join(COMMANDS)}")
        check.counter(now_ms, "now_ms")
        with self._tx(write=True) as conn:
            row = conn.execute(_joined().where(deployments.c.id == deployment_id)).first()
            if row is None:
                known = select(deployments.c.id).where(deployments.c.id == deployment_id)
                if conn.execute(known).first() is None:
                    raise NotFoundError(f"no deployment {deployment_id}")
                raise ValidationError(
                    f"deployment {deployment_id} rolls out all at once; only a staged rollout"
                    f" takes {kind}"
                )
            found = _record(row)
            if found.phase in _ENDED or found.deployment.state != DEPLOYMENT_ACTIVE:
                raise ValidationError(
                    f"deployment {deployment_id} is {found.deployment.state} and its rollout "
                    f"{found.phase}; it takes no {kind}"
                )
            commands = _compact([*found.commands, (kind, now_ms)])
            conn.execute(
                update(rollouts)
                .where(rollouts.c.deployment_id == deployment_id)
                .values(commands=_canonical(commands))
            )
            text = f"deployment {deployment_id}: {kind} asked by operator"
            insert_events(conn, [NewEvent(EVENT_DEPLOYMENT, text)], at_ms=now_ms)
        return RolloutRecord(**{**found.__dict__, "commands": tuple(commands)})

    def set_fleet_stop(self, on: bool, *, now_ms: int) -> bool:
        """Turn the fleet-wide stop switch on or off; no rollout moves a device while it is on.

        Returns:
            Whether the switch changed.

        Raises:
            ValidationError: A malformed time.
            StoreError: The database failed.
        """
        check.counter(now_ms, "now_ms")
        values = {"stopped": bool(on), "changed_ms": now_ms}
        with self._tx(write=True) as conn:
            row = conn.execute(
                select(fleet_controls).where(fleet_controls.c.id == FLEET_ROW)
            ).first()
            if bool(row.stopped if row else False) == bool(on):
                return False
            if row is None:
                conn.execute(fleet_controls.insert().values(id=FLEET_ROW, **values))
            else:
                conn.execute(
                    update(fleet_controls).where(fleet_controls.c.id == FLEET_ROW).values(values)
                )
            text = (
                "fleet stop switch on: no rollout moves a device"
                if on
                else ("fleet stop switch off: rollouts carry on")
            )
            insert_events(conn, [NewEvent(EVENT_DEPLOYMENT, text)], at_ms=now_ms)
        return True

    def fleet_stopped(self) -> bool:
        """Whether the fleet-wide stop switch is on.

        Raises:
            StoreError: The database failed.
        """
        with self._tx() as conn:
            row = conn.execute(
                select(fleet_controls.c.stopped).where(fleet_controls.c.id == FLEET_ROW)
            ).first()
        return bool(row.stopped) if row else False
