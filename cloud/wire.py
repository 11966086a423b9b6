"""Conversions between wire messages and the hub store's records."""

from __future__ import annotations

from cloud.store import DesiredRecord, TelemetryRecord
from protos import make_envelope, pb
from protos.envelope import now_ms

__all__ = ["desired_envelope", "device_profile", "telemetry_record"]


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
