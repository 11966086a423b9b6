"""Conversions between wire messages and the hub store's records."""

from __future__ import annotations

from cloud.store import DesiredRecord, SecurityEventRecord, SkillStatusRecord, TelemetryRecord
from cloud.store.telemetry import TelemetryWindow, window_fields
from protos import kind_of, make_envelope, pb
from protos.envelope import now_ms
from protos.errors import ProtocolError
from protos.limits import (
    MAX_ERROR_CHARS,
    MAX_NAME_CHARS,
    MAX_STATE_CHARS,
    MAX_VARIANT_CHARS,
    MAX_VERSION_CHARS,
)
from skills.trust.director import InstructionError, SignedInstruction

__all__ = [
    "DESIRED_KINDS",
    "desired_envelope",
    "desired_message",
    "desired_revision",
    "device_profile",
    "security_event_record",
    "skill_status_records",
    "telemetry_record",
    "telemetry_window",
    "topic_kind",
]

#: Envelope kinds that carry a device's desired state (signed, or plain in insecure mode).
DESIRED_KINDS = frozenset({"desired", "signed_desired"})


def desired_message(desired: DesiredRecord) -> pb.DesiredState:
    """The desired state of one device as the wire message the director signs."""
    body = pb.DesiredState(generation=desired.generation)
    for skill in desired.skills:
        body.skills.add(
            name=skill.name,
            version=skill.version,
            target_name=skill.target_name,
            config=dict(skill.config),
        )
    return body


def desired_envelope(device_id: str, desired: DesiredRecord) -> pb.Envelope:
    """The desired state of one device as a plain (unsigned, insecure mode) envelope."""
    return make_envelope(device_id, desired=desired_message(desired))


def topic_kind(env: pb.Envelope) -> str:
    """The MQTT topic kind an envelope is published under: signed desired state goes on
    ``down/desired``, like the plain one it replaces; everything else under its own kind.

    Raises:
        ProtocolError: the envelope carries no body.
    """
    kind = kind_of(env)
    return "desired" if kind in DESIRED_KINDS else kind


def desired_revision(env: pb.Envelope) -> int | None:
    """What orders a device's desired-state messages: the director's counter for a
    signed one, the generation for a plain one; None for other kinds or a malformed
    instruction. Not verified: for the hub's bookkeeping of what it published only.
    """
    try:
        kind = kind_of(env)
    except ProtocolError:
        return None
    if kind == "desired":
        return env.desired.generation
    if kind != "signed_desired":
        return None
    try:
        return SignedInstruction.from_bytes(env.signed_desired.instruction).instruction.counter
    except InstructionError:
        return None


def security_event_record(msg: pb.SecurityEvent) -> SecurityEventRecord:
    """Convert a device's security event to a store record (the store checks and cuts it)."""
    return SecurityEventRecord(
        device_id="",
        kind=msg.kind,
        reason=msg.reason,
        subject=msg.subject,
        detail=msg.detail,
        count=max(1, msg.count),
        received_ms=now_ms(),
    )


def device_profile(reg: pb.Register) -> dict[str, object]:
    """The hardware profile a register message carries, as the store keeps it."""
    return {
        "arch": reg.profile.arch,
        "accelerator": reg.profile.accelerator,
        "board": reg.profile.board,
        "targets": list(reg.profile.targets),
        "cpu_count": reg.profile.cpu_count,
        "memory_bytes": reg.profile.memory_bytes,
        "agent_version": reg.agent_version,
    }


def telemetry_record(msg: pb.Telemetry, received_ms: int | None = None) -> TelemetryRecord:
    """Convert a wire telemetry message to a store record, received now unless told.

    The store validates it (names, counters, ``correct <= labelled <= inferences``,
    metric caps); :meth:`HubCore.handle` turns its refusal into a ProtocolError.
    """
    metrics = msg.metrics  # read by key: dict() of a protobuf map walks it much slower
    return TelemetryRecord(
        skill=msg.skill,
        version=msg.version,
        inferences=msg.inferences,
        labelled=msg.labelled,
        correct=msg.correct,
        latency_p50_ms=msg.latency_p50_ms,
        latency_p99_ms=msg.latency_p99_ms,
        latency_p95_ms=msg.latency_p95_ms,
        errors=msg.errors,
        window_start_ms=msg.window_start_ms,
        window_end_ms=msg.window_end_ms,
        dropped_messages=msg.dropped_messages,
        metrics={name: metrics[name] for name in metrics},
        received_ms=now_ms() if received_ms is None else received_ms,
    )


def telemetry_window(
    msg_id: str, device_id: str, msg: pb.Telemetry, received_ms: int
) -> TelemetryWindow:
    """A wire telemetry message as the window the store checks and keeps.

    What :func:`telemetry_record` gives without the record: the ingest makes one per
    message it stores, and the record cost more than the fields it holds.
    """
    metrics = msg.metrics  # read by key: dict() of a protobuf map walks it much slower
    values = {name: metrics[name] for name in metrics} if metrics else {}
    return (msg_id, device_id, *window_fields(msg), values, received_ms)


def skill_status_records(report: pb.ReportedState) -> list[SkillStatusRecord]:
    """The skills of a device's report as store records, each field cut to its cap."""
    return [
        SkillStatusRecord(
            name=s.name[:MAX_NAME_CHARS],
            version=s.version[:MAX_VERSION_CHARS],
            state=s.state[:MAX_STATE_CHARS],
            error=s.error[:MAX_ERROR_CHARS],
            desired_version=s.desired_version[:MAX_VERSION_CHARS],
            previous_version=s.previous_version[:MAX_VERSION_CHARS],
            variant=s.variant[:MAX_VARIANT_CHARS],
        )
        for s in report.skills
    ]
