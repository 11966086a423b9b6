"""The durable outbox: everything the agent sends up waits here until the hub acknowledges it.

Entries live in one SQLite database in WAL mode. The database runs with
``synchronous=FULL``: every commit waits for the WAL to reach the disk, so an entry
whose :meth:`Outbox.put` has returned survives a crash of the agent *and* a power cut.
``NORMAL`` would only survive a crash of the process, and edge devices lose power
(a camera unplugged, a gateway browning out) far more often than servers do; one
fsync per commit is cheap next to a network send, and :class:`OutboxWriter` commits
many messages per transaction from a worker thread, so the agent's event loop never
waits on the disk and a burst of messages costs a few syncs, not one each.

The outbox is bounded. When a new entry would exceed a cap, the oldest entries are
dropped to make room (fresh telemetry is worth more than stale), and the number dropped
is kept in a persistent counter so the hub can be told what was lost.

Besides its entries the outbox keeps named numbers (marks, :meth:`Outbox.counter`) written in
the same transaction as the entries put with them: the agent's telemetry sequence
number is stored with the window that carries it, so neither survives a crash
without the other. Reads take no write lock, and an idle agent's periodic questions
("anything dropped?") are answered from memory: the outbox is this process's own.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from edge_agent.errors import OutboxError

__all__ = ["MAX_ID_LENGTH", "NewEntry", "Outbox", "OutboxEntry", "OutboxWriter"]

MAX_ID_LENGTH = 256
"""Longest accepted ``msg_id`` and ``kind``, in characters."""

_MAX_PENDING_LIMIT = 10_000
#: Most committed entries an :class:`OutboxWriter` keeps for its sender.
_MAX_COMMITTED = 1000
#: Counter names the outbox keeps for itself; marks may not use them.
_OWN_COUNTERS = frozenset({"dropped", "count", "bytes"})

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    msg_id TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    payload BLOB NOT NULL,
    created_ms INTEGER NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS counters (
    name TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
INSERT OR IGNORE INTO counters (name, value) VALUES ('dropped', 0);
DELETE FROM counters WHERE name IN ('count', 'bytes');
"""


@dataclass(frozen=True)
class NewEntry:
    """A checked message on its way into the outbox (see :meth:`Outbox.check`)."""

    msg_id: str
    kind: str
    payload: bytes


@dataclass(frozen=True)
class OutboxEntry:
    """One message waiting for the hub's acknowledgement.

    Attributes:
        msg_id: The message id, unique within the outbox.
        kind: The message kind (routes it on the hub side).
        payload: The serialised message.
        created_ms: When it was put, in milliseconds since the epoch.
        attempts: How many times it has been sent so far.
    """

    msg_id: str
    kind: str
    payload: bytes
    created_ms: int
    attempts: int


class Outbox:
    """A bounded, durable, thread-safe FIFO of outgoing messages.

    Args:
        path: The SQLite database file; its folder is created if missing.
        max_entries: Most entries kept; older ones are dropped beyond it.
        max_bytes: Most payload bytes kept in total; older entries are dropped beyond it.
        max_payload: Largest payload accepted by :meth:`put`.

    Raises:
        OutboxError: The caps are inconsistent or the database cannot be opened.
    """

    def __init__(
        self,
        path: Path,
        *,
        max_entries: int = 100_000,
        max_bytes: int = 64 * 1024 * 1024,
        max_payload: int = 256 * 1024,
    ) -> None:
        if max_entries < 1 or max_payload < 1 or max_bytes < max_payload:
            raise OutboxError(
                f"bad outbox caps: max_entries={max_entries}, max_bytes={max_bytes}, "
                f"max_payload={max_payload} (need max_entries >= 1, 1 <= max_payload <= max_bytes)"
            )
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._max_payload = max_payload
        self._lock = threading.RLock()  # take_dropped holds it around a transaction
        self._conn: sqlite3.Connection | None = None
        self._count = self._bytes = 0  # waiting entries and their payload bytes
        #: Write transactions :meth:`put_many` has committed (batching shows as fewer).
        self.commits = 0
        #: Whether the dropped counter may be above zero (it is read at open, set on a drop).
        self._dropped_waiting = True
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(
                path, timeout=10.0, isolation_level=None, check_same_thread=False
            )
        except (OSError, sqlite3.Error) as exc:
            raise OutboxError(f"cannot open outbox {path}: {exc}") from exc
        try:
            self._conn = conn
            self._setup(conn)
        except sqlite3.Error as exc:
            conn.close()
            self._conn = None
            raise OutboxError(f"cannot open outbox {path}: {exc}") from exc

    def _setup(self, conn: sqlite3.Connection) -> None:
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise sqlite3.OperationalError(f"WAL mode refused (journal_mode={mode})")
        conn.execute("PRAGMA synchronous=FULL")
        conn.executescript(f"BEGIN IMMEDIATE;{_SCHEMA}COMMIT;")
        # The running totals live in memory (this process owns the outbox), counted at open
        # so that edits made behind our back cannot skew them.
        count, size = conn.execute(
            "SELECT COUNT(*), COALESCE(SUM(LENGTH(payload)), 0) FROM entries"
        ).fetchone()
        self._count, self._bytes = int(count), int(size)

    def __enter__(self) -> Outbox:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @contextmanager
    def _transaction(self, *, write: bool = True) -> Iterator[sqlite3.Connection]:
        """Hold the lock and one transaction; commit on success, roll back otherwise.

        A read (``write=False``) takes no write lock on the database.
        """
        with self._lock:
            conn = self._conn
            if conn is None:
                raise OutboxError("the outbox is closed")
            try:
                conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                try:
                    yield conn
                    conn.execute("COMMIT")
                finally:
                    # A failed COMMIT (disk full, I/O error) leaves the transaction open.
                    if conn.in_transaction:
                        conn.rollback()
            except sqlite3.Error as exc:
                raise OutboxError(f"outbox database error: {exc}") from exc

    def put(self, msg_id: str, kind: str, payload: bytes) -> None:
        """Store a message durably; a ``msg_id`` already waiting is ignored.

        Over a cap, the oldest entries (never this one) are dropped and counted.

        Args:
            msg_id: Unique message id, 1 to :data:`MAX_ID_LENGTH` characters.
            kind: Message kind, 1 to :data:`MAX_ID_LENGTH` characters.
            payload: The serialised message, at most ``max_payload`` bytes.

        Raises:
            OutboxError: A bad id, kind or payload size (nothing is stored), or a database error.
        """
        self.put_many([self.check(msg_id, kind, payload)])

    def check(self, msg_id: str, kind: str, payload: bytes) -> NewEntry:
        """Validate one message for :meth:`put_many`, without touching the database.

        Raises:
            OutboxError: A bad id or kind, a payload that is not bytes or is over the cap.
        """
        _check_text("msg_id", msg_id)
        _check_text("kind", kind)
        if not isinstance(payload, bytes | bytearray | memoryview):
            raise OutboxError(f"payload must be bytes, got {type(payload).__name__}")
        data = bytes(payload)
        if len(data) > self._max_payload:
            raise OutboxError(
                f"payload of {len(data)} bytes exceeds the outbox cap of {self._max_payload}"
            )
        return NewEntry(msg_id, kind, data)

    def put_many(
        self,
        entries: Sequence[NewEntry],
        marks: Mapping[str, int] | None = None,
        acked: Sequence[str] = (),
    ) -> int:
        """Store checked messages durably in one transaction (one disk sync for all).

        They are stored in order, as if put one by one; ids already waiting are
        ignored. Either all of them are committed or none is.

        Args:
            entries: Messages made by :meth:`check`.
            marks: Named numbers set in the same transaction (read with :meth:`counter`).
            acked: Ids the hub acknowledged, deleted in the same transaction (before the
                new entries are stored, so they make room), as :meth:`ack` would.

        Returns:
            How many acknowledged entries were removed.

        Raises:
            OutboxError: A reserved or malformed mark name, or a database error
                (nothing is stored or removed).
        """
        named = [(_check_mark(name), int(value)) for name, value in (marks or {}).items()]
        ids = _unique_ids(acked)
        # The lock is held over the commit and the totals' update (another put waits for both).
        with self._lock:
            return self._put_locked(entries, named, ids)

    def _put_locked(
        self, entries: Sequence[NewEntry], named: list[tuple[str, int]], acked: list[str]
    ) -> int:
        with self._transaction() as conn:
            totals = [self._count, self._bytes]  # applied only once the commit went through
            removed = _delete_ids(conn, acked, totals)
            conn.executemany(
                "INSERT INTO counters (name, value) VALUES (?, ?) "
                "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                named,
            )
            for entry in entries:
                seen = conn.execute("SELECT 1 FROM entries WHERE msg_id = ?", (entry.msg_id,))
                if seen.fetchone():
                    continue
                self._make_room(conn, len(entry.payload), totals)
                conn.execute(
                    "INSERT INTO entries (msg_id, kind, payload, created_ms) VALUES (?, ?, ?, ?)",
                    (entry.msg_id, entry.kind, entry.payload, time.time_ns() // 1_000_000),
                )
                totals[0] += 1
                totals[1] += len(entry.payload)
        with self._lock:
            self._count, self._bytes = totals
            self.commits += 1
        return removed

    def _make_room(self, conn: sqlite3.Connection, incoming: int, totals: list[int]) -> None:
        """Drop the oldest entries until one more of ``incoming`` bytes fits both caps.

        ``totals`` (entries, bytes) is this transaction's running count; it is updated.
        """
        count, total = totals
        excess_count = count + 1 - self._max_entries
        excess_bytes = total + incoming - self._max_bytes
        if excess_count <= 0 and excess_bytes <= 0:
            return
        dropped, freed, last_seq = 0, 0, None
        rows = conn.execute("SELECT seq, LENGTH(payload) FROM entries ORDER BY seq")
        for seq, size in rows:
            if dropped >= excess_count and freed >= excess_bytes:
                break
            dropped, freed, last_seq = dropped + 1, freed + size, seq
        rows.close()
        conn.execute("DELETE FROM entries WHERE seq <= ?", (last_seq,))
        conn.execute("UPDATE counters SET value = value + ? WHERE name = 'dropped'", (dropped,))
        self._dropped_waiting = True
        totals[0] -= dropped
        totals[1] -= freed

    def pending(self, limit: int = 100) -> list[OutboxEntry]:
        """Return up to ``limit`` waiting entries, oldest first.

        Args:
            limit: How many entries at most, 1 to 10,000.

        Raises:
            OutboxError: ``limit`` is out of range, or a database error.
        """
        if not 1 <= limit <= _MAX_PENDING_LIMIT:
            raise OutboxError(f"pending limit must be 1..{_MAX_PENDING_LIMIT}, got {limit}")
        with self._transaction(write=False) as conn:
            rows = conn.execute(
                "SELECT msg_id, kind, payload, created_ms, attempts FROM entries "
                "ORDER BY seq LIMIT ?",
                (limit,),
            ).fetchall()
        return [OutboxEntry(r[0], r[1], bytes(r[2]), r[3], r[4]) for r in rows]

    def mark_attempted(self, msg_ids: Sequence[str]) -> None:
        """Count one more send attempt for each given entry; unknown ids are ignored.

        Raises:
            OutboxError: A database error.
        """
        ids = _unique_ids(msg_ids)
        with self._transaction() as conn:
            conn.executemany(
                "UPDATE entries SET attempts = attempts + 1 WHERE msg_id = ?",
                [(i,) for i in ids],
            )

    def ack(self, msg_ids: Sequence[str]) -> int:
        """Delete entries the hub has acknowledged.

        Args:
            msg_ids: Ids acknowledged by the hub; unknown ids are ignored.

        Returns:
            How many entries were removed.

        Raises:
            OutboxError: A database error.
        """
        return self.put_many((), acked=msg_ids)

    @property
    def has_dropped(self) -> bool:
        """Whether :meth:`take_dropped` may return more than 0 (answered from memory)."""
        return self._dropped_waiting

    def take_dropped(self) -> int:
        """Return how many entries were dropped over the caps since the last call, and reset.

        Nothing dropped since the last call (the usual case) is answered without
        touching the database.

        Raises:
            OutboxError: A database error.
        """
        with self._lock:
            if not self._dropped_waiting:
                if self._conn is None:
                    raise OutboxError("the outbox is closed")
                return 0
            with self._transaction() as conn:
                (dropped,) = conn.execute(
                    "SELECT value FROM counters WHERE name = 'dropped'"
                ).fetchone()
                if dropped:
                    conn.execute("UPDATE counters SET value = 0 WHERE name = 'dropped'")
            self._dropped_waiting = False
        return int(dropped)

    def counter(self, name: str) -> int:
        """A number set with ``marks`` (:meth:`put_many`), or 0 if never set.

        Raises:
            OutboxError: A reserved or malformed name, or a database error.
        """
        with self._transaction(write=False) as conn:
            row = conn.execute(
                "SELECT value FROM counters WHERE name = ?", (_check_mark(name),)
            ).fetchone()
        return 0 if row is None else int(row[0])

    def __len__(self) -> int:
        """Return the number of waiting entries.

        Raises:
            OutboxError: A database error or a closed outbox.
        """
        with self._lock:
            if self._conn is None:
                raise OutboxError("the outbox is closed")
            return self._count

    def close(self) -> None:
        """Close the database; later calls raise :class:`OutboxError`. Closing twice is fine."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


class OutboxWriter:
    """Puts messages into an :class:`Outbox` off the event loop, many per transaction.

    Each :meth:`put` returns once its message is committed. While one batch is
    being committed in a worker thread, new messages gather for the next one, so
    a burst of puts costs a few disk syncs instead of one each (group commit).
    Use it from one event loop.

    Args:
        outbox: Where the messages go.
        max_batch: Most messages committed in one transaction.
    """

    def __init__(self, outbox: Outbox, max_batch: int = 256) -> None:
        self.outbox = outbox
        self._max_batch = max(1, max_batch)
        #: Committed since the last :meth:`take_committed`, in order; None once over the cap.
        self._committed: list[NewEntry] | None = []
        self._waiting: list[tuple[NewEntry, Mapping[str, int], asyncio.Future[None]]] = []
        self._committer: asyncio.Task[None] | None = None
        #: Acknowledged ids whose deletion waits for the next commit, in order.
        self._acked: dict[str, None] = {}
        self._ack_timer: asyncio.TimerHandle | None = None
        #: Acknowledged entries deleted so far.
        self.acked_total = 0

    async def put(
        self, msg_id: str, kind: str, payload: bytes, marks: Mapping[str, int] | None = None
    ) -> None:
        """Store a message durably, as :meth:`Outbox.put` does, without blocking the loop.

        ``marks`` are set in the transaction that commits the message (see
        :meth:`Outbox.put_many`); of two puts in one batch, the later one's win.

        Raises:
            OutboxError: A bad id, kind, payload size or mark name (nothing is
                stored), or a database error.
        """
        entry = self.outbox.check(msg_id, kind, payload)
        for name in marks or {}:
            _check_mark(name)
        done = asyncio.get_running_loop().create_future()
        self._waiting.append((entry, dict(marks or {}), done))
        if self._committer is None or self._committer.done():
            self._committer = asyncio.create_task(self._commit_waiting())
        # Shielded: a caller that gives up does not take the batch's outcome with it.
        await asyncio.shield(done)

    def ack(self, msg_ids: Sequence[str], linger_s: float = 2.0) -> None:
        """Delete acknowledged entries with the next commit, or within ``linger_s``.

        An acknowledged entry needs no disk sync of its own: its deletion joins the
        next message's transaction (or, when none comes in time, one of its own).
        Until then :meth:`is_acked` says so, and a crash before that commit only
        makes the entry go again, which the hub drops as a repeat.

        Raises:
            OutboxError: ``msg_ids`` is one string rather than a sequence of ids.
        """
        for msg_id in _unique_ids(msg_ids):
            self._acked[msg_id] = None
        busy = self._committer is not None and not self._committer.done()
        if self._acked and not busy and self._ack_timer is None:
            loop = asyncio.get_running_loop()
            self._ack_timer = loop.call_later(linger_s, self._commit_soon)

    def is_acked(self, msg_id: str) -> bool:
        """Whether ``msg_id`` was acknowledged and waits for its deletion to be committed."""
        return msg_id in self._acked

    async def settle(self) -> None:
        """Commit every acknowledgement and message waiting now (before closing the outbox)."""
        self._commit_soon()
        if self._committer is not None:
            await asyncio.shield(self._committer)

    def _commit_soon(self) -> None:
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None
        if self._committer is None or self._committer.done():
            self._committer = asyncio.create_task(self._commit_waiting())

    async def _commit_waiting(self) -> None:
        while self._waiting or self._acked:
            if self._ack_timer is not None:  # this commit takes the acknowledgements along
                self._ack_timer.cancel()
                self._ack_timer = None
            batch = self._waiting[: self._max_batch]
            del self._waiting[: self._max_batch]
            acked, self._acked = list(self._acked), {}
            marks: dict[str, int] = {}
            for _, own, _ in batch:
                marks.update(own)
            try:
                entries = [entry for entry, _, _ in batch]
                removed = await asyncio.to_thread(self.outbox.put_many, entries, marks, acked)
            except OutboxError as exc:
                # The acknowledged entries stay stored and go again: the hub drops repeats.
                for _, _, done in batch:
                    if not done.done():
                        done.set_exception(OutboxError(str(exc)))
            else:
                self.acked_total += removed
                if self._committed is not None:
                    self._committed.extend(entries)
                    if len(self._committed) > _MAX_COMMITTED:
                        self._committed = None  # the reader goes back to the outbox itself
                for _, _, done in batch:
                    if not done.done():
                        done.set_result(None)

    def take_committed(self) -> list[NewEntry] | None:
        """What was committed through this writer since the last call, oldest first.

        The sender of a quiet outbox sends these without reading them back from
        the database. None when more were committed than this writer keeps
        (:data:`_MAX_COMMITTED`): the caller reads :meth:`Outbox.pending` instead.
        """
        found, self._committed = self._committed, []
        return found


def _delete_ids(conn: sqlite3.Connection, ids: Sequence[str], totals: list[int]) -> int:
    """Delete the entries of ``ids`` (unknown ones are ignored); ``totals`` follows."""
    removed = 0
    for msg_id in ids:
        row = conn.execute(
            "SELECT seq, LENGTH(payload) FROM entries WHERE msg_id = ?", (msg_id,)
        ).fetchone()
        if row is not None:
            conn.execute("DELETE FROM entries WHERE seq = ?", (row[0],))
            removed += 1
            totals[0] -= 1
            totals[1] -= row[1]
    return removed


def _check_mark(name: str) -> str:
    _check_text("mark name", name)
    if name in _OWN_COUNTERS:
        raise OutboxError(f"mark name {name!r} is the outbox's own counter")
    return name


def _check_text(what: str, value: str) -> None:
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_ID_LENGTH:
        raise OutboxError(f"{what} must be a string of 1..{MAX_ID_LENGTH} characters")


def _unique_ids(msg_ids: Sequence[str]) -> list[str]:
    if isinstance(msg_ids, str):
        raise OutboxError("msg_ids must be a sequence of ids, not one string")
    return list(dict.fromkeys(msg_ids))
