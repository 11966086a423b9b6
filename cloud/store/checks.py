"""Checks on everything the store is asked to write, run before any write.

Public: the model factory checks names, versions and hashes the same way.
"""

from __future__ import annotations

import json
import math
import operator
import re
from collections.abc import Mapping, Sequence

from cloud.errors import ValidationError
from cloud.store.records import SkillStatusRecord, TelemetryRecord
from protos import limits

# The wire's caps (protos.limits) are the store's: what a device may send, the store keeps.
MAX_PROFILE_BYTES = 64 * 1024
MAX_MANIFEST_BYTES = 1024 * 1024
MAX_CONFIG_ENTRIES = limits.MAX_CONFIG_ENTRIES
MAX_CONFIG_VALUE_LEN = limits.MAX_CONFIG_VALUE_BYTES
MAX_METRICS = limits.MAX_METRICS
MAX_REPORTED_SKILLS = limits.MAX_REPORTED_SKILLS
MAX_ERROR_LEN = limits.MAX_ERROR_CHARS
MAX_TELEMETRY_BATCH = 10_000
MAX_COUNTER = 2**62

_DEVICE_ID_RE = re.compile(limits.DEVICE_ID_PATTERN)
_NAME_RE = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{limits.MAX_NAME_CHARS - 1}}}")
_VERSION_RE = re.compile(rf"[A-Za-z0-9][A-Za-z0-9.+_-]{{0,{limits.MAX_VERSION_CHARS - 1}}}")
_MSG_ID_RE = re.compile(rf"[A-Za-z0-9._:-]{{1,{limits.MAX_MESSAGE_ID_CHARS}}}")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_TARGET_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+/-]{0,254}")
_STATE_RE = re.compile(rf"[A-Za-z0-9_-]{{1,{limits.MAX_STATE_CHARS}}}")
_CONFIG_KEY_RE = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{limits.MAX_NAME_CHARS - 1}}}")
_METRIC_RE = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._/-]{{0,{limits.MAX_METRIC_NAME_CHARS - 1}}}")


def _check(pattern: re.Pattern[str], value: object, what: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise ValidationError(f"bad {what} {value!r}")
    return value


def device_id(value: str) -> str:
    """Raises: ValidationError: not 1-128 characters of ``[A-Za-z0-9._-]``."""
    return _check(_DEVICE_ID_RE, value, "device id")


def name(value: str, what: str = "name") -> str:
    """Raises: ValidationError: not a 1-64 character name."""
    return _check(_NAME_RE, value, what)


def version(value: str) -> str:
    """Raises: ValidationError: not a 1-64 character version string."""
    return _check(_VERSION_RE, value, "version")


def msg_id(value: str) -> str:
    """Raises: ValidationError: not a 1-128 character message id."""
    return _check(_MSG_ID_RE, value, "message id")


def metric_name(value: str) -> str:
    """Raises: ValidationError: not a 1-64 character metric name."""
    return _check(_METRIC_RE, value, "metric name")


def sha256(value: str) -> str:
    """Raises: ValidationError: not 64 lower-case hex digits."""
    return _check(_SHA256_RE, value, "sha256")


def target_name(value: str) -> str:
    """Raises: ValidationError: not a relative target path of at most 255 characters."""
    _check(_TARGET_RE, value, "target name")
    if ".." in value.split("/"):
        raise ValidationError(f"bad target name {value!r}")
    return value


def counter(value: int, what: str) -> int:
    """Raises: ValidationError: not an int in [0, 2**62]."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNTER:
        raise ValidationError(f"bad {what} {value!r}")
    return value


def text(value: str, what: str, max_bytes: int) -> str:
    """Raises: ValidationError: not a str or longer than ``max_bytes`` in UTF-8."""
    if not isinstance(value, str) or len(value.encode("utf-8", "surrogatepass")) > max_bytes:
        raise ValidationError(f"{what} missing or over {max_bytes} bytes")
    return value


def config(values: Mapping[str, str] | None) -> dict[str, str]:
    """Raises: ValidationError: too many entries, or a bad key or value."""
    values = dict(values or {})
    if len(values) > MAX_CONFIG_ENTRIES:
        raise ValidationError(f"config has more than {MAX_CONFIG_ENTRIES} entries")
    for key, value in values.items():
        _check(_CONFIG_KEY_RE, key, "config key")
        text(value, f"config value of {key!r}", MAX_CONFIG_VALUE_LEN)
    return values


def profile_json(profile: Mapping[str, object]) -> str:
    """Encode a device profile as canonical JSON.

    Raises:
        ValidationError: not JSON-serialisable or over the size cap.
    """
    try:
        encoded = json.dumps(dict(profile), sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValidationError(f"device profile is not plain JSON: {exc}") from exc
    return text(encoded, "device profile", MAX_PROFILE_BYTES)


def statuses(skills: Sequence[SkillStatusRecord]) -> list[SkillStatusRecord]:
    """Raises: ValidationError: too many skills, or a malformed status."""
    if len(skills) > MAX_REPORTED_SKILLS:
        raise ValidationError(f"report lists more than {MAX_REPORTED_SKILLS} skills")
    for status in skills:
        name(status.name, "skill name")
        for field_name in ("version", "desired_version", "previous_version"):
            value = getattr(status, field_name)
            if value:
                version(value)
        _check(_STATE_RE, status.state, "skill state")
        text(status.error, "error text", MAX_ERROR_LEN)
        text(status.variant, "variant", limits.MAX_VARIANT_CHARS)
    return list(skills)


def _finite(value: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValidationError(f"bad {what} {value!r}")
    return float(value)


_TELEMETRY_COUNTERS = (
    "inferences",
    "labelled",
    "correct",
    "errors",
    "dropped_messages",
    "window_start_ms",
    "window_end_ms",
    "received_ms",
)
_telemetry_counters = operator.attrgetter(*_TELEMETRY_COUNTERS)
_INT_ONLY = {int}


def telemetry(record: TelemetryRecord) -> None:
    """Raises: ValidationError: a malformed or inconsistent telemetry window."""
    name(record.skill, "skill name")
    version(record.version)
    # All eight counters at once, the usual case; field by field only to say which is bad.
    # (Run for every window a hub stores: the loop over the fields cost a microsecond more.)
    counters = _telemetry_counters(record)
    if set(map(type, counters)) != _INT_ONLY or min(counters) < 0 or max(counters) > MAX_COUNTER:
        for field_name in _TELEMETRY_COUNTERS:
            counter(getattr(record, field_name), field_name)
    if record.correct > record.labelled or record.labelled > record.inferences:
        raise ValidationError("telemetry needs correct <= labelled <= inferences")
    if record.errors > record.inferences:
        raise ValidationError("telemetry needs errors <= inferences")
    for field_name in ("latency_p50_ms", "latency_p95_ms", "latency_p99_ms"):
        if _finite(getattr(record, field_name), field_name) < 0:
            raise ValidationError(f"negative {field_name}")
    if len(record.metrics) > MAX_METRICS:
        raise ValidationError(f"more than {MAX_METRICS} telemetry metrics")
    for key, value in record.metrics.items():
        metric_name(key)
        _finite(value, f"metric {key!r}")
