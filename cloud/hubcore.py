"""What the hub does with device messages, whichever transport carried them.

The gRPC and MQTT servers are thin adapters over :class:`HubCore`: they turn
bytes into envelopes, bind a connection to one device id, and send back what
the core returns. All device state lives in the store, so any number of hub
processes can serve the same fleet.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import Counter
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import BinaryIO

from cloud.errors import ValidationError
from cloud.selectors import parse_labels
from cloud.store import DesiredRecord, SkillStatusRecord, Store, TelemetryRecord
from cloud.telemetry_batcher import BatcherSettings, TelemetryBatcher
from protos import kind_of, make_envelope, pb
from protos.envelope import now_ms
from protos.errors import ProtocolError
from skills.trust import TrustRepository

log = logging.getLogger(__name__)

DEVICE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@dataclass(frozen=True)
class HubLimits:
    """Caps on what devices may send and fetch."""

    max_fetch_bytes: int = 512 * 1024 * 1024
    chunk_bytes: int = 64 * 1024
    max_labels: int = 32
    max_skills_reported: int = 64
    #: Telemetry group commit: windows per transaction, and the longest wait for a batch.
    telemetry_batch_items: int = 256
    telemetry_linger_s: float = 0.001


def check_device_id(device_id: str) -> str:
    """Return ``device_id`` if well formed.

    Raises:
        ProtocolError: empty, too long or with characters outside ``[A-Za-z0-9._-]``.
    """
    if not DEVICE_ID_RE.match(device_id):
        raise ProtocolError(f"bad device id {device_id!r}")
    return device_id


def desired_envelope(device_id: str, desired: DesiredRecord) -> pb.Envelope:
    """The desired state of one device as an envelope."""
    body = pb.DesiredState(generation=desired.generation)
    for skill in desired.skills:
        body.skills.add(
            name=skill.name,
            version=skill.version,
            target_name=skill.target_name,
            config=dict(skill.config),
        )
    return make_envelope(device_id, desired=body)


class HubCore:
    """Transport-independent handling of device traffic."""

    def __init__(
        self, store: Store, trust: TrustRepository, limits: HubLimits | None = None
    ) -> None:
        self.store = store
        self.trust = trust
        self.limits = limits or HubLimits()
        self.heartbeat_s = 5
        #: Messages dropped, by reason; exported as metrics.
        self.dropped: Counter[str] = Counter()
        self.handled: Counter[str] = Counter()
        self.telemetry = TelemetryBatcher(
            store.add_telemetry_many,
            store.check_telemetry,
            BatcherSettings(
                max_items=self.limits.telemetry_batch_items,
                linger_s=self.limits.telemetry_linger_s,
            ),
        )

    async def close(self) -> None:
        """Write the telemetry still waiting for its batch; later telemetry is refused."""
        await self.telemetry.close()

    async def register(self, env: pb.Envelope) -> list[pb.Envelope]:
        """Handle a device's ``register``; return the welcome and its desired state.

        Raises:
            ProtocolError: not a register message, or bad device id or labels.
        """
        if kind_of(env) != "register":
            raise ProtocolError("the first message on a connection must be register")
        device_id = check_device_id(env.device_id)
        reg = env.register
        if len(reg.labels) > self.limits.max_labels:
            raise ProtocolError(f"more than {self.limits.max_labels} labels")
        try:
            labels = parse_labels(f"{k}={v}" for k, v in reg.labels.items())
        except ValidationError as exc:
            raise ProtocolError(str(exc)) from exc
        profile = {
            "arch": reg.profile.arch,
            "accelerator": reg.profile.accelerator,
            "board": reg.profile.board,
            "targets": list(reg.profile.targets),
            "cpu_count": reg.profile.cpu_count,
            "memory_bytes": reg.profile.memory_bytes,
            "agent_version": reg.agent_version,
        }
        await asyncio.to_thread(
            self.store.register_device, device_id, labels, profile, now_ms=now_ms()
        )
        self.handled["register"] += 1
        welcome = make_envelope(
            device_id, correlation_id=env.id, welcome=pb.Welcome(heartbeat_s=self.heartbeat_s)
        )
        return [welcome, await self.desired(device_id)]

    async def desired(self, device_id: str) -> pb.Envelope:
        """The device's current desired state as an envelope."""
        record = await asyncio.to_thread(self.store.desired_for, device_id)
        return desired_envelope(device_id, record)

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
            await asyncio.to_thread(
                self.store.touch_device, device_id, now_ms=now_ms(), online=True
            )
        elif kind == "reported":
            # The device's send time orders its reports (clamped: a fast clock must not
            # freeze them); a redelivered older report then cannot hide a newer one.
            made_ms = min(env.sent_at_ms, now_ms()) if env.sent_at_ms > 0 else now_ms()
            await asyncio.to_thread(self._save_report, device_id, env.reported, made_ms)
        elif kind == "telemetry":
            record = telemetry_record(env.telemetry)
            # Acked only after the batch holding it committed (end-to-end ack).
            await self.telemetry.submit(env.id, device_id, record)
        elif kind != "ack":
            raise ProtocolError(f"devices may not send {kind!r}")
        self.handled[kind] += 1
        if kind in ("reported", "telemetry"):
            return [make_envelope(device_id, correlation_id=env.id, ack=pb.Ack(ids=[env.id]))]
        return []

    def _save_report(self, device_id: str, report: pb.ReportedState, made_ms: int) -> None:
        if len(report.skills) > self.limits.max_skills_reported:
            raise ProtocolError(f"report lists more than {self.limits.max_skills_reported} skills")
        statuses = [
            SkillStatusRecord(
                name=s.name[:64],
                version=s.version[:64],
                state=s.state[:32],
                error=s.error[:2000],
                desired_version=s.desired_version[:64],
                previous_version=s.previous_version[:64],
                variant=s.variant[:256],
            )
            for s in report.skills
        ]
        self.store.save_report(device_id, report.generation, statuses, now_ms=made_ms)

    async def disconnected(self, device_id: str) -> None:
        """Mark a device offline after its connection ended."""
        await asyncio.to_thread(self.store.touch_device, device_id, now_ms=now_ms(), online=False)

    def drop(self, reason: str) -> None:
        """Count a message the hub refused."""
        self.dropped[reason] += 1

    def open_fetch(
        self, path: str, offset: int, max_bytes: int
    ) -> tuple[int, Generator[bytes, None, None]]:
        """Open a repository file for a chunked fetch from ``offset``.

        Returns:
            The file's total size and an iterator of chunks.

        Raises:
            FileNotFoundError: no such file.
            ProtocolError: a bad path, a negative offset, or a file over the cap.
        """
        parts = PurePosixPath(path).parts
        if (
            not parts
            or parts[0] not in ("metadata", "targets")
            or ".." in parts
            or path.startswith("/")
        ):
            raise ProtocolError(f"bad fetch path {path!r}")
        cap = min(max_bytes or self.limits.max_fetch_bytes, self.limits.max_fetch_bytes)
        size, fh = self.trust.open_file(path)
        if size > cap:
            fh.close()
            raise ProtocolError(f"{path} has {size} bytes, over the {cap} byte cap")
        if offset < 0 or offset > size:
            fh.close()
            raise ProtocolError(f"offset {offset} outside {path}")
        fh.seek(offset)
        return size, _chunks(fh, self.limits.chunk_bytes)


def _chunks(fh: BinaryIO, size: int) -> Generator[bytes, None, None]:
    with fh:
        while chunk := fh.read(size):
            yield chunk


def telemetry_record(msg: pb.Telemetry) -> TelemetryRecord:
    """Convert a wire telemetry message to a store record.

    The store validates it (names, counters, ``correct <= labelled <= inferences``,
    metric caps); :meth:`HubCore.handle` turns its refusal into a ProtocolError.
    """
    return TelemetryRecord(
        skill=msg.skill,
        version=msg.version,
        inferences=msg.inferences,
        labelled=msg.labelled,
        correct=msg.correct,
        latency_p50_ms=msg.latency_p50_ms,
        latency_p99_ms=msg.latency_p99_ms,
        window_start_ms=msg.window_start_ms,
        window_end_ms=msg.window_end_ms,
        dropped_messages=msg.dropped_messages,
        metrics=dict(msg.metrics),
        received_ms=now_ms(),
    )
