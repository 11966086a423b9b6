"""Telemetry of many devices checked, stored and acknowledged in bulk (both transports).

A broker hands the hub thousands of telemetry windows a second, each on its
device's own topic, and gRPC as many on the devices' streams. Handled one at a
time (a task, a session and a waiter in the group commit per message) the event
loop's bookkeeping cost more than the checks and the write. Here the messages
that arrive in one turn of the event loop form a group: each is checked as
:meth:`cloud.session.DeviceSession.receive` checks it (size, envelope, kind, the
topic's device, a registered device, not seen before), the group goes into the
next group commit as one submitter, and once that committed each device gets one
ack for all its stored messages.

MQTT messages arrive as bytes with the topic's device (:meth:`TelemetryIngest.add`)
and are checked here. A gRPC stream's session has checked its message already,
as it must to learn its kind, and puts the envelope in with the
:class:`IngestStream` its acks go back on (:meth:`TelemetryIngest.put`): a
stream with too many messages waiting, or a full ingest, waits for room, so a
stream's transport pushes back on its device instead of dropping.

The guarantees are the session's: nothing is acknowledged before the
transaction holding it committed; a message handled before, or stored before
by another hub process, is acknowledged again and not stored twice; the device
is the topic's, never a field of the message; a refused message is counted in
``core.dropped`` with its :class:`~cloud.session.DropReason`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from cloud.errors import StoreError, ValidationError
from cloud.session import DropReason, ack_envelope
from cloud.telemetry_batcher import TelemetryItem
from cloud.wire import telemetry_window
from protos import decode_envelope, pb
from protos.envelope import now_ms
from protos.errors import ProtocolError
from protos.limits import MAX_ENVELOPE_BYTES

if TYPE_CHECKING:
    from cloud.hubcore import HubCore

__all__ = ["MAX_ACK_IDS", "AckSender", "IngestStream", "TelemetryIngest", "ack_envelopes"]

log = logging.getLogger(__name__)

#: Called once per device and group with the ids of its messages now acknowledged.
AckSender = Callable[[str, list[str]], None]
#: Most message ids one ack carries (an id is at most 64 characters).
MAX_ACK_IDS = 256


def ack_envelopes(device: str, ids: list[str]) -> list[pb.Envelope]:
    """The acks of ``ids`` (each id once, in order), at most ``MAX_ACK_IDS`` ids in each."""
    unique = list(dict.fromkeys(ids))
    return [
        ack_envelope(device, *unique[start : start + MAX_ACK_IDS])
        for start in range(0, len(unique), MAX_ACK_IDS)
    ]


class IngestStream:
    """One connection's share of a :class:`TelemetryIngest`: where its acks go, what waits.

    Args:
        send_acks: Sends the connection's device the ack of the given message ids.
        max_pending: Messages of this connection taken and not yet answered;
            :meth:`TelemetryIngest.put` waits while there are this many.
    """

    def __init__(self, send_acks: AckSender, max_pending: int) -> None:
        if max_pending < 1:
            raise ValueError("max_pending must be at least 1")
        self.send_acks = send_acks
        self.max_pending = max_pending
        #: Messages of this connection taken and not yet answered.
        self.pending = 0


#: A message taken: its device, its bytes (still to check) or its checked envelope,
#: and the stream its ack goes back on (None: the ingest's ``send_acks``).
_Entry = tuple[str, bytes | pb.Envelope, IngestStream | None]


class TelemetryIngest:
    """Groups the telemetry that arrives together, and stores and acks each group at once.

    Args:
        core: The hub's core: its counters, caches and telemetry group commit.
        send_acks: Sends one device the ack of the given message ids, for the
            messages taken by :meth:`add` (None where only :meth:`put` is used).
        max_pending: Messages taken and not yet answered; :meth:`add` refuses more
            and :meth:`put` waits.
    """

    def __init__(self, core: HubCore, send_acks: AckSender | None, max_pending: int) -> None:
        self.core = core
        self._send_acks = send_acks
        self._max_pending = max_pending
        self._max_group = core.telemetry.settings.max_items
        self._arrived: list[_Entry] = []
        self._pending = 0
        #: Set and cleared each time a group is answered: wakes the streams waiting for room.
        self._answered = asyncio.Event()
        #: Acks of streams' messages to send at the end of this turn of the loop.
        self._stream_acks: dict[tuple[IngestStream, str], list[str]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def pending(self) -> int:
        """Messages taken and not yet answered."""
        return self._pending

    def add(self, device_id: str, payload: bytes) -> bool:
        """Take one message from ``device_id``'s telemetry topic (called on the event loop).

        Returns:
            False when too many messages are pending: the message is not taken
            (the device's outbox sends it again).

        Raises:
            RuntimeError: this ingest has no ``send_acks`` for the acks.
        """
        if self._send_acks is None:
            raise RuntimeError("add() needs an ingest made with send_acks")
        if self._pending >= self._max_pending:
            return False
        self._take((device_id, payload, None))
        return True

    def offer(self, stream: IngestStream, device_id: str, env: pb.Envelope) -> bool:
        """Take one telemetry envelope of ``stream``'s device if there is room.

        The caller has checked it as the stream's session checks a message: within
        the size cap, an envelope, telemetry, in the name of the device registered
        on the stream. Its ack goes to ``stream.send_acks`` once it is committed.

        Returns:
            False when the stream or the ingest has too many messages pending: the
            message is not taken (:meth:`put` waits for room).
        """
        if stream.pending >= stream.max_pending or self._pending >= self._max_pending:
            return False
        stream.pending += 1
        self._take((device_id, env, stream))
        return True

    async def put(self, stream: IngestStream, device_id: str, env: pb.Envelope) -> None:
        """Take the envelope as :meth:`offer` does, waiting for room while there is none."""
        while not self.offer(stream, device_id, env):
            await self._answered.wait()

    def _take(self, entry: _Entry) -> None:
        if not self._arrived:
            asyncio.get_running_loop().call_soon(self._start_groups)
        self._arrived.append(entry)
        self._pending += 1

    async def close(self) -> None:
        """Stop handling; messages not yet acknowledged are left for the devices to resend."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _start_groups(self) -> None:
        arrived, self._arrived = self._arrived, []
        for start in range(0, len(arrived), self._max_group):
            group = arrived[start : start + self._max_group]
            task = asyncio.create_task(self._handle(group))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _handle(self, group: list[_Entry]) -> None:
        try:
            items, streams = await self._checked(group)
            await self._store_and_ack(items, streams)
        except Exception:  # a bug: counted and logged; the devices send again
            self.core.drop(DropReason.INTERNAL_ERROR, "", f"{len(group)} telemetry messages")
            log.exception("a group of %d telemetry messages not handled", len(group))
        finally:
            self._pending -= len(group)
            for _, _, stream in group:
                if stream is not None:
                    stream.pending -= 1
            self._answered.set()  # wakes every waiter; each checks its room again
            self._answered.clear()

    async def _checked(
        self, group: list[_Entry]
    ) -> tuple[list[TelemetryItem], list[IngestStream | None]]:
        """The group's messages to store and their streams; the refused ones counted,
        those seen before acked."""
        core = self.core
        known: dict[str, bool] = {}
        items: list[TelemetryItem] = []
        streams: list[IngestStream | None] = []
        again: dict[tuple[IngestStream | None, str], list[str]] = {}
        received_ms = now_ms()
        for device, data, stream in group:
            if isinstance(data, bytes):
                env = self._decoded(device, data)
                if env is None:
                    continue
                registered = known.get(device)
                if registered is None:
                    registered = known[device] = await self._known(device)
                if not registered:
                    continue
            else:  # checked by its stream's session, whose device registered on it
                env = data
            if core.seen(device, env.id):
                core.handled["duplicate"] += 1
                again.setdefault((stream, device), []).append(env.id)  # its first ack was lost
                continue
            items.append(telemetry_window(env.id, device, env.telemetry, received_ms))
            streams.append(stream)
        self._send_all(again)
        return items, streams

    def _send_all(self, acks: dict[tuple[IngestStream | None, str], list[str]]) -> None:
        """Send the topics' acks now, and the streams' at the end of this turn of the loop.

        The groups one commit stored wake in the same turn, and a stream's messages
        are often spread over several of them: merged, each stream gets one ack.
        """
        merged = self._stream_acks
        for (stream, device), ids in acks.items():
            if stream is None:
                if self._send_acks is not None:
                    self._send_acks(device, ids)
                continue
            if not merged:
                asyncio.get_running_loop().call_soon(self._flush_stream_acks)
            waiting = merged.setdefault((stream, device), ids)
            if waiting is not ids:
                waiting.extend(ids)

    def _flush_stream_acks(self) -> None:
        merged, self._stream_acks = self._stream_acks, {}
        for (stream, device), ids in merged.items():
            stream.send_acks(device, ids)

    def _decoded(self, device: str, payload: bytes) -> pb.Envelope | None:
        """The envelope, if it is telemetry of the topic's device (else counted and None)."""
        if len(payload) > MAX_ENVELOPE_BYTES:
            self.core.drop(DropReason.OVERSIZED, device, f"{len(payload)} bytes")
            return None
        try:
            env = decode_envelope(payload)
        except ProtocolError as exc:
            self.core.drop(DropReason.MALFORMED, device, exc)
            return None
        kind = env.WhichOneof("body")
        if kind != "telemetry":
            self.core.drop(DropReason.WRONG_KIND, device, f"{kind} on telemetry")
            return None
        if env.device_id != device:
            self.core.drop(DropReason.SPOOFED, device, f"sent as {env.device_id!r}")
            return None
        return env

    async def _known(self, device: str) -> bool:
        try:
            known = await self.core.is_known(device)
        except StoreError as exc:
            self.core.drop(DropReason.STORE_ERROR, device, exc)
            return False
        if not known:
            self.core.drop(DropReason.UNKNOWN_DEVICE, device)
        return known

    async def _store_and_ack(
        self, items: list[TelemetryItem], streams: list[IngestStream | None]
    ) -> None:
        core = self.core
        try:
            verdicts = await core.telemetry.submit_many(items)
        except StoreError as exc:  # nothing acknowledged: the devices send again
            for window in items:
                core.drop(DropReason.STORE_ERROR, window[1], exc)
            return
        acked: dict[tuple[IngestStream | None, str], list[str]] = {}
        for window, stream, verdict in zip(items, streams, verdicts, strict=True):
            msg_id, device = window[0], window[1]
            if isinstance(verdict, ValidationError):
                core.drop(DropReason.INVALID, device, f"refused by the store: {verdict}")
                continue
            # False: a copy stored before (by another hub process, or earlier in the group).
            core.handled["telemetry" if verdict else "duplicate"] += 1
            core.remember(device, msg_id)
            acked.setdefault((stream, device), []).append(msg_id)
        self._send_all(acked)
