"""A slow link and a slow device, emulated on one machine, for split-inference tests and benchmarks.

:class:`LinkEmulator` is a real TCP proxy on loopback (asyncio): it listens on a
port, opens a connection to the target for each client, and shapes each
direction on its own (:class:`Shape`):

* **rate** — a token bucket (bytes/s, with a burst); data waits for tokens
  before it leaves, so the sender is slowed by TCP's own flow control;
* **delay** and **jitter** — each piece of data is released ``delay ± jitter``
  after it passed the bucket, but never before the piece ahead of it: a byte
  stream must stay in order, so jitter shows up as bunching, not reordering;
* **loss** — TCP hides loss from the application; what a lost segment costs is
  its retransmission. So a chosen fraction of pieces is delayed by one
  retransmission timeout (``rto_ms``), and, in order, so is everything behind
  it (head-of-line blocking, as in real TCP). No byte is ever dropped.

Every shape can be changed while traffic flows, from any thread
(:meth:`LinkEmulator.set_shape`); the change applies to the next piece read
(a bucket waiting for tokens looks again at least every 20 ms).

Why not the kernel: ``tc qdisc ... netem`` shapes for real, but this kernel has
no ``sch_netem`` (and changing qdiscs needs ``CAP_NET_ADMIN``). This proxy runs
anywhere, unprivileged; being user space, it adds ~0.1 ms per piece and tops out
around a few Gbit/s.

:class:`DeviceSlowdown` makes the device slower than the machine: a cgroup v2
CPU quota on the head's process where the machine allows it, else the measured
device time scaled by the factor; it says which one ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

__all__ = [
    "DeviceSlowdown",
    "LinkEmulator",
    "Shape",
    "emulate_in_thread",
]

Direction = Literal["up", "down"]

#: How often a bucket waiting for tokens looks again at the rate (seconds).
_RECHECK_S = 0.02
#: Pieces in flight per direction before the proxy stops reading (back-pressure).
_QUEUE_PIECES = 64
#: The smallest automatic burst, and the share of a second of rate it covers.
_MIN_BURST = 16384
_AUTO_BURST_S = 0.005
#: Pieces are at most this share of the bucket, so a late wake-up still finds room
#: for the tokens it earned meanwhile (and the set rate is kept).
_PIECES_PER_BURST = 4


@dataclass(frozen=True)
class Shape:
    """How one direction of the link behaves.

    Attributes:
        rate_bps: Bytes per second; ``None`` for no limit.
        delay_ms: One-way delay added to every piece.
        jitter_ms: Each piece's delay varies uniformly by up to this much either way.
        loss: The share of pieces that wait one extra ``rto_ms`` (a retransmission).
        rto_ms: The retransmission timeout a "lost" piece costs.
        burst_bytes: The token bucket's size; ``None`` picks 5 ms of rate (at least 16 KiB).

    Raises:
        ValueError: a value is negative, not finite, or ``loss`` is not in ``[0, 1]``.
    """

    rate_bps: float | None = None
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss: float = 0.0
    rto_ms: float = 200.0
    burst_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.rate_bps is not None and not (math.isfinite(self.rate_bps) and self.rate_bps > 0):
            raise ValueError(f"rate_bps must be finite and > 0, got {self.rate_bps!r}")
        for name in ("delay_ms", "jitter_ms", "rto_ms"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
        if not 0 <= self.loss <= 1:
            raise ValueError(f"loss must be in [0, 1], got {self.loss!r}")
        if self.burst_bytes is not None and self.burst_bytes < 1:
            raise ValueError("burst_bytes must be >= 1")

    @property
    def burst(self) -> int:
        """The bucket size in bytes."""
        if self.burst_bytes is not None:
            return self.burst_bytes
        if self.rate_bps is None:
            return 1 << 20
        return max(_MIN_BURST, int(self.rate_bps * _AUTO_BURST_S))


class _TokenBucket:
    """Tokens refill at the current shape's rate up to its burst; data waits for enough."""

    def __init__(self) -> None:
        self._tokens: float | None = None
        self._stamp = 0.0

    async def take(self, size: int, emulator: LinkEmulator, direction: Direction) -> None:
        loop = asyncio.get_running_loop()
        while True:
            shape = emulator.shape(direction)
            if shape.rate_bps is None:
                self._tokens = None
                return
            now = loop.time()
            burst = shape.burst
            if self._tokens is None:
                self._tokens = float(burst)
            else:
                self._tokens = min(burst, self._tokens + (now - self._stamp) * shape.rate_bps)
            self._stamp = now
            need = min(size, burst)  # a piece larger than a shrunk bucket runs it into debt
            if self._tokens >= need:
                self._tokens -= size
                return
            await asyncio.sleep(min((need - self._tokens) / shape.rate_bps, _RECHECK_S))


class LinkEmulator:
    """A shaping TCP proxy: clients connect to :attr:`port`, traffic goes to ``target``.

    Use it as an async context manager, or :func:`emulate_in_thread` from sync code.

    Args:
        target: The ``(host, port)`` to forward to.
        up: The shape of client → target.
        down: The shape of target → client.
        host: The address to listen on.
        port: The port to listen on; 0 lets the kernel pick.
        segment_bytes: The most read at once; a piece is at most this and the burst.
        seed: Seeds jitter and loss, for repeatable runs.
    """

    def __init__(
        self,
        target: tuple[str, int],
        *,
        up: Shape | None = None,
        down: Shape | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        segment_bytes: int = 65536,
        seed: int | None = None,
    ) -> None:
        self._target = target
        self._shapes: dict[Direction, Shape] = {"up": up or Shape(), "down": down or Shape()}
        self._lock = threading.Lock()
        self._host, self._port = host, port
        self._segment = segment_bytes
        self._random = random.Random(seed)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closing = False

    @property
    def port(self) -> int:
        """The port clients connect to.

        Raises:
            RuntimeError: the emulator is not started.
        """
        if self._server is None:
            raise RuntimeError("the link emulator is not started")
        return int(self._server.sockets[0].getsockname()[1])

    def shape(self, direction: Direction) -> Shape:
        """The current shape of one direction (thread-safe)."""
        with self._lock:
            return self._shapes[direction]

    def set_shape(self, *, up: Shape | None = None, down: Shape | None = None) -> None:
        """Change one or both directions while traffic flows (thread-safe)."""
        with self._lock:
            if up is not None:
                self._shapes["up"] = up
            if down is not None:
                self._shapes["down"] = down

    async def start(self) -> None:
        """Start listening.

        Raises:
            OSError: the port cannot be bound.
        """
        self._closing = False
        self._server = await asyncio.start_server(self._serve, self._host, self._port)

    async def close(self) -> None:
        """Stop listening and cut every connection."""
        self._closing = True
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> LinkEmulator:
        await self.start()
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _serve(
        self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await self._relay(client_in, client_out)
        except asyncio.CancelledError:
            # close() cuts connections on purpose; a connection callback that ends
            # cancelled makes asyncio (3.11) log an error, so end quietly then.
            if not self._closing:
                raise
        finally:
            client_out.close()
            self._tasks.discard(task)

    async def _relay(
        self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter
    ) -> None:
        """Connect to the target and shape both directions until both have ended."""
        try:
            target_in, target_out = await asyncio.open_connection(*self._target)
        except OSError:
            return  # the client sees its connection closed, as if refused
        directions: tuple[tuple[asyncio.StreamReader, asyncio.StreamWriter, Direction], ...] = (
            (client_in, target_out, "up"),
            (target_in, client_out, "down"),
        )
        try:
            # A reader and a writer per direction; if any fails, the group cancels the rest.
            async with asyncio.TaskGroup() as group:
                for source, sink, direction in directions:
                    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(_QUEUE_PIECES)
                    group.create_task(self._shape_into(source, queue, direction))
                    group.create_task(self._deliver(queue, sink))
        except* (OSError, asyncio.IncompleteReadError):
            pass  # either end went away: both are closed
        finally:
            target_out.close()

    async def _shape_into(
        self,
        source: asyncio.StreamReader,
        queue: asyncio.Queue[tuple[float, bytes]],
        direction: Direction,
    ) -> None:
        """Read ``source``, let each piece through the bucket, queue it with its release time."""
        loop = asyncio.get_running_loop()
        bucket = _TokenBucket()
        last_release = 0.0
        while data := await source.read(self._segment):
            view = memoryview(data)
            while view:
                size = min(len(view), max(1, self.shape(direction).burst // _PIECES_PER_BURST))
                piece, view = bytes(view[:size]), view[size:]
                await bucket.take(size, self, direction)
                # never before the piece ahead: jitter must not reorder the stream
                last_release = max(loop.time() + self._lateness(direction), last_release)
                await queue.put((last_release, piece))
        await queue.put((last_release, b""))  # end of stream, in its turn

    def _lateness(self, direction: Direction) -> float:
        """One piece's delay in seconds: delay, jitter, and an RTO if it is "lost"."""
        shape = self.shape(direction)
        delay = shape.delay_ms
        if shape.jitter_ms:
            delay = max(0.0, delay + self._random.uniform(-shape.jitter_ms, shape.jitter_ms))
        if shape.loss and self._random.random() < shape.loss:
            delay += shape.rto_ms
        return delay / 1000.0

    @staticmethod
    async def _deliver(
        queue: asyncio.Queue[tuple[float, bytes]], sink: asyncio.StreamWriter
    ) -> None:
        """Write each piece at its release time; half-close the sink at the end."""
        loop = asyncio.get_running_loop()
        while True:
            release, piece = await queue.get()
            wait = release - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not piece:
                if sink.can_write_eof():
                    sink.write_eof()
                return
            sink.write(piece)
            await sink.drain()


@contextlib.contextmanager
def emulate_in_thread(
    target: tuple[str, int],
    *,
    up: Shape | None = None,
    down: Shape | None = None,
    port: int = 0,
    seed: int | None = None,
    timeout_s: float = 10.0,
) -> Iterator[LinkEmulator]:
    """A :class:`LinkEmulator` on its own event loop in a background thread, for sync code.

    Yields:
        The running emulator; :meth:`LinkEmulator.set_shape` may be called from any thread.

    Raises:
        OSError: the port cannot be bound.
        TimeoutError: the emulator did not start or stop within ``timeout_s``.
    """
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="linkemu", daemon=True)
    thread.start()
    emulator = LinkEmulator(target, up=up, down=down, port=port, seed=seed)
    try:
        asyncio.run_coroutine_threadsafe(emulator.start(), loop).result(timeout_s)
        try:
            yield emulator
        finally:
            asyncio.run_coroutine_threadsafe(emulator.close(), loop).result(timeout_s)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout_s)
        loop.close()


SlowdownMethod = Literal["cgroup-cpu-quota", "scaled-time", "none"]
_CGROUP_ROOT = Path("/sys/fs/cgroup")
_PERIOD_US = 100_000


class DeviceSlowdown:
    """Make a process ``factor`` times slower, or say that its times will be scaled instead.

    With cgroup v2 and a delegated, writable ``cpu`` controller, a child group
    gets ``cpu.max = period/factor period``: at most ``1/factor`` of one CPU, so a
    single-threaded head runs ``factor`` times slower (pin the runtime to one
    thread; several threads would share the same quota). Otherwise — cgroup v1,
    as on this machine, or no write access — nothing is throttled and
    :meth:`device_ms` multiplies measured times by the factor. :attr:`method` and
    :meth:`describe` say which one ran.

    Args:
        factor: How many times slower the device is (1 = as fast as the machine).
        parent: The cgroup to create the child in; default: this process's own.
        name: The child group's name.

    Raises:
        ValueError: ``factor`` is below 1 or not finite.
    """

    def __init__(
        self, factor: float, *, parent: Path | None = None, name: str | None = None
    ) -> None:
        if not (math.isfinite(factor) and factor >= 1):
            raise ValueError(f"factor must be finite and >= 1, got {factor!r}")
        self.factor = factor
        self._group: Path | None = None
        self.method: SlowdownMethod
        self.reason: str
        if factor == 1:
            self.method, self.reason = "none", "factor 1: nothing to slow down"
            return
        try:
            self._group = self._make_group(parent, name or f"edgeskill-slow-{os.getpid()}")
        except OSError as error:
            self.method, self.reason = "scaled-time", f"no cgroup v2 CPU quota here: {error}"
        else:
            self.method, self.reason = "cgroup-cpu-quota", f"cpu.max in {self._group}"

    def _make_group(self, parent: Path | None, name: str) -> Path:
        """Create the child group with its quota.

        Raises:
            OSError: cgroup v2 or its cpu controller is not available or writable.
        """
        if parent is None:
            if not (_CGROUP_ROOT / "cgroup.controllers").exists():
                raise OSError(f"{_CGROUP_ROOT} is not a cgroup v2 mount (cgroup v1 or none)")
            parent = _CGROUP_ROOT / _own_cgroup().lstrip("/")
        controllers = (parent / "cgroup.controllers").read_text(encoding="ascii").split()
        if "cpu" not in controllers:
            raise OSError(f"the cpu controller is not delegated to {parent}")
        if not os.access(parent, os.W_OK):
            raise OSError(f"{parent} is not writable")
        group = parent / name
        group.mkdir(exist_ok=True)
        try:
            if not (group / "cpu.max").exists():
                (parent / "cgroup.subtree_control").write_text("+cpu", encoding="ascii")
            quota = max(1000, int(_PERIOD_US / self.factor))
            (group / "cpu.max").write_text(f"{quota} {_PERIOD_US}", encoding="ascii")
        except OSError:
            with contextlib.suppress(OSError):
                group.rmdir()
            raise
        return group

    def throttle(self, pid: int) -> None:
        """Put process ``pid`` under the quota (nothing to do when time is scaled).

        Raises:
            OSError: the process could not be moved into the group.
        """
        if self._group is not None:
            (self._group / "cgroup.procs").write_text(str(pid), encoding="ascii")

    def device_ms(self, measured_ms: float) -> float:
        """The device's time for something measured at ``measured_ms`` on this machine."""
        return measured_ms * self.factor if self.method == "scaled-time" else measured_ms

    def describe(self) -> str:
        """Which slowdown ran, in words, for a benchmark's report."""
        if self.method == "cgroup-cpu-quota":
            return f"{self.factor:g}x slower by a cgroup v2 CPU quota ({self.reason})"
        if self.method == "scaled-time":
            return f"{self.factor:g}x slower by scaling measured time ({self.reason})"
        return "not slowed down (factor 1)"

    def close(self) -> None:
        """Remove the group (it must hold no live process by then)."""
        if self._group is not None:
            with contextlib.suppress(OSError):
                self._group.rmdir()
            self._group = None

    def __enter__(self) -> DeviceSlowdown:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _own_cgroup() -> str:
    """This process's cgroup v2 path, from ``/proc/self/cgroup``.

    Raises:
        OSError: there is no cgroup v2 entry.
    """
    for line in Path("/proc/self/cgroup").read_text(encoding="ascii").splitlines():
        if line.startswith("0::"):
            return line[3:]
    raise OSError("this process has no cgroup v2 entry")
