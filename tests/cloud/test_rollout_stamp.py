"""The fleet stamp spares a quiet rollout pass its read of every target, on SQLite and PostgreSQL.

A pass reads the stamp first and reuses its last read of the targets' rows
while no write moved it, and reads only the reports stored lately while only
reports moved it. These tests count the statements the leader's store runs,
write as another hub process would (another store on the same database), and
hold each pass to what a full read sees.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
from sqlalchemy import delete, event, update

from cloud.rollout.events import DevicePresence
from cloud.rollout.plan import plan_from_dict
from cloud.rollout.state import RolloutState
from cloud.rollout_loop import REREAD_MS, RolloutLoop
from cloud.store import SkillStatusRecord, Store
from cloud.store.fleet_stamp import (
    REFRESH_MARGIN_MS,
    REPORT_MARGIN_MS,
    SLOTS,
    only_refreshes,
    read_stamp,
)
from cloud.store.rollouts import RolloutUpdate
from cloud.store.schema import fleet_stamp, reported_states
from cloud.store.store import open_store
from tests.cloud.test_rollout_passes import PATIENT, Passes
from tests.cloud.test_rollout_store import (
    CAMERA,
    DEVICES,
    Clock,
    admitted_devices,
    fleet_on_v1,
    report,
)

#: What the read of every target's presence and report looks like in SQL.
JOIN = "LEFT OUTER JOIN reported_states"
#: What the read of the targets' reports stored lately looks like: their ids by time first.
REPORTS_READ = "WHERE reported_states.stored_ms >="
#: What reading the rows of those ids adds to the join.
BY_ID = "devices.device_id IN ("


class Statements:
    """The SQL statements a store's engine ran since it was last cleared."""

    def __init__(self, store: Store) -> None:
        self.seen: list[str] = []
        event.listen(store.engine, "before_cursor_execute", self._heard)

    def _heard(self, *args: object) -> None:
        self.seen.append(str(args[2]))

    def joins(self) -> int:
        """How many of them read every target's row; clears the list."""
        return self.reads()[0]

    def reads(self) -> tuple[int, int]:
        """How many read every target's row, and how many the reports stored lately; clears."""
        full = sum(JOIN in s and BY_ID not in s for s in self.seen)
        count = full, sum(REPORTS_READ in s for s in self.seen)
        self.seen.clear()
        return count


@dataclass
class Leader:
    """A rollout of 2.0.0 under way, its leader's loop, and another hub process's store."""

    store: Store
    other: Store
    clock: Clock
    dep_id: int
    loop: RolloutLoop
    passes: Passes
    statements: Statements

    def step(self, ms: int = 1000) -> int:
        """Run a pass ``ms`` later; how many times it read every target's row."""
        return self.step_reads(ms)[0]

    def step_reads(self, ms: int = 1000) -> tuple[int, int]:
        """Run a pass ``ms`` later; how many times it read every target's row, and the
        reports stored lately."""
        self.clock.now += ms
        self.statements.reads()
        self.loop.pass_once()
        return self.statements.reads()

    def as_read_in_full(self) -> bool:
        """Whether the loop's last read holds what a full read finds now."""
        rollout = self.store.rollouts_of([self.dep_id])[self.dep_id]
        full = self.other.rollout_facts(rollout)
        held = self.loop._last[self.dep_id].facts
        return (held.targets, held.reports) == (full.targets, full.reports)


@pytest.fixture
def leader(store: Store, store_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Leader]:
    clock = Clock()
    fleet_on_v1(store, clock)
    dep = store.create_deployment(
        "face", "2.0.0", "cams", plan=plan_from_dict(PATIENT), now_ms=clock.now
    )
    passes = Passes(monkeypatch, store)
    other = open_store(store_url)
    try:
        running = Leader(
            store, other, clock, dep.id, RolloutLoop(store, clock=clock), passes, Statements(store)
        )
        assert running.step() == 1  # the first pass reads everything and opens the canary
        yield running
    finally:
        other.close()


def test_a_quiet_pass_reads_the_stamp_and_no_targets_row(leader: Leader) -> None:
    for _ in range(3):
        leader.clock.now += 1000
        leader.loop.pass_once()
        assert not any(JOIN in s for s in leader.statements.seen)
        assert any("fleet_stamp" in s for s in leader.statements.seen)
        leader.statements.seen.clear()
        assert leader.passes.last() == []
    assert leader.as_read_in_full()


#: Every kind of write to what a pass reads, as another hub process makes it.
WRITES: dict[str, Callable[[Store, Clock], object]] = {
    "report": lambda s, c: report(s, "cam-01", "1.0.0", "failed", "2.0.0", c.now),
    "reports in a batch": lambda s, c: s.save_reports_many(
        [("cam-02", 1, [SkillStatusRecord("face", "1.0.0", "running")], c.now + 1)]
    ),
    "connection news": lambda s, c: s.record_presence({"cam-03": (None, False)}),
    "connected flag": lambda s, c: s.set_device_connected("cam-05", connected=False),
    "touched": lambda s, c: s.touch_device("cam-06", now_ms=c.now + 5),
    "labels": lambda s, c: s.set_device_labels("cam-07", {"kind": "doorbell"}),
    "labels in a batch": lambda s, c: s.set_labels_many({"cam-08": {"kind": "doorbell"}}),
    "registered": lambda s, c: s.register_device("cam-98", CAMERA, {}, now_ms=c.now),
    "enrolled": lambda s, c: s.enroll_device("cam-99", CAMERA, now_ms=c.now),
}
#: The writes that only store reports: a pass reads the reports stored lately for them.
REPORT_WRITES = ("report", "reports in a batch")


@pytest.mark.parametrize("write", WRITES)
def test_each_write_by_another_hub_process_is_read_on_the_next_pass(
    leader: Leader, write: str
) -> None:
    assert leader.step() == 0
    rollout = leader.store.rollouts_of([leader.dep_id])[leader.dep_id]
    before = leader.other.rollout_facts(rollout)
    WRITES[write](leader.other, leader.clock)
    after = leader.other.rollout_facts(rollout)
    assert (after.targets, after.reports) != (before.targets, before.reports)
    assert leader.step_reads() == ((0, 1) if write in REPORT_WRITES else (1, 0))
    assert leader.as_read_in_full()
    assert leader.step_reads() == (0, 0)


def test_a_new_group_moves_the_stamp(leader: Leader) -> None:
    with leader.other.engine.connect() as conn:
        before = read_stamp(conn)
    leader.other.create_group("doors", "kind=doorbell")
    with leader.other.engine.connect() as conn:
        after = read_stamp(conn)
    assert before is not None and after is not None and after[0] > before[0]


def test_writers_in_several_processes_at_once_each_count_once(
    leader: Leader, store_url: str
) -> None:
    hubs = [open_store(store_url) for _ in range(4)]
    with leader.other.engine.connect() as conn:
        before = read_stamp(conn)

    def write(n: int) -> None:
        devices = DEVICES if n % 2 else DEVICES[::-1]  # the same devices, in other orders
        for i in range(25):
            hubs[n].record_presence(dict.fromkeys(devices[i % 3 :: 2], (None, i % 2 == 0)))
            mine = DEVICES[n * 5 + i % 5]  # its own: no report of another hub is newer
            hubs[n].save_reports_many([(mine, 10**6, [], leader.clock.now + i)])

    try:
        with ThreadPoolExecutor(len(hubs)) as pool:
            list(pool.map(write, range(len(hubs))))
    finally:
        for hub in hubs:
            hub.close()
    with leader.other.engine.connect() as conn:
        after = read_stamp(conn)
    assert before is not None and after is not None
    assert (after[0] - before[0], after[2] - before[2]) == (4 * 25, 4 * 25)


def test_devices_gone_quiet_are_seen_offline_on_a_pass_that_reads_no_row(leader: Leader) -> None:
    assert leader.step(8000) == 0  # 9 s after the last message: still online
    assert leader.passes.last() == []
    assert leader.step(2000) == 0  # 11 s: offline by time alone
    gone = {e.device_id for e in leader.passes.last() if isinstance(e, DevicePresence)}
    assert gone == set(DEVICES)


def test_heartbeats_of_online_devices_are_read_once_one_may_have_gone_quiet(
    leader: Leader,
) -> None:
    with leader.other.engine.connect() as conn:
        before = read_stamp(conn)
    heard = leader.clock.now + 4000
    leader.other.record_presence(dict.fromkeys(DEVICES, (heard, True)), now_ms=heard)
    with leader.other.engine.connect() as conn:
        after = read_stamp(conn)
    assert before is not None and after == (before[0], before[1] + 1, before[2])  # a refresh
    assert leader.step(5000) == 0  # heard 1 s ago; the last read's devices online till 10 s
    assert leader.step(5000) == 1  # 11 s after the last read's messages: read the heartbeats
    assert leader.passes.last() == []  # nobody went quiet
    assert leader.as_read_in_full()
    assert leader.step() == 0


def test_a_heartbeat_of_a_device_seen_offline_is_read_on_the_next_pass(leader: Leader) -> None:
    leader.other.set_device_connected("cam-04", connected=False)
    assert leader.step() == 1
    assert leader.passes.last() == [DevicePresence("cam-04", False, 1_000_000)]
    heard = leader.clock.now
    leader.other.record_presence({"cam-04": (heard, True)}, now_ms=heard)
    assert leader.step() == 1
    assert leader.passes.last() == [DevicePresence("cam-04", True, heard)]
    assert leader.step(8000) == 0  # 11 s after the others' last messages: gone quiet
    assert len(leader.passes.last()) == len(DEVICES) - 1
    heard = leader.clock.now
    leader.other.record_presence({"cam-05": (heard, True)}, now_ms=heard)
    assert leader.step() == 1
    assert leader.passes.last() == [DevicePresence("cam-05", True, heard)]


def test_a_new_leader_reads_everything_on_its_first_pass(leader: Leader) -> None:
    assert leader.step() == 0
    successor = RolloutLoop(leader.other, clock=leader.clock)  # the leader failed over
    statements = Statements(leader.other)
    leader.clock.now += 1000
    successor.pass_once()
    assert statements.joins() == 1


def test_a_missing_slot_leaves_every_pass_reading_everything(leader: Leader) -> None:
    with leader.other.engine.begin() as conn:
        conn.execute(delete(fleet_stamp).where(fleet_stamp.c.slot == 0))
    assert leader.step() == 1
    assert leader.step() == 1


def test_a_write_that_moves_no_stamp_is_still_read_within_the_reread_time(leader: Leader) -> None:
    # A hub process of an older version writes a report without bumping the stamp.
    with leader.other.engine.begin() as conn:
        before = read_stamp(conn)
    report(leader.other, "cam-01", "1.0.0", "failed", "2.0.0", leader.clock.now)
    with leader.other.engine.begin() as conn:
        conn.execute(delete(fleet_stamp))  # put the counters back as they were
        conn.execute(
            fleet_stamp.insert(),
            [{"slot": i, "changes": 0, "refreshes": 0, "reports": 0} for i in range(1, SLOTS)]
            + [{"slot": 0, "changes": before[0], "refreshes": before[1], "reports": before[2]}],
        )
    reads = [leader.step(REREAD_MS // 3) for _ in range(4)]
    assert reads[:2] == [0, 0]  # the stamp's word, for a while
    assert 1 in reads[2:]  # then read again whatever it says
    assert leader.as_read_in_full()


def _age_reports(store: Store, ms: int) -> None:
    """Make every stored report look stored ``ms`` earlier (a pass reads those stored lately)."""
    with store.engine.begin() as conn:
        conn.execute(update(reported_states).values(stored_ms=reported_states.c.stored_ms - ms))


def test_reports_stored_in_a_row_are_read_a_few_at_a_time_and_agree_with_a_full_read(
    leader: Leader,
) -> None:
    _age_reports(leader.other, 3600_000)  # the fleet's reports of 1.0.0: an hour old
    versions = ["1.0.0", "2.0.0"]
    for n in range(12):
        device = DEVICES[(n * 7) % len(DEVICES)]
        state = "failed" if n % 5 == 4 else "running"
        report(leader.other, device, versions[n % 2], state, "2.0.0", leader.clock.now + n)
        reported = {device}
        if n % 3 == 2:  # several reports between two passes
            report(leader.other, DEVICES[n], "1.0.0", "running", "1.0.0", leader.clock.now + n)
            reported.add(DEVICES[n])
        assert leader.step_reads(200) == (0, 1)
        assert leader.loop._last[leader.dep_id].facts.changed == reported
        assert leader.as_read_in_full()
    assert leader.step_reads(200) == (0, 0)


def test_a_report_between_other_writes_is_read_with_them(leader: Leader) -> None:
    _age_reports(leader.other, 3600_000)
    report(leader.other, "cam-01", "2.0.0", "running", "2.0.0", leader.clock.now)
    leader.other.set_device_connected("cam-02", connected=False)  # not a report: all is read
    assert leader.step_reads() == (1, 0)
    assert leader.loop._last[leader.dep_id].facts.changed == {"cam-01", "cam-02"}
    assert leader.as_read_in_full()
    report(leader.other, "cam-03", "1.0.0", "failed", "2.0.0", leader.clock.now)
    heard = leader.clock.now + 1000
    leader.other.record_presence(dict.fromkeys(DEVICES[4:], (heard, True)), now_ms=heard)
    assert leader.step_reads() == (0, 1)  # the heartbeats only refresh devices online anyway
    facts = leader.loop._last[leader.dep_id].facts
    assert facts.changed == {"cam-03"}  # the refreshes are read once they matter, not yet
    rollout = leader.store.rollouts_of([leader.dep_id])[leader.dep_id]
    assert facts.reports == leader.other.rollout_facts(rollout).reports


def test_a_report_stored_long_before_it_committed_is_read_by_the_next_full_read(
    leader: Leader,
) -> None:
    # A writer that took its time and then stalled past the margin before committing.
    report(leader.other, "cam-01", "1.0.0", "failed", "2.0.0", leader.clock.now)
    with leader.other.engine.begin() as conn:
        late = reported_states.c.stored_ms - 10 * max(REPORT_MARGIN_MS.values())
        conn.execute(
            update(reported_states)
            .where(reported_states.c.device_id == "cam-01")
            .values(stored_ms=late)
        )
    assert leader.step_reads(1000) == (0, 1)
    assert not leader.as_read_in_full()  # the margin was not enough for it
    reads = [leader.step_reads(REREAD_MS // 3)[0] for _ in range(4)]
    assert 1 in reads  # then everything is read again, whatever the stamp says
    assert leader.as_read_in_full()


#: How a read of a rollout's state text looks in SQL (a write sets it, never selects it).
STATE_READ = "rollouts.state AS rollout_state"
STATE_READ_AGAIN = "SELECT rollouts.deployment_id, rollouts.state"


def _pass_reading_states(leader: Leader) -> int:
    """Run a pass a second later; how many times it read a rollout's state text."""
    leader.clock.now += 1000
    leader.statements.seen.clear()
    leader.loop.pass_once()
    seen = leader.statements.seen
    return sum(STATE_READ in s or STATE_READ_AGAIN in s for s in seen)


def test_the_leader_reads_a_state_again_only_when_another_process_stored_over_it(
    leader: Leader,
) -> None:
    canary = sorted(admitted_devices(leader.store, leader.dep_id))
    revision, saved = leader.loop._held[leader.dep_id].revision, leader.passes.saved
    for n, device in enumerate(canary[:3]):
        report(leader.other, device, "2.0.0", "running", "2.0.0", leader.clock.now)
        leader.step()
        assert leader.passes.saved == saved + n + 1  # each report joined and stored
        assert leader.loop._held[leader.dep_id].revision == revision + n + 1
    assert _pass_reading_states(leader) == 0  # its own revision: the state is not read
    # Another hub process's pass stores over it (a leader that lost its lease, say).
    other = RolloutLoop(leader.other, clock=leader.clock)
    report(leader.other, canary[3], "2.0.0", "running", "2.0.0", leader.clock.now)
    assert other.pass_once() == 1
    stored = leader.store.rollouts_of([leader.dep_id])[leader.dep_id]
    assert stored.revision == revision + 4
    report(leader.other, canary[4], "2.0.0", "running", "2.0.0", leader.clock.now)
    assert _pass_reading_states(leader) == 1  # read again, once, and carried on from
    now = leader.store.rollouts_of([leader.dep_id])[leader.dep_id]
    assert now.revision == revision + 5
    assert RolloutState.from_json(now.state).outcomes.keys() >= set(canary)
    assert leader.loop._held[leader.dep_id].state == now.state


def test_a_pass_over_a_revision_another_stored_first_stores_nothing(leader: Leader) -> None:
    stale = leader.store.rollouts_of([leader.dep_id])[leader.dep_id]
    report(leader.other, admitted_devices(leader.store, leader.dep_id).popitem()[0], "2.0.0",
           "running", "2.0.0", leader.clock.now)  # fmt: skip
    assert RolloutLoop(leader.other, clock=leader.clock).pass_once() == 1
    change = RolloutUpdate(stale.deployment.id, stale.revision, stale.state, stale.phase, {})
    assert not leader.store.save_rollout(change, now_ms=leader.clock.now)
    assert leader.store.rollouts_of([leader.dep_id])[leader.dep_id].revision == stale.revision + 1


# -- which presence news only refreshes (no database) --------------------------------

#: A device heard at 10 s, with a 5 s heartbeat: online until 20 s.
ROW = {"cam-1": (10_000, 5000, True)}


@pytest.mark.parametrize(
    ("news", "row", "now_ms", "refresh"),
    [
        ({"cam-1": (15_000, True)}, ROW, 15_000, True),
        ({"cam-1": (15_000, True), "ghost": (None, False)}, ROW, 15_000, True),  # ghost unknown
        ({"cam-1": (None, True)}, ROW, 15_000, False),  # news only
        ({"cam-1": (15_000, False)}, ROW, 15_000, False),  # it went
        ({"cam-1": (9_000, True)}, ROW, 15_000, False),  # older than the stored time
        ({"cam-1": (15_000, True)}, {"cam-1": (10_000, 5000, False)}, 15_000, False),
        ({"cam-1": (19_500, True)}, ROW, 20_000 - REFRESH_MARGIN_MS, True),
        ({"cam-1": (19_500, True)}, ROW, 20_001 - REFRESH_MARGIN_MS, False),  # nearly quiet
    ],
)
def test_only_heartbeats_of_devices_online_anyway_are_refreshes(
    news: dict[str, tuple[int | None, bool]],
    row: dict[str, tuple[int, int, bool]],
    now_ms: int,
    *,
    refresh: bool,
) -> None:
    assert only_refreshes(news, row, now_ms) is refresh
