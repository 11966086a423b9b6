"""The edge agent: one process per device.

Read :meth:`Agent.run` to see the agent: a session with the hub, an outbox
flusher, the reconciler, a workload feeding running skills and a telemetry
window, each a task started from one flat list.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from edge_agent import __version__
from edge_agent.config import AgentConfig
from edge_agent.errors import AgentError, TransportError
from edge_agent.installs import InstallStore
from edge_agent.metrics import InferenceCounter, start_agent_metrics
from edge_agent.outbox import Outbox
from edge_agent.profile import DeviceProfile, detect_profile
from edge_agent.reconciler import Reconciler
from edge_agent.sandbox import SkillProcess
from edge_agent.transport import AgentTransport, open_transport
from edge_agent.workload import ReplaySource, WindowStats, pace
from protos import decode_envelope, encode_envelope, kind_of, make_envelope, pb
from protos.errors import ProtocolError
from skills.errors import FetchError
from skills.trust import TrustClient

log = logging.getLogger(__name__)

_FETCH_TIMEOUT_S = 600.0


class Agent:
    """Connects a device to its hub and keeps its skills in the desired state."""

    def __init__(self, config: AgentConfig, profile: DeviceProfile | None = None) -> None:
        self.config = config
        self.profile = profile or detect_profile(config.board)
        state = config.state_dir
        state.mkdir(parents=True, exist_ok=True)
        self.outbox = Outbox(state / "outbox.db")
        self.installs = InstallStore(state / "installs")
        root = config.trusted_root.read_bytes() if config.trusted_root else None
        self.trust = TrustClient(state / "trust", self._fetch_sync, trusted_root=root)
        self.reconciler = Reconciler(
            self.installs,
            self.trust.fetch_target,
            self.profile.targets,
            state / "logs",
            self._changed,
            self.profile.precisions,
        )
        self.desired: pb.DesiredState | None = _load_desired(state / "desired.bin")
        self.transport: AgentTransport | None = None
        self.heartbeat_s = 5.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake_reconcile = asyncio.Event()
        self._wake_flush = asyncio.Event()
        self._report_due = True
        self._started = time.monotonic()
        self._in_flight: dict[str, float] = {}
        self.windows: dict[tuple[str, str], WindowStats] = {}
        self._seq = _read_int(state / "telemetry.seq")
        #: Running totals exported as metrics.
        self.inference_counts = InferenceCounter()
        self.outbox_dropped_total = 0

    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set.

        Raises:
            AgentError: the metrics address (``config.metrics_bind``) is malformed or taken.
        """
        self._loop = asyncio.get_running_loop()
        cleaned = await asyncio.to_thread(self.installs.recover)
        if cleaned:
            log.info("recovered from an interrupted install: %s", ", ".join(cleaned))
        modules: list[Callable[[], Coroutine[Any, Any, None]]] = [
            self._session,
            self._reconcile_loop,
            self._flush_loop,
            self._workload,
            self._telemetry_loop,
        ]
        bind = self.config.metrics_bind
        metrics = start_agent_metrics(self, bind) if bind else None
        tasks = [asyncio.create_task(self._supervise(m), name=m.__name__) for m in modules]
        try:
            await stop.wait()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if metrics is not None:
                await asyncio.to_thread(metrics.stop)
            await self.reconciler.shutdown()
            self._flush_windows()
            self.outbox.close()

    async def _supervise(self, module: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run one module for the agent's lifetime, restarting it after a bug or a fault."""
        while True:
            try:
                await module()
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("agent module %s failed; restarting it in 1 s", module.__name__)
                await asyncio.sleep(1.0)

    # -- session with the hub -------------------------------------------------

    def _register(self) -> pb.Envelope:
        p = self.profile
        profile = pb.HardwareProfile(
            arch=p.arch,
            accelerator=p.accelerator,
            board=p.board,
            targets=list(p.targets),
            cpu_count=p.cpu_count,
            memory_bytes=p.memory_bytes,
        )
        gen = self.desired.generation if self.desired else 0
        reg = pb.Register(
            labels=dict(self.config.labels),
            profile=profile,
            agent_version=__version__,
            installed_generation=gen,
        )
        return make_envelope(self.config.device_id, register=reg)

    async def _session(self) -> None:
        backoff = 0.2
        while True:
            transport = open_transport(
                self.config.hub_url,
                self.config.device_id,
                ca=self.config.tls_ca,
                cert=self.config.tls_cert,
                key=self.config.tls_key,
            )
            try:
                await transport.connect(self._register())
                self.transport = transport
                self._in_flight.clear()
                self._report_due = True
                self._wake_flush.set()
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(self._heartbeat(transport))
                    tg.create_task(self._receive(transport))
            except* TransportError as group:
                log.info("hub connection lost: %s", group.exceptions[0])
            finally:
                self.transport = None
                await transport.close()
            await asyncio.sleep(backoff)
            backoff = min(self.config.max_backoff_s, backoff * 2)

    async def _receive(self, transport: AgentTransport) -> None:
        while True:
            env = await transport.receive()
            kind = kind_of(env)
            if kind == "desired":
                self._on_desired(env.desired)
            elif kind == "ack":
                acked = await asyncio.to_thread(self.outbox.ack, list(env.ack.ids))
                for msg_id in env.ack.ids:
                    self._in_flight.pop(msg_id, None)
                if acked:
                    self._wake_flush.set()
            elif kind == "welcome":
                self.heartbeat_s = max(1.0, float(env.welcome.heartbeat_s or 5))

    def _on_desired(self, desired: pb.DesiredState) -> None:
        if self.desired is not None and desired.generation < self.desired.generation:
            return  # an old message, delivered late
        self.desired = desired
        _save_desired(self.config.state_dir / "desired.bin", desired)
        self._report_due = True
        self._wake_reconcile.set()

    async def _heartbeat(self, transport: AgentTransport) -> None:
        while True:
            uptime = int(time.monotonic() - self._started)
            await transport.send(
                make_envelope(self.config.device_id, heartbeat=pb.Heartbeat(uptime_s=uptime))
            )
            await asyncio.sleep(self.heartbeat_s)

    def _fetch_sync(self, path: str, max_bytes: int) -> bytes:
        """Fetch a hub file from a worker thread (the TUF client is synchronous).

        Raises:
            FileNotFoundError: the hub has no such file.
            FetchError: not connected, or the transfer failed.
        """
        transport, loop = self.transport, self._loop
        if transport is None or loop is None:
            raise FetchError("not connected to the hub")
        cap = min(max_bytes, self.config.max_bundle_bytes)
        future = asyncio.run_coroutine_threadsafe(transport.fetch(path, cap), loop)
        try:
            return future.result(_FETCH_TIMEOUT_S)
        except TransportError as exc:
            raise FetchError(str(exc)) from exc
        except TimeoutError as exc:
            future.cancel()
            raise FetchError(f"fetch of {path} timed out") from exc

    # -- outbox: everything sent up is kept until the hub acknowledges it -------

    def enqueue(self, env: pb.Envelope) -> None:
        """Store a message durably for sending; it survives restarts and outages."""
        self.outbox.put(env.id, kind_of(env), encode_envelope(env))
        self._wake_flush.set()

    async def _flush_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake_flush.wait(), 1.0)
            self._wake_flush.clear()
            transport = self.transport
            if transport is None:
                continue
            with contextlib.suppress(TransportError):
                await self._flush(transport)

    async def _flush(self, transport: AgentTransport) -> None:
        now = time.monotonic()
        for entry in await asyncio.to_thread(self.outbox.pending, 200):
            sent = self._in_flight.get(entry.msg_id)
            if sent is not None and now - sent < self.config.ack_timeout_s:
                continue
            try:
                env = decode_envelope(entry.payload)
            except ProtocolError:
                await asyncio.to_thread(
                    self.outbox.ack, [entry.msg_id]
                )  # unreadable: never sendable
                continue
            await transport.send(env)
            self._in_flight[entry.msg_id] = now

    # -- reconcile --------------------------------------------------------------

    def _changed(self) -> None:
        self._report_due = True

    async def _reconcile_loop(self) -> None:
        while True:
            await self.reconciler.reconcile(self.desired)
            if self._report_due:
                self._report_due = False
                gen = self.desired.generation if self.desired else 0
                self.enqueue(
                    make_envelope(self.config.device_id, reported=self.reconciler.report(gen))
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._wake_reconcile.wait(), self.config.reconcile_interval_s
                )
            self._wake_reconcile.clear()

    # -- workload and telemetry -------------------------------------------------

    async def _workload(self) -> None:
        if self.config.source is None:
            return
        source = await asyncio.to_thread(ReplaySource.load, self.config.source)
        done: set[tuple[str, str]] = set()
        while True:
            fed = False
            for name, proc in self.reconciler.running().items():
                key = (name, self.reconciler.version_of(name))
                if key not in done or self.config.source_loop:
                    await self._feed(key, proc, source)
                    done.add(key)
                    fed = True
            if not fed:
                await asyncio.sleep(0.2)

    async def _feed(self, key: tuple[str, str], proc: SkillProcess, source: ReplaySource) -> None:
        started = time.monotonic()
        for i in range(len(source)):
            item, label = source.item(i)
            try:
                result, ms = await asyncio.to_thread(proc.process, item)
            except AgentError as exc:
                log.warning("skill %s stopped taking input: %s", key[0], exc)
                return
            window = self.windows.setdefault(key, WindowStats(*key))
            window.record(result, ms, label)
            self.inference_counts.add(*key)
            await asyncio.sleep(pace(started, i + 1, self.config.source_rate_hz))

    async def _telemetry_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.telemetry_window_s)
            self._flush_windows()

    def _flush_windows(self) -> None:
        windows, self.windows = self.windows, {}
        for stats in windows.values():
            if stats.inferences:
                dropped = self.outbox.take_dropped()
                self.outbox_dropped_total += dropped
                msg = stats.to_message(dropped=dropped)
                # A per-device sequence number lets the hub (and tests) see gaps and repeats.
                self._seq += 1
                _write_int(self.config.state_dir / "telemetry.seq", self._seq)
                msg.metrics["seq"] = float(self._seq)
                self.enqueue(make_envelope(self.config.device_id, telemetry=msg))


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text(encoding="ascii").strip() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def _write_int(path: Path, value: int) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(str(value), encoding="ascii")
    tmp.replace(path)


def _load_desired(path: Path) -> pb.DesiredState | None:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    desired = pb.DesiredState()
    try:
        desired.ParseFromString(data)
    except Exception:
        return None
    return desired


def _save_desired(path: Path, desired: pb.DesiredState) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(desired.SerializeToString())
    tmp.replace(path)
