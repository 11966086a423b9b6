"""The leader's rollout passes in a process of their own.

A hub process runs its event loop (transport reads, acks, fetch serving), its
telemetry writer and its leader loops on one Python interpreter: at 10,000
devices the loop and the writer keep that interpreter busy, and a rollout pass
run in a thread beside them (tens of ms of Python at that size, every quarter
second while a rolling rollout is under way) waits its turn for it, so a
place that a report freed waited a second or two to be filled.
:class:`RolloutProcessLoop` runs the same :class:`cloud.rollout_loop.RolloutLoop`
in a child process with a store of its own on the same database, one pass per
request over a pipe: the parent stays the leader and asks for each pass; the
child keeps what the loop keeps between passes. A child that dies, or a
leadership lost and won again, starts a new child, which reads everything on
its first pass, as a new leader does. The child starts only once the store
holds a rollout to drive, so a hub with none runs no extra process.

The database must be one that two processes can open: a file or a server, not
SQLite in memory (:func:`shareable`); the hub runs passes in a thread otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any

from sqlalchemy.engine import make_url

from cloud.errors import StoreError
from cloud.loops import LoopFactory
from cloud.rollout_loop import ROLLING_TICK_S, ROLLOUT_TICK_S, RolloutLoop
from cloud.store import Store

__all__ = ["RolloutProcessLoop", "shareable"]

log = logging.getLogger(__name__)

#: Longest the parent waits for the child to start and answer a pass.
PASS_TIMEOUT_S = 300.0


def shareable(store_url: str) -> bool:
    """Whether a second process opening ``store_url`` sees the same database."""
    url = make_url(store_url)
    if not url.drivername.startswith("sqlite"):
        return True
    return bool(url.database) and url.database != ":memory:" and "mode=memory" not in store_url


class _Kept(logging.Handler):
    """Keeps the child's log records of a pass, for the parent to log as its own."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[tuple[str, int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.name, record.levelno, record.getMessage()))


def _serve(conn: Connection, store_url: str, rolling_tick_s: float) -> None:
    """The child: open the store, then run a pass for each request until told to stop."""
    from cloud.store import open_store  # noqa: PLC0415 (a fresh interpreter)

    kept = _Kept()
    root = logging.getLogger("cloud")
    root.addHandler(kept)
    root.setLevel(logging.INFO)
    root.propagate = False
    store = open_store(store_url)
    loop = RolloutLoop(store, rolling_tick_s=rolling_tick_s)
    try:
        while conn.recv():
            kept.lines.clear()
            try:
                stored = loop.pass_once()
            except Exception as exc:  # said to the parent, which raises it
                conn.send(("error", f"{type(exc).__name__}: {exc}", kept.lines))
            else:
                conn.send(("ok", stored, loop.rolling, kept.lines))
    except (EOFError, KeyboardInterrupt):
        pass  # the parent went
    finally:
        store.close()


class RolloutProcessLoop:
    """:class:`cloud.rollout_loop.RolloutLoop`'s passes, run in a child process."""

    def __init__(
        self,
        store: Store,
        store_url: str,
        *,
        tick_s: float = ROLLOUT_TICK_S,
        rolling_tick_s: float = ROLLING_TICK_S,
        on_write: Callable[[], None] | None = None,
    ) -> None:
        """Drive the rollouts of the database at ``store_url`` (which ``store`` opened).

        ``store`` answers, in the parent, whether there is a rollout to drive at
        all; ``on_write`` is called after a pass that stored anything.

        Raises:
            ValueError: ``store_url`` is not :func:`shareable`.
        """
        if not shareable(store_url):
            raise ValueError("a rollout process needs a database two processes can open")
        self._store = store
        self._url = store_url
        self._tick_s = tick_s
        self._rolling_tick_s = rolling_tick_s
        self._on_write = on_write
        self._child: Any = None
        self._conn: Connection | None = None
        #: Whether the last pass drove a rolling rollout still under way.
        self.rolling = False

    def factory(self) -> LoopFactory:
        """The loop for :class:`cloud.loops.LoopHost` (register it leader-only)."""

        async def run() -> None:
            # A thread of its own waits for the child: the loop's shared executor queues
            # the hub's fetches and writes, and a pass waited behind them too.
            waiter = ThreadPoolExecutor(1, thread_name_prefix="rollout-pass")
            try:
                while True:
                    await asyncio.get_running_loop().run_in_executor(waiter, self.pass_once)
                    await asyncio.sleep(self.pause_s)
            finally:
                self.close()  # leadership lost, or the hub stops: the child goes at once
                waiter.shutdown(wait=False)

        return run

    @property
    def pause_s(self) -> float:
        """The pause before the next pass: shorter while a rolling rollout is under way."""
        return self._rolling_tick_s if self.rolling else self._tick_s

    @property
    def pid(self) -> int | None:
        """The child's process id, while it runs."""
        return None if self._child is None else int(self._child.pid)

    def pass_once(self) -> int:
        """Have the child move every driven rollout one pass; how many were stored.

        Raises:
            StoreError: The database failed, or the child did or went away (the
                next pass starts a new one).
        """
        if self._conn is None and not self._store.driven_ids():
            self.rolling = False
            return 0  # nothing to drive: no process
        conn = self._start()
        try:
            conn.send(True)
            if not conn.poll(PASS_TIMEOUT_S):
                raise StoreError(f"the rollout process answered no pass in {PASS_TIMEOUT_S} s")
            answer = conn.recv()
        except (OSError, EOFError, StoreError) as exc:
            self.close()
            raise StoreError(f"the rollout process went away: {exc}") from None
        for name, level, line in answer[-1]:
            logging.getLogger(name).log(level, "%s", line)
        if answer[0] == "error":
            raise StoreError(f"rollout pass failed in its process: {answer[1]}")
        stored, self.rolling = int(answer[1]), bool(answer[2])
        if stored and self._on_write is not None:
            self._on_write()
        return stored

    def _start(self) -> Connection:
        if self._conn is not None and self._child is not None and self._child.is_alive():
            return self._conn
        self.close()
        ctx = multiprocessing.get_context("spawn")
        mine, theirs = ctx.Pipe()
        child = ctx.Process(
            target=_serve,
            args=(theirs, self._url, self._rolling_tick_s),
            name="edgeskill-rollouts",
            daemon=True,
        )
        child.start()
        theirs.close()
        self._child, self._conn = child, mine
        log.info("rollout passes run in process %d", child.pid)
        return mine

    def close(self) -> None:
        """Stop the child, if one runs (its next start reads everything again)."""
        child, conn = self._child, self._conn
        self._child = self._conn = None
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.send(False)
            conn.close()
        if child is not None:
            child.join(5.0)
            if child.is_alive():
                child.kill()
                child.join(5.0)
