"""A stamp that moves with every write to what the leader's rollout passes read of the fleet.

A rollout pass reads each target's presence and report in one join, a tenth of
a second at 10,000 devices, every second. The writers of those rows (devices,
their labels, groups, reports) bump a counter in the same transaction, as its
last statement, and a pass reads the counters first: while they stand still it
reuses its last read (:func:`moved`).

There are three counters. ``changes`` moves with every such write but two
kinds. ``refreshes`` moves with heartbeats that only move on the last-seen
time of devices that were online anyway (:func:`only_refreshes`). Those change
no presence a pass derives before the first device its last read saw online
could go quiet, so a pass before then may reuse its read across them; in a
fleet that heartbeats, nearly every presence batch is of that kind.
``reports`` moves with reports, which change only ``reported_states`` rows and
stamp each with the hub's time (``stored_ms``): when nothing but reports
moved, a pass reads the rows stored since shortly before its last read
(:data:`REPORT_MARGIN_MS`) and keeps the rest of its last read
(:func:`moved`); during a rollout, reports are most of what moves.

The counters are striped over :data:`SLOTS` rows and each transaction bumps a
random one: on PostgreSQL a bumped row stays locked until its transaction
commits, and a single row would queue the device writes of every hub process
behind each other's commits. A bump is last in its transaction, so a
transaction holding a slot waits on nothing but its own commit (no deadlock).
Every bump commits with what it counts and counters only grow, so a sum read
in one statement that did not move means no counted write committed since.
"""

from __future__ import annotations

import enum
import secrets
from collections.abc import Iterable, Mapping

from sqlalchemy import Connection, func, select, update

from cloud.presence import presence
from cloud.store.base import IDS_PER_QUERY
from cloud.store.schema import devices, fleet_stamp

__all__ = [
    "REFRESH_MARGIN_MS",
    "REPORT_MARGIN_MS",
    "SLOTS",
    "Moved",
    "Stamp",
    "bump",
    "lock_presence",
    "moved",
    "only_refreshes",
    "read_stamp",
]

#: Rows the counters are striped over; migration 0010 creates them.
SLOTS = 16
#: How much sooner than by its own clock a writer takes a device to go quiet, before it
#: counts a heartbeat as a refresh: room for the clocks of hub hosts to disagree.
REFRESH_MARGIN_MS = 1000
#: How much earlier than a pass's last read a report may have taken its ``stored_ms`` and
#: still have committed after that read, by database: the time a writer takes it inside
#: its transaction to its commit, plus room for the clocks of hub hosts to disagree. A
#: PostgreSQL writer may wait on others' row locks after taking it. A report that took
#: longer is read by the next full read (the leader reads in full every so often).
REPORT_MARGIN_MS = {"sqlite": 2000, "postgresql": 10_000 + REFRESH_MARGIN_MS}
#: The counters' sums, ``(changes, refreshes, reports)``.
Stamp = tuple[int, int, int]


class Moved(enum.Enum):
    """What may have changed in what a pass reads since a stamp."""

    NOTHING = "nothing"
    REPORTS = "reports"  #: only reports: those stored lately are read
    ROWS = "rows"  #: anything: every row is read


def bump(conn: Connection, *, refresh: bool = False, report: bool = False) -> None:
    """Count one write of ``conn``'s transaction; call it as the transaction's last statement.

    ``refresh``: the write only refreshed devices online anyway (see :func:`only_refreshes`).
    ``report``: it only wrote reports, each with its ``stored_ms``.
    """
    s = fleet_stamp.c
    column = s.refreshes if refresh else s.reports if report else s.changes
    slot = secrets.randbelow(SLOTS)
    conn.execute(update(fleet_stamp).where(fleet_stamp.c.slot == slot).values({column: column + 1}))


def read_stamp(conn: Connection) -> Stamp | None:
    """The counters now, or None when slots are missing (a bump may then have counted nothing)."""
    s = fleet_stamp.c
    sums = (func.sum(s.changes), func.sum(s.refreshes), func.sum(s.reports))
    row = conn.execute(select(func.count(), *sums).select_from(fleet_stamp)).one()
    if row[0] != SLOTS:
        return None
    return int(row[1]), int(row[2]), int(row[3])


def moved(last: Stamp | None, now: Stamp | None, *, refreshes_moot: bool) -> Moved:
    """What may have changed since a read made at ``last``, by the stamp ``now``.

    ``refreshes_moot``: refreshes cannot have changed what the reader derives (it
    is earlier than the first device the read saw online could go quiet).
    """
    if last is None or now is None or last[0] != now[0]:
        return Moved.ROWS
    if not refreshes_moot and last[1] != now[1]:
        return Moved.ROWS
    return Moved.NOTHING if last[2] == now[2] else Moved.REPORTS


def lock_presence(conn: Connection, device_ids: Iterable[str]) -> dict[str, tuple[int, int, bool]]:
    """Lock the rows of ``device_ids``, in id order, before they are written.

    Locked in one order, as reports lock them, writers of the same devices queue
    instead of deadlocking, and no other writer changes a row between a judgment
    of it (:func:`only_refreshes`) and the write.

    Returns:
        Each known device's ``(last_seen_ms, heartbeat_ms, connected)``.
    """
    d = devices.c
    ids = sorted(device_ids)
    rows: dict[str, tuple[int, int, bool]] = {}
    for start in range(0, len(ids), IDS_PER_QUERY):
        query = (
            select(d.device_id, d.last_seen_ms, d.heartbeat_ms, d.online)
            .where(d.device_id.in_(ids[start : start + IDS_PER_QUERY]))
            .order_by(d.device_id)
            .with_for_update()
        )
        for device_id, seen_ms, heartbeat_ms, online in conn.execute(query):
            rows[device_id] = (int(seen_ms), int(heartbeat_ms), bool(online))
    return rows


def only_refreshes(
    news: Mapping[str, tuple[int | None, bool]],
    rows: Mapping[str, tuple[int, int, bool]],
    now_ms: int,
) -> bool:
    """Whether writing ``news`` over the stored ``rows`` only refreshes devices online anyway.

    ``news`` is :meth:`cloud.store.Store.record_presence`'s; ids not in ``rows`` are
    not written. Each known device's news must be a heartbeat (heard, connected)
    no older than its stored last-seen time, of a device connected and online by
    its row until :data:`REFRESH_MARGIN_MS` after ``now_ms``: online then, it was
    online to any pass that read its row before, and the write keeps it online at
    least as long.
    """
    for device_id, (seen_ms, heartbeat_ms, connected) in rows.items():
        heard_ms, online = news[device_id]
        if heard_ms is None or not online or heard_ms < seen_ms:
            return False
        if presence(seen_ms, heartbeat_ms, connected, now_ms + REFRESH_MARGIN_MS) != "online":
            return False
    return True
