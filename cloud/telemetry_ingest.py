"""Telemetry of many devices checked, stored and acknowledged in bulk (the MQTT adapter's path).

A broker hands the hub thousands of telemetry windows a second, each on its
device's own topic. Handled one at a time (a task, a session and a waiter in
the group commit per message) the event loop's bookkeeping cost more than the
checks and the write. Here the messages that arrive in one turn of the event
loop form a group: each is checked as :meth:`cloud.session.DeviceSession.receive`
checks it (size, envelope, kind, the topic's device, a registered device, not
seen before), the group goes into the next group commit as one submitter, and
once that committed each device gets one ack for all its stored messages.

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
from cloud.session import DropReason
from cloud.telemetry_batcher import TelemetryItem
from cloud.wire import telemetry_record
from protos import decode_envelope, pb
from protos.envelope import now_ms
from protos.errors import ProtocolError
from protos.limits import MAX_ENVELOPE_BYTES

if TYPE_CHECKING:
    from cloud.hubcore import HubCore

__all__ = ["AckSender", "TelemetryIngest"]

log = logging.getLogger(__name__)

#: Called once per device and group with the ids of its messages now acknowledged.
AckSender = Callable[[str, list[str]], None]


class TelemetryIngest:
    """Groups the telemetry that arrives together, and stores and acks each group at once.

    Args:
        core: The hub's core: its counters, caches and telemetry group commit.
        send_acks: Sends one device the ack of the given message ids.
        max_pending: Messages accepted and not yet answered; :meth:`add` refuses more.
    """

    def __init__(self, core: HubCore, send_acks: AckSender, max_pending: int) -> None:
        self.core = core
        self._send_acks = send_acks
        self._max_pending = max_pending
        self._max_group = core.telemetry.settings.max_items
        self._arrived: list[tuple[str, bytes]] = []
        self._pending = 0
        self._tasks: set[asyncio.Task[None]] = set()

    def add(self, device_id: str, payload: bytes) -> bool:
        """Take one message from ``device_id``'s telemetry topic (called on the event loop).

        Returns:
            False when too many messages are pending: the message is not taken
            (the device's outbox sends it again).
        """
        if self._pending >= self._max_pending:
            return False
        if not self._arrived:
            asyncio.get_running_loop().call_soon(self._start_groups)
        self._arrived.append((device_id, payload))
        self._pending += 1
        return True

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

    async def _handle(self, group: list[tuple[str, bytes]]) -> None:
        try:
            items = await self._checked(group)
            await self._store_and_ack(items)
        except Exception:  # a bug: counted and logged; the devices send again
            self.core.drop(DropReason.INTERNAL_ERROR, "", f"{len(group)} telemetry messages")
            log.exception("a group of %d telemetry messages not handled", len(group))
        finally:
            self._pending -= len(group)

    async def _checked(self, group: list[tuple[str, bytes]]) -> list[TelemetryItem]:
        """The group's messages to store; the refused ones counted, those seen before acked."""
        core = self.core
        known: dict[str, bool] = {}
        items: list[TelemetryItem] = []
        again: dict[str, list[str]] = {}
        received_ms = now_ms()
        for device, payload in group:
            env = self._decoded(device, payload)
            if env is None:
                continue
            registered = known.get(device)
            if registered is None:
                registered = known[device] = await self._known(device)
            if not registered:
                continue
            if core.seen(device, env.id):
                core.handled["duplicate"] += 1
                again.setdefault(device, []).append(env.id)  # its first ack was lost
                continue
            items.append((env.id, device, telemetry_record(env.telemetry, received_ms)))
        for device, ids in again.items():
            self._send_acks(device, ids)
        return items

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

    async def _store_and_ack(self, items: list[TelemetryItem]) -> None:
        core = self.core
        try:
            verdicts = await core.telemetry.submit_many(items)
        except StoreError as exc:  # nothing acknowledged: the devices send again
            for _, device, _ in items:
                core.drop(DropReason.STORE_ERROR, device, exc)
            return
        acked: dict[str, list[str]] = {}
        for (msg_id, device, _), verdict in zip(items, verdicts, strict=True):
            if isinstance(verdict, ValidationError):
                core.drop(DropReason.INVALID, device, f"refused by the store: {verdict}")
                continue
            # False: a copy stored before (by another hub process, or earlier in the group).
            core.handled["telemetry" if verdict else "duplicate"] += 1
            core.remember(device, msg_id)
            acked.setdefault(device, []).append(msg_id)
        for device, ids in acked.items():
            self._send_acks(device, ids)
