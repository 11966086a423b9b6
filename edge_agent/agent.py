"""The edge agent: one per device, and as many per process as a fleet simulator wants.

Read :meth:`Agent.run` to see the agent: a session with the hub, an outbox
flusher, the reconciler, a workload feeding running skills and a telemetry
window, each a task started from one flat list. Everything the agent talks to
comes from outside (its outbox, how to open a transport, how to start a
skill, where inputs come from, the clock); :func:`edge_agent.wiring.build_agent`
wires the real ones. Nothing here is global and no thread outlives a call, so
thousands of agents can share one process and one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import random
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_agent import __version__
from edge_agent.config import AgentConfig
from edge_agent.desired_gate import DesiredGate
from edge_agent.drift_samples import SampleWatch
from edge_agent.drift_watch import DriftWatch
from edge_agent.errors import AgentError, RuntimeBackendError, TransportError
from edge_agent.eventloop import Wake
from edge_agent.hublink import HubLink
from edge_agent.installs import InstallStore
from edge_agent.metrics import InferenceCounter, start_agent_metrics
from edge_agent.outbox import NewEntry, Outbox, OutboxEntry, OutboxWriter
from edge_agent.profile import DeviceProfile
from edge_agent.reconciler import FetchTarget, Reconciler
from edge_agent.sandbox import SkillItemError, SkillProcess
from edge_agent.sandbox.launcher import SkillLauncher
from edge_agent.security_events import SecurityEvents
from edge_agent.split.runtime import SplitRuntime
from edge_agent.transport import AgentTransport
from edge_agent.workload import WindowStats, pace
from protos import decode_envelope, encode_envelope, kind_of, make_envelope, pb
from protos.envelope import now_ms
from protos.errors import ProtocolError
from skills.errors import FetchError, TrustError
from skills.manifest import Manifest
from skills.trust.director import InstructionError
from skills.trust.offer import MetadataOffer, from_message

if TYPE_CHECKING:
    from edge_agent.adapters import Source

__all__ = ["Agent", "HubLink", "TransportFactory"]

log = logging.getLogger(__name__)

#: Makes a new, unconnected transport to the hub; called once per session.
TransportFactory = Callable[[], AgentTransport]

_FLUSH_BATCH = 200
#: The outbox mark holding the last telemetry window's sequence number.
TELEMETRY_SEQ = "telemetry.seq"
#: How often a quiet outbox loop wakes with nothing to wake it (a new entry, an ack does).
_QUIET_FLUSH_RECHECK_S = 30.0
#: Shortest sleep of the flush loop before an entry's ack is overdue (timer jitter).
_MIN_FLUSH_WAIT_S = 0.05
#: How often the workload looks for a skill to feed when no state change woke it.
_WORKLOAD_RECHECK_S = 5.0
#: The first wait before reconnecting; it doubles up to ``config.max_backoff_s``.
_FIRST_BACKOFF_S = 0.2
#: How often the first metadata refresh looks for a session to run on.
_FIRST_REFRESH_POLL_S = 0.5
#: Share of a reconnect wait, and of a refresh period, drawn off at random per device, so a
#: fleet that lost its hub, or booted, together does not come back in lockstep.
_RECONNECT_JITTER = 0.5
_REFRESH_JITTER = 0.1
#: Security events of one kind and reason go up at most once per window (with a count).
_EVENT_WINDOW_S = 1.0
#: Seconds the agent's modules get to end once cancelled.
_STOP_GRACE_S = 10.0
#: Drift samples are optional: none join an outbox already this full (a hub not acking,
#: a long outage), so they never take the place of telemetry in it.
_SAMPLES_BACKLOG = 100


def jittered(seconds: float, spread: float, rng: random.Random) -> float:
    """``seconds`` less a random share of it of up to ``spread``: never longer."""
    return seconds * (1.0 - spread * rng.random())


async def _cancel_all(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel the agent's modules and wait (bounded) for them to end.

    A module that does not end within ``_STOP_GRACE_S`` (a cancellation lost in a
    library) is logged with where it hangs and left behind, so stopping the agent
    never hangs: its skills are still stopped and its outbox still closed.
    """
    for task in tasks:
        task.cancel()
    _, pending = await asyncio.wait(tasks, timeout=_STOP_GRACE_S)
    for task in pending:
        where = io.StringIO()
        task.print_stack(file=where)
        log.error(
            "agent module %s did not stop within %g s; left behind at:\n%s",
            task.get_name(),
            _STOP_GRACE_S,
            where.getvalue().rstrip(),
        )


class Agent:
    """Connects a device to its hub and keeps its skills in the desired state.

    Args:
        config: The agent's settings.
        profile: The device's hardware profile (sent when registering).
        outbox: Durable store of everything sent up; :meth:`run` closes it at the end.
        installs: The installed skill versions.
        fetch_target: Fetches and verifies a bundle by TUF target name (blocking).
        launcher: Starts and health-checks a skill's control code.
        transport_factory: Makes a new transport to the hub for each session.
        link: Where ``fetch_target`` finds the hub session; a fresh one by default.
        source: Inputs fed to every running skill (an inputs file: each skill its own), or
            ``None``.
        clock: Monotonic seconds, for uptime, resend timeouts and retry backoff.
        refresh_metadata: Refreshes the TUF metadata without fetching a target (blocking;
            raises TrustError when the hub's metadata is expired, rolled back or badly
            signed); run every ``config.metadata_refresh_s``. None: no periodic refresh.
        metadata_age: Seconds since the metadata chain last verified, by a refresh or a
            download (``TrustClient.verified_age_s``; None: never). The periodic refresh
            counts from then, so a fleet that just installed does not refresh again at
            once. None: it counts from its own last refresh.
        offer_metadata: Keeps the TUF metadata the hub sends beside a desired state for
            the next ``fetch_target`` (``TrustClient.offer``). None: offers are ignored.
    """

    def __init__(
        self,
        config: AgentConfig,
        *,
        profile: DeviceProfile,
        outbox: Outbox,
        installs: InstallStore,
        fetch_target: FetchTarget,
        launcher: SkillLauncher,
        transport_factory: TransportFactory,
        link: HubLink | None = None,
        source: Source | None = None,
        clock: Callable[[], float] = time.monotonic,
        refresh_metadata: Callable[[], object] | None = None,
        metadata_age: Callable[[], float | None] | None = None,
        offer_metadata: Callable[[MetadataOffer], object] | None = None,
    ) -> None:
        self.config = config
        self.profile = profile
        self.outbox = outbox
        self.installs = installs
        self.link = link or HubLink(config.max_bundle_bytes)
        #: Split and joint inference: the link estimate and a broker per skill version.
        self.splits = SplitRuntime(lambda: self.link.transport, clock=clock)
        self._wake_reconcile = Wake()
        self.reconciler = Reconciler(
            installs,
            fetch_target,
            launcher,
            self._changed,
            clock=clock,
            on_event=self.security_event,
            on_started=self._skill_started,
            on_stopped=self._skill_stopped,
            on_fetched=self._wake_reconcile.set,
        )
        #: Only the director's signed instructions get through (plain ones when insecure).
        self.gate = DesiredGate(
            config.state_dir,
            config.device_id,
            director_key=config.director_key,
            insecure=config.insecure,
        )
        #: Refusals and containments, counted and reported up.
        self.security = SecurityEvents()
        self._refresh_metadata = refresh_metadata
        self._metadata_age = metadata_age
        #: Draws of the reconnect and refresh waits (see :func:`jittered`).
        self._rng = random.Random()
        self._offer_metadata = offer_metadata
        self._wake_events = Wake()
        self.heartbeat_s = 5.0
        # Set when the hub's Welcome changes the interval, so a sleeping heartbeat
        # loop takes the new one at once instead of after the default 5 s.
        self._beat_changed = Wake()
        #: Set when a skill's state changes: the workload looks for something to feed.
        self._skills_changed = Wake()
        self.windows: dict[tuple[str, str], WindowStats] = {}
        #: Drift against each running version's bundled reference, per telemetry window.
        self.drift = DriftWatch(clock)
        #: Capped low-confidence inputs, per window, of the versions whose deployment asks.
        self.samples = SampleWatch(config.drift_sample_caps)
        self.drift_samples_skipped = 0
        #: Running totals exported as metrics.
        self.inference_counts = InferenceCounter()
        self.outbox_dropped_total = 0
        self._writer = OutboxWriter(outbox)
        self._open_transport = transport_factory
        self._source = source
        self._clock = clock
        self._wake_flush = Wake()
        self._report_due = True
        self._started = clock()
        self._in_flight: dict[str, float] = {}
        #: Whether the outbox may hold entries not yet sent (the last pass failed or was full).
        self._flush_more = True
        #: Periodic flushes skipped because nothing could be waiting to go.
        self.flushes_skipped = 0
        # The number lives in the outbox; earlier agents kept it in a file of its own.
        self._seq = max(outbox.counter(TELEMETRY_SEQ), _read_int(config.state_dir / TELEMETRY_SEQ))

    @property
    def desired(self) -> pb.DesiredState | None:
        """The desired state being followed (the last one the gate accepted)."""
        return self.gate.desired

    @property
    def transport(self) -> AgentTransport | None:
        """The connected transport, or ``None`` between sessions."""
        return self.link.transport

    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set.

        Raises:
            AgentError: the metrics address (``config.metrics_bind``) is malformed or taken.
        """
        if self.config.insecure:
            log.warning(
                "INSECURE MODE: following unsigned desired state; anyone who can reach "
                "the hub's channel can command this device"
            )
        cleaned = await asyncio.to_thread(self.installs.recover)
        if cleaned:
            log.info("recovered from an interrupted install: %s", ", ".join(cleaned))
        modules: list[Callable[[], Coroutine[Any, Any, None]]] = [
            self._session,
            self._reconcile_loop,
            self._flush_loop,
            self._workload,
            self._telemetry_loop,
            self._events_loop,
            self._refresh_loop,
            self.splits.ping_forever,
        ]
        bind = self.config.metrics_bind
        metrics = start_agent_metrics(self, bind) if bind else None
        tasks = [asyncio.create_task(self._supervise(m), name=m.__name__) for m in modules]
        try:
            await stop.wait()
        finally:
            await _cancel_all(tasks)
            if metrics is not None:
                await asyncio.to_thread(metrics.stop)
            await self.reconciler.shutdown()
            await self._flush_windows()
            await self._send_events()
            await self._writer.settle()
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
        """Connect, run the session until it ends, wait, and connect again.

        Each failed attempt or lost session is one log line (its traceback only at
        debug level); the wait doubles up to ``config.max_backoff_s`` and starts
        afresh after a session that connected, less up to half of it drawn at random.
        """
        backoff = _FIRST_BACKOFF_S
        while True:
            transport: AgentTransport | None = None
            connected = False
            pause = backoff
            try:
                transport = self._open_transport()
                await transport.connect(self._register())
                connected, backoff = True, _FIRST_BACKOFF_S
                self.link.attach(transport)
                self._in_flight.clear()
                self._flush_more = True  # what was in flight goes again: read the outbox
                self._report_due = True
                self._wake_flush.set()
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(self._heartbeat(transport))
                    tg.create_task(self._receive(transport))
            except* TransportError as group:
                what = "hub connection lost" if connected else "cannot connect to the hub"
                error = group.exceptions[0]
                trace = error if log.isEnabledFor(logging.DEBUG) else None
                pause = jittered(backoff, _RECONNECT_JITTER, self._rng)
                log.info("%s: %s; trying again in %.1f s", what, error, pause, exc_info=trace)
            finally:
                self.link.detach()
                if transport is not None:
                    await transport.close()
            await asyncio.sleep(pause)
            backoff = min(self.config.max_backoff_s, backoff * 2)

    async def _receive(self, transport: AgentTransport) -> None:
        while True:
            env = await transport.receive()
            kind = kind_of(env)
            if kind in ("signed_desired", "desired"):
                if kind == "signed_desired":
                    accepted = self._on_signed(env.signed_desired.instruction)
                else:
                    accepted = self._on_plain(env.desired)
                if accepted:
                    if self._offer_metadata is not None and env.HasField("metadata"):
                        self._offer_metadata(from_message(env.metadata))
                    self._follow()
            elif kind == "ack":
                # Deleted with the next commit (no disk sync of its own), sent no more.
                self._writer.ack(list(env.ack.ids))
                for msg_id in env.ack.ids:
                    self._in_flight.pop(msg_id, None)
                if self._flush_more:  # a backlog: what the acks made room for goes now
                    self._wake_flush.set()
            elif kind == "welcome":
                self.heartbeat_s = max(1.0, float(env.welcome.heartbeat_s or 5))
                self._beat_changed.set()

    def _on_signed(self, data: bytes) -> bool:
        """Whether the gate takes a signed instruction as the new desired state."""
        try:
            return self.gate.accept_signed(data) is not None
        except InstructionError as exc:
            self.security_event("desired-refused", exc.reason, str(exc), "signed_desired")
            return False

    def _on_plain(self, desired: pb.DesiredState) -> bool:
        """Whether the gate takes a plain desired state (insecure mode only)."""
        try:
            return self.gate.accept_plain(desired) is not None
        except InstructionError as exc:
            detail = f"{exc} (generation {desired.generation})"
            self.security_event("desired-refused", exc.reason, detail, "desired")
            return False

    def _follow(self) -> None:
        self._report_due = True
        self._wake_reconcile.set()

    # -- security events ----------------------------------------------------------

    def security_event(self, kind: str, reason: str, detail: str = "", subject: str = "") -> None:
        """Count a refusal or containment now and report it to the hub (coalesced).

        Safe to call from the event loop only (the reconciler's ``on_event``).
        """
        self.security.record(kind, reason, detail, subject)
        count = self.security.totals[(kind, reason)]
        if count == 1 or count % 1000 == 0:  # visible in the log, but a flood cannot flood it
            log.warning("refused (%s, %s; %d so far): %s", kind, reason, count, detail)
        self._wake_events.set()

    async def _events_loop(self) -> None:
        while True:
            await self._wake_events.wait()
            self._wake_events.clear()
            await self._send_events()
            await asyncio.sleep(_EVENT_WINDOW_S)  # what comes meanwhile goes up as one event

    async def _send_events(self) -> None:
        for event in self.security.drain():
            await self.enqueue(make_envelope(self.config.device_id, security_event=event))

    async def _refresh_loop(self) -> None:
        refresh = self._refresh_metadata
        if refresh is None:
            return
        # The first refresh runs as soon as a session is up, so a trusted root that does
        # not fit this hub is reported (and logged, once) at start, not at the first install.
        every = self.config.metadata_refresh_s
        wait = min(_FIRST_REFRESH_POLL_S, every)
        while True:
            await asyncio.sleep(wait)
            if self.transport is None:
                continue  # offline: nothing to compare with
            age = self._metadata_age() if self._metadata_age is not None else None
            if age is not None and 0 <= age < every:
                # A download verified the chain since: the next refresh is due a period
                # after it (a fleet in the middle of an upgrade would refresh for nothing).
                wait = every - age
                continue
            wait = jittered(every, _REFRESH_JITTER, self._rng)
            try:
                await asyncio.to_thread(refresh)
            except TrustError as exc:
                self.security_event("metadata-stale", _stale_reason(str(exc)), str(exc), "metadata")
            except FetchError as exc:
                log.info("metadata refresh failed: %s", exc)

    async def _heartbeat(self, transport: AgentTransport) -> None:
        while True:
            self._beat_changed.clear()  # before the send: a Welcome during it is not lost
            uptime = int(self._clock() - self._started)
            await transport.send(
                make_envelope(self.config.device_id, heartbeat=pb.Heartbeat(uptime_s=uptime))
            )
            await self._beat_changed.wait(self.heartbeat_s)

    # -- outbox: everything sent up is kept until the hub acknowledges it -------

    async def enqueue(self, env: pb.Envelope, marks: Mapping[str, int] | None = None) -> None:
        """Store a message durably for sending; it survives restarts and outages.

        Returns once the message is committed (with ``marks``, see
        :meth:`Outbox.put_many`); only then may it be sent.

        Raises:
            OutboxError: the message is malformed or too large, or the outbox failed.
        """
        await self._writer.put(env.id, kind_of(env), encode_envelope(env), marks)
        self._wake_flush.set()

    async def _flush_loop(self) -> None:
        while True:
            # Quiet (nothing awaiting its ack, nothing left over), only an event wakes it.
            await self._wake_flush.wait(self._flush_wait_s())
            woken = self._wake_flush.is_set()
            self._wake_flush.clear()
            transport = self.transport
            if transport is None:
                continue
            # A quiet wake with nothing awaiting its ack and nothing left over from the
            # last pass has nothing to send: the outbox is not read (a new entry, an ack
            # and a new session each wake this loop). Idle, an agent then reads its flash
            # only when it has something to say.
            if not woken and not self._in_flight and not self._flush_more:
                self.flushes_skipped += 1
                continue
            with contextlib.suppress(TransportError):
                await self._flush(transport)

    def _flush_wait_s(self) -> float:
        """How long the flush loop sleeps unless woken (an entry, an ack, a session).

        With entries awaiting their acks and nothing else to send, a pass before the
        oldest is overdue sends nothing: the loop sleeps until then. Waking every
        second instead was, in a 10,000-device upgrade whose acks came slowly, ten
        thousand idle passes a second.
        """
        if self._flush_more:  # a backlog read in part: more goes as acks make room
            return 1.0
        if self._in_flight:
            due = min(self._in_flight.values()) + self.config.ack_timeout_s
            return max(_MIN_FLUSH_WAIT_S, due - self._clock())
        return _QUIET_FLUSH_RECHECK_S

    async def _flush(self, transport: AgentTransport) -> None:
        # Only committed entries are sent, so nothing leaves before it is durable.
        now = self._clock()
        committed = self._writer.take_committed()
        overdue = any(now - sent >= self.config.ack_timeout_s for sent in self._in_flight.values())
        if committed is not None and not self._flush_more and not overdue:
            # Everything older was sent in this session and is awaiting its ack in time:
            # what the writer committed since is all there is to send, without a read.
            self._flush_more = True  # until all of them are sent
            await self._send_entries(transport, committed, now)
            self._flush_more = False
            return
        self._flush_more = True  # until this pass has sent all it read
        await self._writer.settle()  # acknowledged entries leave the outbox before the read
        entries = await asyncio.to_thread(self.outbox.pending, _FLUSH_BATCH)
        await self._send_entries(transport, entries, now)
        self._flush_more = len(entries) >= _FLUSH_BATCH  # a full read: more may wait

    async def _send_entries(
        self, transport: AgentTransport, entries: Sequence[OutboxEntry | NewEntry], now: float
    ) -> None:
        for entry in entries:
            sent = self._in_flight.get(entry.msg_id)
            if sent is not None and now - sent < self.config.ack_timeout_s:
                continue
            if self._writer.is_acked(entry.msg_id):  # acked since it was read
                continue
            try:
                env = decode_envelope(entry.payload)
            except ProtocolError:
                # Unreadable: it can never be sent.
                await asyncio.to_thread(self.outbox.ack, [entry.msg_id])
                continue
            await transport.send(env)
            # Its ack is overdue a timeout after it went, not after the pass began: a pass
            # that waited on earlier sends would otherwise send it again a little early.
            self._in_flight[entry.msg_id] = self._clock()

    # -- reconcile --------------------------------------------------------------

    def _changed(self) -> None:
        self._report_due = True
        self._skills_changed.set()

    async def _reconcile_loop(self) -> None:
        while True:
            await self.reconciler.reconcile(self.desired)
            if self._report_due:
                self._report_due = False
                gen = self.desired.generation if self.desired else 0
                report = self.reconciler.report(gen)
                await self.enqueue(make_envelope(self.config.device_id, reported=report))
            await self._wake_reconcile.wait(self.config.reconcile_interval_s)
            self._wake_reconcile.clear()

    # -- workload and telemetry -------------------------------------------------

    def _skill_started(self, name: str, version: str, proc: SkillProcess) -> None:
        """Watch a started skill's drift; serve its split and joint models (if it has any)."""
        skill_dir = getattr(proc, "skill_dir", None)  # a simulated skill has no folder
        if isinstance(skill_dir, Path):
            self.drift.attach(name, version, skill_dir, proc.manifest)
        if isinstance(getattr(proc, "manifest", None), Manifest):
            self.samples.attach(name, version, proc.manifest, self._deployment_config(name))
        if not isinstance(proc, SkillProcess):  # a lighter stand-in (simulator, tests)
            return
        try:
            self.splits.attach(name, version, proc)
        except RuntimeBackendError as exc:  # it runs, but wholly on the device
            log.warning("skill %s %s: split inference off: %s", name, version, exc)

    def _skill_stopped(self, name: str) -> None:
        self.splits.detach(name)
        self.drift.detach(name)
        self.samples.detach(name)

    def _deployment_config(self, name: str) -> dict[str, str]:
        """The desired state's config of a skill (without its bundle's defaults)."""
        specs = self.desired.skills if self.desired else ()
        return next((dict(s.config) for s in specs if s.name == name), {})

    async def _workload(self) -> None:
        source = self._source
        if source is None:
            return
        from edge_agent.adapters import source_for  # noqa: PLC0415 - media decoders, numpy

        done: set[tuple[str, str]] = set()
        while True:
            self._skills_changed.clear()  # before looking: a change from now on wakes the wait
            fed = False
            for name, proc in self.reconciler.running().items():
                key = (name, self.reconciler.version_of(name))
                own = source_for(source, name)  # an inputs file feeds each skill its own
                if own is not None and (key not in done or self.config.source_loop):
                    await self._feed(key, proc, own)
                    done.add(key)
                    fed = True
            if not fed:
                # Nothing to feed until a skill starts (the reconciler says so), with a
                # recheck in case: not a poll of every agent five times a second.
                await self._skills_changed.wait(_WORKLOAD_RECHECK_S)

    async def _feed(self, key: tuple[str, str], proc: SkillProcess, source: Source) -> None:
        started = time.monotonic()
        for i in range(len(source)):
            item, label = source.item(i)
            try:
                if getattr(proc, "answers_inline", False):  # a stand-in that never blocks
                    result, ms = proc.process(item)
                else:  # a control process answers over its pipe: wait in a worker thread
                    result, ms = await asyncio.to_thread(proc.process, item)
            except SkillItemError:  # the skill raised on this item and serves on
                self.windows.setdefault(key, WindowStats(*key)).record_error()
            except AgentError as exc:
                log.warning("skill %s stopped taking input: %s", key[0], exc)
                return
            else:
                window = self.windows.setdefault(key, WindowStats(*key))
                # A lighter stand-in (the simulator's, tests') may not report its calls.
                infers = proc.drain_infers() if isinstance(proc, SkillProcess) else []
                window.record(result, ms, label, infers[-1] if infers else ())
                self.drift.observe(key, result, label)
                self.samples.observe(key, item, result, label, now_ms())
                self.splits.learn_device(*key, (r for item in infers for r in item))
                window.add_events(len(proc.drain_events()))
                self.inference_counts.add(*key)
            await asyncio.sleep(pace(started, i + 1, self.config.source_rate_hz))

    async def _telemetry_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.telemetry_window_s)
            await self._flush_windows()

    async def _flush_windows(self) -> None:
        # Both closed together, before any await: a result lands in one window of each.
        windows, self.windows = self.windows, {}
        drift = self.drift.flush_all()
        samples = self.samples.flush_all()
        for key, stats in windows.items():
            if stats.inferences:
                dropped = 0
                if self.outbox.has_dropped:  # usually not: then no database read at all
                    dropped = await asyncio.to_thread(self.outbox.take_dropped)
                self.outbox_dropped_total += dropped
                gauges = {**self.splits.metrics(*key), **drift.get(key, {})}
                msg = stats.to_message(dropped=dropped, gauges=gauges)
                # A per-device sequence number lets the hub (and tests) see gaps and repeats;
                # it is stored with the window that carries it, in one commit.
                self._seq += 1
                msg.metrics["seq"] = float(self._seq)
                env = make_envelope(self.config.device_id, telemetry=msg)
                await self.enqueue(env, marks={TELEMETRY_SEQ: self._seq})
        if samples and await asyncio.to_thread(len, self.outbox) >= _SAMPLES_BACKLOG:
            self.drift_samples_skipped += sum(len(m.samples) for m in samples)
            samples = []
        for message in samples:  # one envelope per version, after its telemetry window
            await self.enqueue(make_envelope(self.config.device_id, drift_samples=message))


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text(encoding="ascii").strip() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def _stale_reason(message: str) -> str:
    """A short reason for a failed metadata refresh, from the trust client's message."""
    for word, reason in (
        ("expired", "expired"),
        ("rollback", "rollback"),
        ("signature", "bad-signature"),
    ):
        if word in message:
            return reason
    return "invalid"
