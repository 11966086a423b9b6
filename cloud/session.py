"""One device's conversation with the hub, whichever transport carries it.

A transport server hands every payload it receives to a :class:`DeviceSession`
(one per gRPC stream, one per MQTT message's topic device) and sends back what
the session returns. The session is where a message is checked (size,
envelope, kind, whose it is), deduplicated, dropped with a reason from
:class:`DropReason`, handled by the core and acknowledged. Nothing here raises
for a bad message: it is counted in ``core.dropped`` and the device's other
messages are served. A store failure is counted and logged too, and the
message is not acknowledged, so the device sends it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Hashable
from enum import StrEnum
from typing import TYPE_CHECKING, Generic, TypeVar

from google.protobuf.message import DecodeError

from cloud.errors import (
    FetchRefusedError,
    FetchUnknownDeviceError,
    IdentityMismatchError,
    SessionRefusedError,
    StoreError,
)
from cloud.fetch_serving import FileChunks
from cloud.tail_serving import TailRefusedError
from protos import decode_envelope, kind_of, pb
from protos.envelope import now_ms
from protos.errors import ProtocolError
from protos.limits import DEVICE_ID_PATTERN, MAX_ENVELOPE_BYTES, MAX_FETCH_REQUEST_BYTES
from skills.tensor_codec import MAX_INFER_BYTES

if TYPE_CHECKING:
    from cloud.hubcore import HubCore

__all__ = ["ACKED_KINDS", "DEVICE_KINDS", "DeviceSession", "DropReason", "Lru", "ack_envelope"]

#: Envelope kinds a device may send.
DEVICE_KINDS = frozenset(
    {"register", "heartbeat", "reported", "telemetry", "ack", "security_event", "drift_samples"}
)
#: Kinds the hub acknowledges once handled (the agent's outbox waits for it).
ACKED_KINDS = frozenset({"reported", "telemetry", "security_event", "drift_samples"})
#: A safety net: a desired-state change normally arrives through the notifier.
_DESIRED_RECHECK_S = 30.0

K = TypeVar("K", bound=Hashable)
_DEVICE_RE = re.compile(rf"^{DEVICE_ID_PATTERN}$")


class DropReason(StrEnum):
    """Why the hub dropped a message; the same words on every transport."""

    MALFORMED = "malformed"  #: not an envelope (or fetch request, or status)
    OVERSIZED = "oversized"  #: over the wire cap
    WRONG_KIND = "wrong-kind"  #: a kind devices may not send, or not the topic's kind
    SPOOFED = "spoofed"  #: sent on one device's channel in another device's name
    IDENTITY_MISMATCH = "identity-mismatch"  #: a certificate's device acting as another
    UNKNOWN_DEVICE = "unknown-device"  #: from a device that never registered
    BAD_REGISTER = "bad-register"  #: a register the hub refused
    NO_REGISTER = "no-register"  #: a connection that did not register in time
    INVALID = "invalid"  #: well formed, but the core or the store refused its content
    STORE_ERROR = "store-error"  #: the store failed; not acknowledged, so it comes again
    OVERLOADED = "overloaded"  #: the hub's queues were full
    PUBLISH_FAILED = "publish-failed"  #: a reply could not be sent
    BAD_TOPIC = "bad-topic"  #: an MQTT topic outside the layout
    BAD_FETCH = "bad-fetch"  #: an MQTT fetch without a usable response topic or correlation
    FETCH_BUSY = "fetch-busy"  #: too many fetches at once
    INTERNAL_ERROR = "internal-error"  #: a bug; logged with its traceback
    NO_CERTIFICATE = "no-certificate"  #: a device call without a verified client certificate
    REVOKED_CERTIFICATE = "revoked-certificate"  #: a certificate on the revocation list
    BAD_INFER = "bad-infer"  #: an inference request without usable identity, reply path or body


#: Ack ids: unique per hub process and cheap (a random prefix and a counter, not uuid4).
_ACK_PREFIX = f"a{os.urandom(6).hex()}-"
_ack_numbers = itertools.count()


def ack_envelope(device_id: str, msg_id: str, *more: str) -> pb.Envelope:
    """The hub's acknowledgement of ``msg_id`` (its correlation id) and of ``more``."""
    # One constructor call, the body given as a mapping: upb builds it in place, where
    # a pb.Ack made first is copied in. One per group commit and device ingested.
    return pb.Envelope(
        id=f"{_ACK_PREFIX}{next(_ack_numbers):x}",
        device_id=device_id,
        sent_at_ms=now_ms(),
        correlation_id=msg_id,
        ack={"ids": (msg_id, *more)},
    )


class Lru(Generic[K]):
    """A bounded set of recently seen keys, with the time each was added."""

    def __init__(self, cap: int) -> None:
        self._cap = cap
        self._items: OrderedDict[K, float] = OrderedDict()

    def add(self, key: K) -> None:
        """Remember ``key`` (now), forgetting the oldest beyond the cap."""
        self._items[key] = time.monotonic()
        self._items.move_to_end(key)
        if len(self._items) > self._cap:
            self._items.popitem(last=False)

    def age(self, key: K) -> float | None:
        """Seconds since ``key`` was added, or None when it is not remembered."""
        added = self._items.get(key)
        return None if added is None else time.monotonic() - added

    def __contains__(self, key: object) -> bool:
        return key in self._items


class DeviceSession:
    """Checks and handles the traffic of one device channel; made by :meth:`HubCore.session`."""

    def __init__(self, core: HubCore, claimed: str | None = None, *, bound: bool = False) -> None:
        self.core = core
        self.claimed = claimed
        self.bound = bound
        #: The device that registered on this session.
        self.device_id: str | None = None
        self._last_pushed: int | None = None

    def drop(self, reason: DropReason, detail: object = "") -> None:
        """Count a message of this channel the hub refused."""
        self.core.drop(reason, self.device_id or self.claimed or "", detail)

    # -- messages ----------------------------------------------------------------------

    async def open(self, payload: bytes) -> list[pb.Envelope]:
        """Start a connection whose first message must be a register; return the replies.

        Raises:
            IdentityMismatchError: the register names another device than the certificate.
            SessionRefusedError: the first message is not a valid register.
            StoreError: the store failed (counted); the device should connect again.
        """
        env = self._decode(payload, check_owner=False)
        if env is None:
            raise SessionRefusedError("the first message was dropped")
        if self.claimed is not None and env.device_id != self.claimed:
            self.drop(DropReason.IDENTITY_MISMATCH, f"register as {env.device_id!r}")
            raise IdentityMismatchError(
                f"this client certificate may not act as device {env.device_id!r}"
            )
        try:
            replies = await self.core.register(env)
        except ProtocolError as exc:
            self.drop(DropReason.BAD_REGISTER, exc)
            raise SessionRefusedError(str(exc)) from exc
        except StoreError as exc:
            self.drop(DropReason.STORE_ERROR, exc)
            raise
        self._registered(env.device_id, replies)
        return replies

    async def receive(self, payload: bytes, topic_kind: str | None = None) -> list[pb.Envelope]:
        """Check and handle one message; return the replies (none when it was dropped).

        Args:
            payload: the encoded envelope.
            topic_kind: the kind the transport's topic says the message is, if any.
        """
        env = self._decode(payload, topic_kind)
        if env is None:
            return []
        device, kind = env.device_id, kind_of(env)
        if kind == "register":
            return await self._register(env)
        if not await self._known(device):
            return []
        return await self._handle(device, kind, env)

    async def _handle(self, device: str, kind: str, env: pb.Envelope) -> list[pb.Envelope]:
        if self.core.seen(device, env.id):
            self.core.handled["duplicate"] += 1
            # The first ack was lost, or the message crossed it: say it again.
            return [ack_envelope(device, env.id)] if kind in ACKED_KINDS else []
        try:
            replies = await self.core.handle(device, env)
        except ProtocolError as exc:
            self.drop(DropReason.INVALID, exc)
            return []
        except StoreError as exc:
            self.drop(DropReason.STORE_ERROR, exc)
            return []
        self.core.remember(device, env.id)
        return replies

    async def presence(self, *, online: bool) -> None:
        """Record whether the claimed device is connected, as a broker's status says.

        The status is the broker's news (retained, or a last will), not a message from
        the device, so the device's last-seen time stays. It is written with the hub's
        next presence batch (:meth:`HubCore.presence`), which counts a failed batch.
        Ignored (not counted) for a device that never registered: the batch finds it
        unknown, and later statuses are dropped here while it is believed so. No read
        of its own: a broker replays every retained status to a new hub at once.
        """
        device = self.claimed or self.device_id
        if device is not None and not self.core.believed_unknown(device):
            await self.core.presence(device, online=online)

    async def close(self) -> None:
        """The connection ended: mark the device that registered on it offline.

        Written with the hub's next presence batch (:meth:`HubCore.disconnected`).
        """
        if self.device_id is not None:
            await self.core.disconnected(self.device_id)

    def _decode(
        self, payload: bytes, topic_kind: str | None = None, *, check_owner: bool = True
    ) -> pb.Envelope | None:
        if len(payload) > MAX_ENVELOPE_BYTES:
            self.drop(DropReason.OVERSIZED, f"{len(payload)} bytes")
            return None
        try:
            env = decode_envelope(payload)
        except ProtocolError as exc:
            self.drop(DropReason.MALFORMED, exc)
            return None
        kind = kind_of(env)
        if kind not in DEVICE_KINDS or (topic_kind is not None and kind != topic_kind):
            self.drop(DropReason.WRONG_KIND, f"{kind} on {topic_kind or 'a device channel'}")
            return None
        expected = self.device_id or self.claimed
        if check_owner and expected is not None and env.device_id != expected:
            reason = DropReason.IDENTITY_MISMATCH if self.bound else DropReason.SPOOFED
            self.drop(reason, f"sent as {env.device_id!r}")
            return None
        return env

    async def _register(self, env: pb.Envelope) -> list[pb.Envelope]:
        try:
            replies = await self.core.register(env)
        except ProtocolError as exc:
            self.drop(DropReason.BAD_REGISTER, exc)
            return []
        except StoreError as exc:
            self.drop(DropReason.STORE_ERROR, exc)
            return []
        self._registered(env.device_id, replies)
        return replies

    def _registered(self, device_id: str, replies: list[pb.Envelope]) -> None:
        self.device_id = device_id
        self._last_pushed = self.core.revision(replies[-1])

    async def _known(self, device_id: str) -> bool:
        if device_id == self.device_id:
            return True
        try:
            known = await self.core.is_known(device_id)
        except StoreError as exc:
            self.drop(DropReason.STORE_ERROR, exc)
            return False
        if not known:
            self.drop(DropReason.UNKNOWN_DEVICE)
        return known

    # -- desired state ---------------------------------------------------------------

    async def desired_updates(self) -> AsyncIterator[pb.Envelope]:
        """Yield the registered device's desired state each time its generation changes.

        Raises:
            RuntimeError: no device registered on this session yet.
        """
        device = self.device_id
        if device is None:
            raise RuntimeError("desired_updates needs a registered session")
        changed = self.core.notifier.subscribe(device)
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_DESIRED_RECHECK_S):
                        await changed.wait()
                changed.clear()
                try:
                    env = await self.core.desired(device)
                except StoreError as exc:
                    self.drop(DropReason.STORE_ERROR, exc)
                    continue
                revision = self.core.revision(env)
                if revision != self._last_pushed:
                    self._last_pushed = revision
                    yield env
        finally:
            self.core.notifier.unsubscribe(device, changed)

    # -- fetch -----------------------------------------------------------------------

    async def fetch(self, payload: bytes) -> tuple[pb.FetchRequest, int, FileChunks]:
        """Check a fetch request and open the file it asks for.

        Returns:
            The request, the file's total size and an iterator of its chunks from the
            request's offset.

        Raises:
            IdentityMismatchError: a certificate's device asked in another device's name.
            FetchUnknownDeviceError: the device never registered.
            FetchRefusedError: a malformed, oversized or spoofed request, a bad path or
                offset, or (:class:`~cloud.errors.FetchTooLargeError`) a file over the cap.
            FileNotFoundError: no such file.
            StoreError: the store failed (counted).
        """
        if len(payload) > MAX_FETCH_REQUEST_BYTES:
            self.drop(DropReason.OVERSIZED, f"fetch request of {len(payload)} bytes")
            raise FetchRefusedError("fetch request over the cap")
        req = pb.FetchRequest()
        try:
            req.ParseFromString(payload)
        except DecodeError as exc:
            self.drop(DropReason.MALFORMED, exc)
            raise FetchRefusedError("not a fetch request") from exc
        if self.claimed is not None and req.device_id != self.claimed:
            reason = DropReason.IDENTITY_MISMATCH if self.bound else DropReason.SPOOFED
            self.drop(reason, f"fetch as {req.device_id!r}")
            if self.bound:
                raise IdentityMismatchError(
                    f"this client certificate may not fetch as device {req.device_id!r}"
                )
            raise FetchRefusedError(f"a fetch in another device's name ({req.device_id!r})")
        try:
            known = await self.core.is_known(req.device_id)
        except StoreError as exc:
            self.drop(DropReason.STORE_ERROR, exc)
            raise
        if not known:
            self.drop(DropReason.UNKNOWN_DEVICE, "fetch")
            raise FetchUnknownDeviceError("register first")
        size, chunks = await asyncio.to_thread(
            self.core.open_fetch, req.path, req.offset, req.max_bytes
        )
        return req, size, chunks

    # -- split and joint inference ------------------------------------------------------

    async def infer(
        self, request: pb.InferRequest, *, deadline_s: float | None = None
    ) -> pb.InferResponse:
        """Run the tail a device asks for, as the device this channel names.

        The device is the channel's (its certificate's, or its MQTT topic's); only a
        gRPC channel without TLS, which names none, falls back on the request's
        ``device_id``, as fetches do in that mode.

        Raises:
            TailRefusedError: Refused (no identity, not registered, not entitled,
                unknown tail, bad input, overloaded, deadline); ``code`` says which.
        """
        device = self.claimed or request.device_id
        if not _DEVICE_RE.match(device):
            self.drop(DropReason.BAD_INFER, f"no device: {device[:64]!r}")
            raise _refused("permission-denied", "this channel names no device")
        try:
            known = await self.core.is_known(device)
        except StoreError as exc:
            self.drop(DropReason.STORE_ERROR, exc)
            raise _refused("unavailable", "the hub cannot serve you now") from exc
        if not known:
            self.drop(DropReason.UNKNOWN_DEVICE, "infer")
            raise _refused("permission-denied", "register first")
        try:
            return await self.core.tails.infer(device, request, deadline_s=deadline_s)
        except StoreError as exc:
            self.drop(DropReason.STORE_ERROR, exc)
            raise _refused("unavailable", "the hub cannot serve you now") from exc

    async def infer_payload(self, payload: bytes) -> pb.InferResponse:
        """Parse an ``InferRequest`` (MQTT carries bytes) and run it as :meth:`infer`.

        Raises:
            TailRefusedError: The payload is over the cap or not a request, or as
                :meth:`infer`.
        """
        if len(payload) > MAX_INFER_BYTES:
            self.drop(DropReason.OVERSIZED, f"inference request of {len(payload)} bytes")
            raise _refused("invalid-argument", f"requests are at most {MAX_INFER_BYTES} bytes")
        request = pb.InferRequest()
        try:
            request.ParseFromString(payload)
        except DecodeError as exc:
            self.drop(DropReason.MALFORMED, exc)
            raise _refused("invalid-argument", "not an inference request") from exc
        return await self.infer(request)


def _refused(code: str, message: str) -> TailRefusedError:
    return TailRefusedError(code, message)
