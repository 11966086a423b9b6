"""Tests for the durable outbox (real SQLite files, real child processes)."""

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from edge_agent.errors import OutboxError
from edge_agent.outbox import Outbox, OutboxWriter


def _ids(box: Outbox) -> list[str]:
    return [e.msg_id for e in box.pending(limit=10_000)]


def test_put_pending_oldest_first_and_survives_reopen(tmp_path: Path) -> None:
    db = tmp_path / "state" / "outbox.db"
    with Outbox(db) as box:
        box.put("m1", "telemetry", b"one")
        box.put("m2", "status", b"two")
        box.mark_attempted(["m1", "nope"])
    with Outbox(db) as box:
        entries = box.pending()
        assert [(e.msg_id, e.kind, e.payload, e.attempts) for e in entries] == [
            ("m1", "telemetry", b"one", 1),
            ("m2", "status", b"two", 0),
        ]
        assert entries[0].created_ms > 1_600_000_000_000
        assert len(box) == 2
        assert box.pending(limit=1)[0].msg_id == "m1"


def test_ack_removes_only_acked_ids(tmp_path: Path) -> None:
    with Outbox(tmp_path / "o.db") as box:
        for i in range(5):
            box.put(f"m{i}", "k", b"x" * i)
        assert box.ack(["m1", "m3", "m3", "unknown"]) == 2
        assert _ids(box) == ["m0", "m2", "m4"]
        assert box.ack(["m1"]) == 0
        assert len(box) == 3


def test_duplicate_msg_id_is_a_no_op(tmp_path: Path) -> None:
    with Outbox(tmp_path / "o.db") as box:
        box.put("m1", "k", b"first")
        box.put("m2", "k", b"second")
        box.put("m1", "other", b"replayed")
        assert [(e.msg_id, e.payload) for e in box.pending()] == [
            ("m1", b"first"),
            ("m2", b"second"),
        ]


def test_entry_cap_drops_oldest_and_counts_persistently(tmp_path: Path) -> None:
    db = tmp_path / "o.db"
    with Outbox(db, max_entries=3) as box:
        for i in range(5):
            box.put(f"m{i}", "k", b"p")
        assert _ids(box) == ["m2", "m3", "m4"]
    with Outbox(db, max_entries=3) as box:
        assert box.take_dropped() == 2
        assert box.take_dropped() == 0
        box.put("m5", "k", b"p")
        assert box.take_dropped() == 1
        assert _ids(box) == ["m3", "m4", "m5"]


def test_byte_cap_drops_as_many_oldest_as_needed_never_the_new_one(tmp_path: Path) -> None:
    with Outbox(tmp_path / "o.db", max_bytes=100, max_payload=100) as box:
        for i in range(4):
            box.put(f"small{i}", "k", b"s" * 20)
        box.ack(["small1"])
        # 60 bytes stored; 70 more need 30 freed: small0 and small2 (40 bytes) go.
        box.put("big", "k", b"b" * 70)
        assert _ids(box) == ["small3", "big"]
        assert box.take_dropped() == 2
        box.put("full", "k", b"f" * 100)
        assert _ids(box) == ["full"]
        assert box.take_dropped() == 2


def test_oversize_or_bad_input_is_refused_and_nothing_stored(tmp_path: Path) -> None:
    with Outbox(tmp_path / "o.db", max_entries=2, max_bytes=1000, max_payload=10) as box:
        box.put("keep1", "k", b"1")
        box.put("keep2", "k", b"2")
        with pytest.raises(OutboxError, match="exceeds"):
            box.put("big", "k", b"x" * 11)
        with pytest.raises(OutboxError):
            box.put("", "k", b"x")
        with pytest.raises(OutboxError):
            box.put("id" * 200, "k", b"x")
        with pytest.raises(OutboxError):
            box.put("m", "k", "text")  # type: ignore[arg-type]
        with pytest.raises(OutboxError):
            box.ack("keep1")
        assert _ids(box) == ["keep1", "keep2"]
        assert box.take_dropped() == 0
        box.put("exact", "k", b"x" * 10)
        assert _ids(box) == ["keep2", "exact"]


def test_bad_caps_and_closed_outbox_raise(tmp_path: Path) -> None:
    with pytest.raises(OutboxError):
        Outbox(tmp_path / "o.db", max_bytes=10, max_payload=20)
    box = Outbox(tmp_path / "o.db")
    box.close()
    box.close()
    with pytest.raises(OutboxError, match="closed"):
        box.put("m", "k", b"")
    with Outbox(tmp_path / "o.db") as again, pytest.raises(OutboxError):
        again.pending(limit=0)


def test_a_file_that_is_not_a_database_is_an_outbox_error(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(OutboxError):
        Outbox(junk)


def test_concurrent_puts_from_threads(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.db")
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            for i in range(40):
                box.put(f"t{t}-{i}", "k", f"{t}:{i}".encode())
                if i % 10 == 9:
                    box.pending(limit=5)
        except BaseException as exc:  # reported to the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    ids = _ids(box)
    assert len(box) == len(ids) == 240
    for t in range(6):
        mine = [i for i in ids if i.startswith(f"t{t}-")]
        assert mine == [f"t{t}-{i}" for i in range(40)]
    box.close()


_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from edge_agent.outbox import Outbox

    box = Outbox(Path(sys.argv[1]))
    n = int(sys.argv[2])
    for i in range(n):
        box.put(f"m{i}", "k", b"payload-%d" % i)
        print(f"m{i}", flush=True)
    if sys.argv[3] == "self":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.stdin.read()
    """
)


def test_entry_survives_sigkill_right_after_put_returns(tmp_path: Path) -> None:
    db = tmp_path / "o.db"
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(db), "1", "self"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert proc.stdout.split() == ["m0"]
    with Outbox(db) as box:
        assert [(e.msg_id, e.payload) for e in box.pending()] == [("m0", b"payload-0")]


def test_every_acknowledged_put_survives_kill_from_outside(tmp_path: Path) -> None:
    db = tmp_path / "o.db"
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(db), "100000", "wait"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    confirmed = [proc.stdout.readline().strip() for _ in range(30)]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close()
    assert proc.stdin is not None
    proc.stdin.close()
    with Outbox(db) as box:
        stored = _ids(box)
    assert stored[: len(confirmed)] == confirmed
    assert stored == [f"m{i}" for i in range(len(stored))]


# -- the writer: off the event loop, many puts per commit --------------------------------


def _committed_ids(db: Path) -> set[str]:
    """Ids committed to ``db``, read through a connection of its own."""
    conn = sqlite3.connect(db)
    try:
        return {row[0] for row in conn.execute("SELECT msg_id FROM entries")}
    finally:
        conn.close()


def test_writer_commits_concurrent_puts_in_fewer_transactions(tmp_path: Path) -> None:
    db = tmp_path / "o.db"
    box = Outbox(db)
    writer = OutboxWriter(box, max_batch=64)

    async def main() -> None:
        await asyncio.gather(*(writer.put(f"m{i}", "k", b"p%d" % i) for i in range(200)))

    asyncio.run(main())
    assert box.commits < 200
    assert box.commits >= 200 // 64
    assert _ids(box) == [f"m{i}" for i in range(200)]  # in the order they were put
    assert len(_committed_ids(db)) == 200
    box.close()


def test_writer_resolves_each_put_only_once_it_is_committed(tmp_path: Path) -> None:
    db = tmp_path / "o.db"
    box = Outbox(db)
    writer = OutboxWriter(box, max_batch=7)
    seen_missing: list[str] = []

    async def put_and_check(msg_id: str) -> None:
        await writer.put(msg_id, "k", b"x")
        if msg_id not in _committed_ids(db):
            seen_missing.append(msg_id)

    async def main() -> None:
        await asyncio.gather(*(put_and_check(f"m{i}") for i in range(50)))

    asyncio.run(main())
    assert seen_missing == []
    assert box.commits >= 50 // 7
    box.close()


def test_writer_keeps_the_loop_free_while_committing(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.db")
    writer = OutboxWriter(box)
    ticks = 0

    async def ticker(stop: asyncio.Event) -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0)

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(ticker(stop))
        for i in range(20):  # one at a time: every put waits for its own disk sync
            await writer.put(f"m{i}", "k", b"x")
        stop.set()
        await task

    asyncio.run(main())
    # A put blocking the loop would let the ticker run about once per put, not in between.
    assert ticks > 40
    assert len(box) == 20
    box.close()


def test_writer_refuses_bad_input_at_once_and_reports_database_errors(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.db", max_payload=10)
    writer = OutboxWriter(box)

    async def main() -> list[BaseException | None]:
        with pytest.raises(OutboxError, match="exceeds"):
            await writer.put("big", "k", b"x" * 11)
        with pytest.raises(OutboxError):
            await writer.put("", "k", b"x")
        await writer.put("ok", "k", b"x")
        box.close()
        return await asyncio.gather(
            writer.put("a", "k", b"x"), writer.put("b", "k", b"x"), return_exceptions=True
        )

    results = asyncio.run(main())
    assert [type(r) for r in results] == [OutboxError, OutboxError]
    assert all("closed" in str(r) for r in results)
    with Outbox(tmp_path / "o.db") as again:
        assert _ids(again) == ["ok"]


_WRITER_CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from edge_agent.outbox import Outbox, OutboxWriter

    async def main():
        writer = OutboxWriter(Outbox(Path(sys.argv[1])))

        async def one(i):
            await writer.put(f"m{i}", "k", b"payload-%d" % i)
            print(f"m{i}", flush=True)

        i = 0
        while True:  # bursts of 8 concurrent puts, until killed
            await asyncio.gather(*(one(i + j) for j in range(8)))
            i += 8

    asyncio.run(main())
    """
)


def test_every_put_the_writer_confirmed_survives_kill_from_outside(tmp_path: Path) -> None:
    db = tmp_path / "o.db"
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER_CHILD, str(db)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    confirmed = [proc.stdout.readline().strip() for _ in range(60)]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close()
    with Outbox(db) as box:
        stored = set(_ids(box))
    assert set(confirmed) <= stored


# -- marks: numbers committed with the entries they belong to ----------------------------


def test_marks_are_committed_with_their_entries_or_not_at_all(tmp_path: Path) -> None:
    db = tmp_path / "o.db"
    with Outbox(db) as box:
        assert box.counter("telemetry.seq") == 0
        box.put_many([box.check("w1", "telemetry", b"1")], {"telemetry.seq": 1})
        # A trigger of the test's own makes the next insert fail inside the transaction.
        conn = sqlite3.connect(db)
        conn.execute(
            "CREATE TRIGGER refuse BEFORE INSERT ON entries WHEN NEW.msg_id = 'boom' "
            "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
        )
        conn.commit()
        conn.close()
        entries = [box.check("w2", "telemetry", b"2"), box.check("boom", "telemetry", b"3")]
        with pytest.raises(OutboxError, match="refused by the test"):
            box.put_many(entries, {"telemetry.seq": 3})
        assert (_ids(box), box.counter("telemetry.seq")) == (["w1"], 1)
        for reserved in ("dropped", "count", "bytes", ""):
            with pytest.raises(OutboxError):
                box.put_many([box.check("w4", "telemetry", b"4")], {reserved: 9})
        assert _ids(box) == ["w1"]
    with Outbox(db) as again:  # and they are durable
        assert again.counter("telemetry.seq") == 1
        with pytest.raises(OutboxError):
            again.counter("dropped")


def test_nothing_dropped_is_answered_without_the_database(tmp_path: Path) -> None:
    db = tmp_path / "o.db"
    with Outbox(db, max_entries=2) as box:
        assert box.has_dropped  # not known before the first look
        assert box.take_dropped() == 0
        assert not box.has_dropped
        for i in range(3):
            box.put(f"m{i}", "k", b"p")
        assert box.has_dropped
    with Outbox(db, max_entries=2) as box:  # a count left from before is read at open
        assert box.has_dropped
        assert box.take_dropped() == 1
        assert (box.has_dropped, box.take_dropped()) == (False, 0)
    box.close()
    with pytest.raises(OutboxError, match="closed"):
        box.take_dropped()


def test_the_writer_commits_marks_and_a_later_put_wins(tmp_path: Path) -> None:
    db = tmp_path / "o.db"
    box = Outbox(db)
    writer = OutboxWriter(box)

    async def main() -> None:
        await asyncio.gather(
            *(writer.put(f"w{i}", "telemetry", b"x", {"telemetry.seq": i}) for i in range(1, 6))
        )
        with pytest.raises(OutboxError):
            await writer.put("w6", "telemetry", b"x", {"count": 6})

    asyncio.run(main())
    assert box.counter("telemetry.seq") == 5
    assert _ids(box) == [f"w{i}" for i in range(1, 6)]
    box.close()


def test_acks_join_the_next_commit_or_go_alone_after_their_linger(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.db")
    writer = OutboxWriter(box)

    async def main() -> None:
        await asyncio.gather(*(writer.put(f"m{i}", "k", b"p") for i in range(3)))
        commits = box.commits
        writer.ack(["m0", "m1"], linger_s=60.0)
        assert writer.is_acked("m0") and not writer.is_acked("m2")
        assert len(box) == 3  # not deleted yet: no sync of their own
        await writer.put("m3", "k", b"p")  # the deletions ride along with this commit
        assert box.commits == commits + 1
        assert _ids(box) == ["m2", "m3"] and not writer.is_acked("m0")
        # With nothing else to commit, the acks go alone once their linger is over.
        writer.ack(["m2", "unknown"], linger_s=0.05)
        deadline = asyncio.get_running_loop().time() + 10
        # The deletion is in the database a moment before the writer, back on the loop
        # from its thread, counts it: wait for the count.
        while writer.acked_total < 3:
            assert asyncio.get_running_loop().time() < deadline, "the lingering ack never went"
            await asyncio.sleep(0.01)
        assert _ids(box) == ["m3"] and box.commits == commits + 2 and writer.acked_total == 3
        # settle() commits what waits at once.
        writer.ack(["m3"], linger_s=60.0)
        await writer.settle()
        assert _ids(box) == [] and box.commits == commits + 3
        with pytest.raises(OutboxError):
            writer.ack("m3")  # one string is not a list of ids

    asyncio.run(main())
    box.close()
