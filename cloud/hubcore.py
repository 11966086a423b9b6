"""What the hub does with device messages, whichever transport carried them.

The gRPC and MQTT servers are thin adapters: they turn bytes into envelopes
and back, and hand each device's traffic to a :class:`~cloud.session.DeviceSession`
made by :meth:`HubCore.session`. The session checks, deduplicates, counts
drops and acknowledges; :class:`HubCore` holds what sessions share (the store,
the telemetry batcher, the desired-state notifier, the counters, the caches of
known devices and seen message ids). All device state lives in the store, so
any number of hub processes can serve the same fleet.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass

from cloud.batched_reads import BatchedReads
from cloud.desired_watch import DesiredNotifier
from cloud.director import HubDirector, signed_envelope
from cloud.drift_samples import DEFAULT_CAPS as DEFAULT_SAMPLE_CAPS
from cloud.drift_samples import SampleCaps, samples_from_wire
from cloud.errors import NotFoundError, StoreError, ValidationError
from cloud.fetch_serving import FileChunks, fetch_error_code, open_repository_file
from cloud.presence import DEFAULT_HEARTBEAT_S, heartbeat_seconds
from cloud.selectors import parse_labels
from cloud.session import ACKED_KINDS, DeviceSession, DropReason, Lru, ack_envelope
from cloud.store import SkillStatusRecord, Store
from cloud.store.drift import KEEP_SAMPLES
from cloud.store.events import EVENT_DEVICE, EVENT_SECURITY, NewEvent
from cloud.store.state import ReportItem
from cloud.tail_serving import TailRefusedError, TailServer, TailSettings
from cloud.telemetry_batcher import BatcherSettings, GroupCommit, TelemetryBatcher
from cloud.wire import (
    desired_envelope,
    desired_revision,
    device_profile,
    security_event_record,
    skill_status_records,
    telemetry_record,
)
from protos import kind_of, make_envelope, pb
from protos.envelope import now_ms
from protos.errors import ProtocolError
from protos.limits import DEVICE_ID_PATTERN, MAX_DEVICE_LABELS, MAX_REPORTED_SKILLS
from skills.trust import TrustRepository
from skills.trust.offer import offer_message, read_offer

__all__ = [
    "HubCore",
    "HubLimits",
    "Loop",
    "check_device_id",
    "desired_envelope",
    "fetch_error_code",
    "running",
    "telemetry_record",
]

log = logging.getLogger(__name__)

DEVICE_ID_RE = re.compile(rf"^{DEVICE_ID_PATTERN}$")
#: A named long-running coroutine the hub's control-loop host keeps running.
Loop = tuple[str, Callable[[], Awaitable[None]]]
_DESIRED_BATCH = 500
#: Most (kind, reason) pairs of device security events counted apart; the rest are "other".
_MAX_EVENT_SERIES = 256
#: Seconds heartbeats and connection news gather before they are written together, at
#: most; never more than :data:`HEARD_LINGER_SHARE` of the heartbeat interval.
HEARD_LINGER_S = 0.5
#: The share of a heartbeat interval a heartbeat may wait for its batch. A device counts
#: as online while its last stored beat is at most two intervals old, so the wait must
#: leave it most of the second: at a one-second interval a half-second linger left half
#: a second for the agent's send and the write, and a loaded machine went past it.
HEARD_LINGER_SHARE = 0.1
#: A device's presence waiting for its batch: when it was heard from (None: only news
#: about its connection came), and whether it is connected.
_Presence = tuple[int | None, bool]


@dataclass(frozen=True)
class HubLimits:
    """Caps on what devices may send and fetch, and the core's tuning."""

    max_fetch_bytes: int = 512 * 1024 * 1024
    chunk_bytes: int = 64 * 1024
    max_labels: int = MAX_DEVICE_LABELS
    max_skills_reported: int = MAX_REPORTED_SKILLS
    #: Telemetry group commit: windows per transaction, and the longest wait for a batch.
    telemetry_batch_items: int = 1024
    telemetry_linger_s: float = 0.001
    #: Message ids remembered for deduplication, across all devices.
    seen_ids: int = 100_000
    #: How long a device id the store does not know is believed unknown.
    unknown_ttl_s: float = 5.0
    #: How often the desired-state notifier polls the store.
    desired_poll_s: float = 0.5
    #: Caps on one drift-sample envelope, and the samples kept per skill version.
    drift_samples: SampleCaps = DEFAULT_SAMPLE_CAPS
    drift_samples_kept: int = KEEP_SAMPLES


def _settled(status: SkillStatusRecord) -> bool:
    """Whether a reported skill is where it goes: running what it was sent, or failed."""
    if status.state == "running":
        return not status.desired_version or status.version == status.desired_version
    return status.state in ("failed", "rolled_back")


def check_device_id(device_id: str) -> str:
    """Return ``device_id`` if well formed.

    Raises:
        ProtocolError: empty, too long or with characters outside ``[A-Za-z0-9._-]``.
    """
    if not DEVICE_ID_RE.match(device_id):
        raise ProtocolError(f"bad device id {device_id!r}")
    return device_id


class HubCore:
    """Transport-independent handling of device traffic, shared by every session.

    Args:
        store: The hub's store.
        trust: The TUF repository devices fetch from.
        limits: Caps and tuning.
        director: Signs each device's desired state (``signed_desired``). Without
            one the core runs in the insecure mode: plain ``desired`` messages that
            agents follow only when they run insecure too (logged loudly).
        heartbeat_s: The heartbeat interval devices are told in ``Welcome``; it is
            recorded per device, and presence is judged by it (:mod:`cloud.presence`).
        tails: Split and joint inference serving (batching, caps, caches).

    Raises:
        ValidationError: ``heartbeat_s`` outside 1..300 seconds.
    """

    def __init__(
        self,
        store: Store,
        trust: TrustRepository,
        limits: HubLimits | None = None,
        *,
        director: HubDirector | None = None,
        heartbeat_s: int = DEFAULT_HEARTBEAT_S,
        tails: TailSettings | None = None,
    ) -> None:
        self.heartbeat_s = heartbeat_seconds(heartbeat_s)
        #: Seconds a heartbeat waits for its batch (:meth:`presence`).
        self.heard_linger_s = min(HEARD_LINGER_S, HEARD_LINGER_SHARE * self.heartbeat_s)
        self.store = store
        self.trust = trust
        self.limits = limits = limits or HubLimits()
        self.director = director
        if director is None:
            log.warning("INSECURE: no director key; desired state goes out unsigned")
        #: Messages dropped, by :class:`DropReason`; exported as metrics.
        self.dropped: Counter[str] = Counter()
        self.handled: Counter[str] = Counter()
        self.telemetry = TelemetryBatcher(
            store.add_telemetry_windows,
            store.check_telemetry_window,
            BatcherSettings(
                max_items=limits.telemetry_batch_items, linger_s=limits.telemetry_linger_s
            ),
        )
        # Reports too: a rollout's thousand devices each report a few times, and one
        # transaction per report was the hub's largest cost after heartbeats.
        self.reports: GroupCommit[ReportItem] = GroupCommit(
            store.save_reports_many,
            store.check_report,
            BatcherSettings(
                max_items=limits.telemetry_batch_items, linger_s=limits.telemetry_linger_s
            ),
            name="reports",
        )
        self._desired_reads: BatchedReads[str, pb.Envelope] = BatchedReads(
            self._desired_many, max_keys=_DESIRED_BATCH
        )
        #: Occurrences devices reported, by (kind, reason); exported as metrics.
        self.security_events: Counter[tuple[str, str]] = Counter()
        poll = (
            store.desired_generations
            if director is None
            else functools.partial(director.revisions, store)
        )
        # The poll's values are revisions: director counters (generations when insecure).
        self.notifier = DesiredNotifier(
            poll, limits.desired_poll_s, fingerprint=store.desired_fingerprint
        )
        self._seen: Lru[tuple[str, str]] = Lru(limits.seen_ids)
        self._known: set[str] = set()
        self._unknown: Lru[str] = Lru(10_000)
        self._presence: dict[str, _Presence] = {}
        self._presence_flush: asyncio.Task[None] | None = None
        self._presence_wake: asyncio.Future[None] | None = None
        self._closing = False
        #: Split and joint inference: tails from the signed bundles devices are entitled to.
        self.tails = TailServer(trust, self.tail_target, tails)
        #: Called (on the event loop) with the device of each stored report in which a
        #: skill settled: the leader's rollout loop starts its next pass sooner.
        self.on_settled: Callable[[str], None] | None = None

    def loops(self) -> list[Loop]:
        """The coroutines every hub process must keep running while it serves devices.

        Not leader-only: each process's servers wait on its own notifier.
        """
        return [("desired-notifier", self.notifier.run)]

    async def close(self) -> None:
        """Write the telemetry, reports and presence still waiting for their batch.

        Presence is written at once, not after the linger; if the store fails, that
        is logged and the batch given up. Later telemetry is refused.
        """
        await self.telemetry.close()
        await self.reports.close()
        await self.tails.close()
        self._closing = True
        flush = self._presence_flush
        if flush is not None and not flush.done():
            wake = self._presence_wake
            if wake is not None and not wake.done():
                wake.set_result(None)  # stop lingering
            await flush
        else:
            await self._flush_presence()  # what a task of an earlier event loop left

    def session(self, claimed: str | None = None, *, bound: bool = False) -> DeviceSession:
        """A session for one device's traffic.

        Args:
            claimed: the device the channel speaks for, when known before any message
                (an MQTT topic's device, or an mTLS certificate's name).
            bound: ``claimed`` comes from a client certificate, so acting as another
                device is an identity mismatch rather than a spoofed message.
        """
        return DeviceSession(self, claimed, bound=bound)

    # -- counters and caches ---------------------------------------------------------

    def drop(self, reason: DropReason, device_id: str = "", detail: object = "") -> None:
        """Count a message the hub refused; the first of each reason and every 1000th are logged."""
        self.dropped[reason] += 1
        count = self.dropped[reason]
        if count == 1 or count % 1000 == 0:  # visible in the log, but a flood cannot flood it
            log.warning(
                "dropped a message from %r (%s; %d so far): %s", device_id, reason, count, detail
            )

    def seen(self, device_id: str, msg_id: str) -> bool:
        """True when this device's message was handled before (within the last ``seen_ids``)."""
        return (device_id, msg_id) in self._seen

    def remember(self, device_id: str, msg_id: str) -> None:
        """Record a handled message, so a redelivered copy is recognised."""
        self._seen.add((device_id, msg_id))

    async def is_known(self, device_id: str) -> bool:
        """True when the device registered (with this or any hub process).

        Raises:
            StoreError: the store failed.
        """
        if device_id in self._known:
            return True
        if self.believed_unknown(device_id):
            return False
        if await asyncio.to_thread(self.store.get_device, device_id) is None:
            self._unknown.add(device_id)
            return False
        self._known.add(device_id)
        return True

    def believed_unknown(self, device_id: str) -> bool:
        """True when the store said within ``unknown_ttl_s`` that it does not know the device."""
        if device_id in self._known:
            return False
        age = self._unknown.age(device_id)
        return age is not None and age < self.limits.unknown_ttl_s

    # -- device messages -------------------------------------------------------------

    async def register(self, env: pb.Envelope) -> list[pb.Envelope]:
        """Handle a device's ``register``; return the welcome and its desired state.

        Raises:
            ProtocolError: not a register message, or bad device id or labels.
            StoreError: the store failed.
        """
        if kind_of(env) != "register":
            raise ProtocolError("the first message on a connection must be register")
        device_id = check_device_id(env.device_id)
        reg = env.register
        if len(reg.labels) > self.limits.max_labels:
            raise ProtocolError(f"more than {self.limits.max_labels} labels")
        try:
            labels = parse_labels(f"{k}={v}" for k, v in reg.labels.items())
            beat_ms = self.heartbeat_s * 1000
            save = functools.partial(self.store.register_device, heartbeat_ms=beat_ms)
            await asyncio.to_thread(save, device_id, labels, device_profile(reg), now_ms=now_ms())
        except ValidationError as exc:
            raise ProtocolError(str(exc)) from exc
        self._known.add(device_id)
        self.handled["register"] += 1
        board = str(device_profile(reg).get("board", "")) or "board not said"
        note = NewEvent(EVENT_DEVICE, f"{device_id} registered ({board})", device_id)
        await asyncio.to_thread(self.store.record_event, note, now_ms=now_ms())
        welcome = make_envelope(
            device_id, correlation_id=env.id, welcome=pb.Welcome(heartbeat_s=self.heartbeat_s)
        )
        return [welcome, await self.desired(device_id)]

    async def desired(self, device_id: str) -> pb.Envelope:
        """The device's current desired state as an envelope, signed unless insecure.

        Read together with the other devices asking at the same time (a deployment
        wakes thousands of sessions at once): one store read for up to 500.

        Raises:
            StoreError: the store failed, or (DirectorError) the state cannot be signed.
        """
        return await self._desired_reads.get(device_id)

    def _desired_many(self, devices: list[str]) -> dict[str, pb.Envelope | Exception]:
        records = self.store.desired_many(devices)
        found: dict[str, pb.Envelope | Exception]
        if self.director is None:
            found = {r.device_id: desired_envelope(r.device_id, r) for r in records}
        else:
            signed = self.director.instructions(self.store, records)
            found = {
                d: one if isinstance(one, Exception) else signed_envelope(d, one)
                for d, one in signed.items()
            }
        self._offer([env for env in found.values() if isinstance(env, pb.Envelope)])
        return found

    async def desired_changes(
        self, published: Mapping[str, int]
    ) -> AsyncIterator[list[pb.Envelope]]:
        """After each notifier poll, yield the desired states that differ from ``published``.

        ``published`` is read live: the caller keeps it up to date with what was
        published (by any hub). Envelopes come in batches of up to 500 devices.

        Raises:
            StoreError: the store failed reading desired states.
        """
        async for revisions in self.notifier.snapshots():
            self._known.update(revisions)
            changed = [d for d, g in revisions.items() if g and g != published.get(d)]
            for start in range(0, len(changed), _DESIRED_BATCH):
                batch = changed[start : start + _DESIRED_BATCH]
                yield await asyncio.to_thread(self._desired_batch, batch)

    def _desired_batch(self, devices: list[str]) -> list[pb.Envelope]:
        if self.director is None:
            envs = [desired_envelope(r.device_id, r) for r in self.store.desired_many(devices)]
        else:
            found = self.store.instructions_many(devices)  # signed by the notifier's poll
            envs = [signed_envelope(d, found[d]) for d in devices if d in found]
        self._offer(envs)
        return envs

    def _offer(self, envs: list[pb.Envelope]) -> None:
        """Send the repository's current metadata beside each desired state.

        A device upgrading then asks the hub only for the bundle (see
        :mod:`skills.trust.offer`). Nothing is added when the files are over
        ``MAX_OFFER_BYTES`` together or cannot be read whole now.
        """
        if not envs:
            return
        offer = read_offer(self.trust.read)
        if offer is None:
            return
        message = offer_message(offer)
        for env in envs:
            env.metadata.CopyFrom(message)

    @staticmethod
    def revision(env: pb.Envelope) -> int | None:
        """What orders desired-state envelopes (see :func:`cloud.wire.desired_revision`)."""
        return desired_revision(env)

    async def handle(self, device_id: str, env: pb.Envelope) -> list[pb.Envelope]:
        """Handle one message from a registered device; return the replies.

        Telemetry is answered only after it is committed (in a batch shared
        with other devices); a duplicate is acknowledged again.

        Raises:
            ProtocolError: the message is of a kind devices may not send,
                claims another device's id, or the store refuses it as malformed.
            StoreError: the store failed; nothing is acknowledged, so the
                device sends the message again.
        """
        if env.device_id != device_id:
            raise ProtocolError(f"device {device_id} sent a message as {env.device_id!r}")
        try:
            return await self._dispatch(device_id, env)
        except ValidationError as exc:
            raise ProtocolError(f"refused by the store: {exc}") from exc

    async def _dispatch(self, device_id: str, env: pb.Envelope) -> list[pb.Envelope]:
        kind = kind_of(env)
        if kind == "heartbeat":
            await self.heard(device_id)
        elif kind == "reported":
            # The device's send time orders its reports (clamped: a fast clock must not
            # freeze them); a redelivered older report then cannot hide a newer one.
            made_ms = min(env.sent_at_ms, now_ms()) if env.sent_at_ms > 0 else now_ms()
            report = env.reported
            if len(report.skills) > self.limits.max_skills_reported:
                raise ProtocolError(
                    f"report lists more than {self.limits.max_skills_reported} skills"
                )
            statuses = skill_status_records(report)
            item = (device_id, report.generation, statuses, made_ms)
            stored = await self.reports.submit_item(item)
            if stored and self.on_settled is not None and any(map(_settled, statuses)):
                self.on_settled(device_id)
        elif kind == "telemetry":
            record = telemetry_record(env.telemetry)
            # Acked only after the batch holding it committed (end-to-end ack).
            await self.telemetry.submit(env.id, device_id, record)
        elif kind == "security_event":
            await asyncio.to_thread(self._save_event, device_id, env)
        elif kind == "drift_samples":
            await self._save_samples(device_id, env)
        elif kind != "ack":
            raise ProtocolError(f"devices may not send {kind!r}")
        self.handled[kind] += 1
        if kind in ACKED_KINDS:
            return [ack_envelope(device_id, env.id)]
        return []

    async def _save_samples(self, device_id: str, env: pb.Envelope) -> None:
        """Check a drift-sample envelope whole, then store it once; acked after the commit."""
        batch = samples_from_wire(env.drift_samples, self.limits.drift_samples)
        save = functools.partial(
            self.store.add_drift_samples, keep=self.limits.drift_samples_kept, now_ms=now_ms()
        )
        if not await asyncio.to_thread(save, env.id, device_id, batch):
            self.handled["duplicate"] += 1  # a resend whose first copy another process stored

    def _save_event(self, device_id: str, env: pb.Envelope) -> None:
        event = security_event_record(env.security_event)
        if not self.store.add_security_event(env.id, device_id, event):
            return  # a redelivered event: counted the first time
        summary = f"{event.kind} ({event.reason}) x{event.count} {event.subject}".strip()
        detail = f"{summary}: {event.detail}" if event.detail else summary
        note = NewEvent(EVENT_SECURITY, detail, device_id, event.subject)
        self.store.record_event(note, now_ms=now_ms())
        key = (event.kind, event.reason)
        if key not in self.security_events and len(self.security_events) >= _MAX_EVENT_SERIES:
            key = ("other", "other")
        self.security_events[key] += event.count
        log.warning(
            "device %s reports %s (%s) x%d: %s",
            device_id,
            event.kind,
            event.reason,
            event.count,
            event.detail[:200],
        )

    async def heard(self, device_id: str) -> None:
        """Record a message from the device itself (a heartbeat): it is connected, seen now.

        Written in the next presence batch (:meth:`presence`).

        Raises:
            ProtocolError: a malformed device id (nothing is recorded).
        """
        self._note_presence(check_device_id(device_id), now_ms(), online=True)

    async def presence(self, device_id: str, *, online: bool) -> None:
        """Record whether a device is connected, as news not from the device itself.

        Its last-seen time stays: a broker's status replayed late cannot make it look
        fresh. Heartbeats and such news are not acknowledged, so they are written in
        batches: every device heard of within ``heard_linger_s`` goes into one
        transaction (a write per heartbeat was the hub's largest cost with a thousand
        devices; a write per news took a tenth of its CPU when thousands of devices
        connected or went away at once). The last news of a device wins: a heartbeat
        still waiting for its batch is written with this flag (and its time), so it
        cannot land later and mark a gone device connected again; a heartbeat after
        the news marks it connected again.

        A batch the store fails is counted as a store-error drop and kept for the next
        one, under what arrived meanwhile: an offline news is carried by nothing else.
        The news of a device the store does not know is dropped with its batch, and
        the device believed unknown (:meth:`believed_unknown`) for ``unknown_ttl_s``:
        so a broker's retained statuses, replayed to a new hub, are checked a batch
        at a time rather than one read each.

        Raises:
            ProtocolError: a malformed device id (nothing is recorded).
        """
        heard_ms, _ = self._presence.get(check_device_id(device_id), (None, online))
        self._note_presence(device_id, heard_ms, online=online)

    async def disconnected(self, device_id: str) -> None:
        """Mark a device disconnected after its connection ended (it is offline until it speaks).

        Written in the next presence batch (:meth:`presence`).

        Raises:
            ProtocolError: a malformed device id (nothing is recorded).
        """
        await self.presence(device_id, online=False)

    def _note_presence(self, device_id: str, heard_ms: int | None, *, online: bool) -> None:
        self._presence[device_id] = (heard_ms, online)
        if self._presence_flush is None or self._presence_flush.done():
            self._presence_flush = asyncio.create_task(self._flush_presence())

    async def _flush_presence(self) -> None:
        """Write the pending presence after the linger, and again while more is pending.

        One task writes every batch, so batches land in the order their news came.
        Once the core is closing there is no linger, and a failed batch is given up.
        """
        while self._presence:
            if not self._closing:
                wake = self._presence_wake = asyncio.get_running_loop().create_future()
                try:
                    await asyncio.wait([wake], timeout=self.heard_linger_s)
                finally:
                    self._presence_wake = None
            if not await self._write_presence() and self._closing:
                log.warning(
                    "closing with the presence of %d devices unwritten", len(self._presence)
                )
                return

    async def _write_presence(self) -> bool:
        """Write the pending batch; False when the store failed and it was kept."""
        batch, self._presence = self._presence, {}
        try:
            unknown = await asyncio.to_thread(self.store.record_presence, batch)
        except StoreError as exc:
            for device_id, (heard_ms, online) in batch.items():
                # What arrived meanwhile wins, but news alone keeps the batch's heard time.
                newer_ms, newer_online = self._presence.get(device_id, (None, online))
                self._presence[device_id] = (
                    heard_ms if newer_ms is None else newer_ms,
                    newer_online,
                )
            detail = f"presence of {len(batch)} devices, kept for the next batch: {exc}"
            self.drop(DropReason.STORE_ERROR, "", detail)
            return False
        for device_id in unknown:
            self._unknown.add(device_id)
        self._known.update(batch.keys() - unknown)
        return True

    # -- split and joint inference -----------------------------------------------------

    async def tail_target(self, device_id: str, skill: str, version: str) -> str:
        """The signed target of a skill version the device may run tails of.

        A device is entitled to a version in its desired state, or one it reports
        running (a rollout may have moved on while it still runs the old one).

        Raises:
            TailRefusedError: ``permission-denied`` when the device is not entitled,
                ``not-found`` when the hub has no such version.
            StoreError: The store failed.
        """
        return await asyncio.to_thread(self._tail_target, device_id, skill, version)

    def _tail_target(self, device_id: str, skill: str, version: str) -> str:
        for wanted in self.store.desired_for(device_id).skills:
            if (wanted.name, wanted.version) == (skill, version):
                return wanted.target_name
        report = self.store.reported_for(device_id)
        running = report is not None and any(
            (s.name, s.version, s.state) == (skill, version, "running") for s in report.skills
        )
        if not running:
            raise TailRefusedError(
                "permission-denied", f"{skill} {version} is not deployed to this device"
            )
        try:
            return self.store.get_skill_version(skill, version).target_name
        except NotFoundError as exc:
            raise TailRefusedError("not-found", f"the hub has no {skill} {version}") from exc

    # -- fetch -----------------------------------------------------------------------

    def open_fetch(self, path: str, offset: int, max_bytes: int) -> tuple[int, FileChunks]:
        """Open a repository file for a chunked fetch from ``offset``, reading its first chunk.

        Returns:
            The file's total size and an iterator of chunks.

        Raises:
            FileNotFoundError: no such file.
            FetchTooLargeError: the file is over the caller's or the hub's cap.
            FetchRefusedError: a bad path or an offset outside the file.
        """
        cap = min(max_bytes or self.limits.max_fetch_bytes, self.limits.max_fetch_bytes)
        return open_repository_file(self.trust, path, offset, cap, self.limits.chunk_bytes)


@contextlib.asynccontextmanager
async def running(core: HubCore) -> AsyncIterator[HubCore]:
    """Run the core's loops for the duration of the block (servers started without the host).

    A loop that fails is logged and started again after a second.
    """
    tasks = [asyncio.create_task(_keep_running(name, fn), name=name) for name, fn in core.loops()]
    try:
        yield core
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _keep_running(name: str, fn: Callable[[], Awaitable[None]]) -> None:
    while True:
        try:
            await fn()
        except Exception:  # restarted below; the host does the same with backoff
            log.exception("hub loop %s failed; restarting", name)
        await asyncio.sleep(1.0)
