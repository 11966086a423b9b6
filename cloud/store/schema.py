"""Tables of the hub's store (the model factory's are in :mod:`cloud.store.models_schema`).

This metadata is the model Alembic's migrations must match; a test compares
them. Change a table here, then add a migration under ``cloud/migrations``.
JSON payloads are kept as text written by the store in canonical form, so
that both dialects store and compare them the same way.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
)

__all__ = [
    "deployments",
    "desired_states",
    "device_groups",
    "device_labels",
    "device_security_events",
    "devices",
    "director_instructions",
    "fleet_controls",
    "fleet_stamp",
    "hub_events",
    "metadata",
    "reported_states",
    "rollouts",
    "skill_versions",
    "telemetry",
]

# Fixed constraint names keep migrations identical on SQLite and PostgreSQL.
metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

ID_LEN = 128
NAME_LEN = 64

# SQLite only auto-numbers a column declared exactly INTEGER PRIMARY KEY.
_BIG_ID = BigInteger().with_variant(Integer(), "sqlite")

devices = Table(
    "devices",
    metadata,
    Column("device_id", String(ID_LEN), primary_key=True),
    Column("profile", Text, nullable=False),
    Column("last_seen_ms", BigInteger, nullable=False),
    Column("online", Boolean, nullable=False),
    # The heartbeat interval the hub gave the device when it last connected (0: not
    # known yet); presence is derived from it and last_seen_ms, not from ``online``.
    Column("heartbeat_ms", BigInteger, nullable=False, server_default="0"),
    # The tenant the device belongs to: fixed at enrolment by the claim token.
    Column("project", String(NAME_LEN), nullable=False, server_default="default"),
    Index(None, "project", "device_id"),
)

# One row per label so that selectors are answered by the database.
device_labels = Table(
    "device_labels",
    metadata,
    Column(
        "device_id",
        String(ID_LEN),
        ForeignKey("devices.device_id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("key", String(NAME_LEN), primary_key=True),
    Column("value", String(NAME_LEN), nullable=False),
    Index(None, "key", "value"),
)

device_groups = Table(
    "device_groups",
    metadata,
    Column("name", String(NAME_LEN), primary_key=True),
    Column("selector", Text, nullable=False),
    Column("project", String(NAME_LEN), nullable=False, server_default="default"),
)

skill_versions = Table(
    "skill_versions",
    metadata,
    Column("name", String(NAME_LEN), primary_key=True),
    Column("version", String(NAME_LEN), primary_key=True),
    Column("target_name", String(255), nullable=False),
    Column("sha256", String(64), nullable=False),
    Column("size", BigInteger, nullable=False),
    Column("manifest", Text, nullable=False),
    Column("created_ms", BigInteger, nullable=False),
    Column("project", String(NAME_LEN), nullable=False, server_default="default"),
)

deployments = Table(
    "deployments",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("skill", String(NAME_LEN), nullable=False),
    Column("version", String(NAME_LEN), nullable=False),
    Column("group_name", String(NAME_LEN), ForeignKey("device_groups.name"), nullable=False),
    Column("strategy", String(NAME_LEN), nullable=False),
    Column("config", Text, nullable=False),
    Column("state", String(16), nullable=False),
    Column("created_ms", BigInteger, nullable=False),
    # Higher wins over lower on the devices two deployments of a skill both select.
    Column("priority", Integer, nullable=False, server_default="0"),
    Column("project", String(NAME_LEN), nullable=False, server_default="default"),
    ForeignKeyConstraint(
        ["skill", "version"],
        ["skill_versions.name", "skill_versions.version"],
        name="fk_deployments_skill_skill_versions",
    ),
    Index(None, "state", "skill"),
)

# A staged deployment's rollout: its plan, the engine's state, and what the rule reads.
# ``admitted`` is the canonical JSON {device: version} the deployment reaches, or NULL
# once it reaches every selected device; ``commands`` the operator's [kind, at_ms] list.
rollouts = Table(
    "rollouts",
    metadata,
    Column(
        "deployment_id",
        Integer,
        ForeignKey("deployments.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("plan", Text, nullable=False),
    Column("state", Text, nullable=False),
    Column("phase", String(16), nullable=False),
    Column("admitted", Text, nullable=True),
    Column("commands", Text, nullable=False),
    Column("updated_ms", BigInteger, nullable=False),
    # One more with every pass stored: a pass stores only over the revision it read, and
    # the leader reads the state and ``admitted`` again only when another process moved it.
    Column("revision", BigInteger, nullable=False, server_default="0"),
    Index(None, "phase"),
)

# One row (id 1) holding the fleet-wide stop switch; no row means off.
fleet_controls = Table(
    "fleet_controls",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("stopped", Boolean, nullable=False),
    Column("changed_ms", BigInteger, nullable=False),
)

# Counters of the writes to what rollout passes read of the fleet (devices, labels,
# groups, reports), striped over a few rows (:mod:`cloud.store.fleet_stamp`).
fleet_stamp = Table(
    "fleet_stamp",
    metadata,
    Column("slot", Integer, primary_key=True, autoincrement=False),
    Column("changes", BigInteger, nullable=False),
    Column("refreshes", BigInteger, nullable=False),
    Column("reports", BigInteger, nullable=False, server_default="0"),
)

desired_states = Table(
    "desired_states",
    metadata,
    Column(
        "device_id",
        String(ID_LEN),
        ForeignKey("devices.device_id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("generation", BigInteger, nullable=False),
    Column("skills", Text, nullable=False),
)

reported_states = Table(
    "reported_states",
    metadata,
    Column(
        "device_id",
        String(ID_LEN),
        ForeignKey("devices.device_id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("generation", BigInteger, nullable=False),
    Column("skills", Text, nullable=False),
    Column("reported_ms", BigInteger, nullable=False),
    # When the hub stored it, by the hub's clock (NULL: before migration 0011); a rollout
    # pass reads only the reports stored lately when the fleet stamp says only reports moved.
    Column("stored_ms", BigInteger, nullable=True),
    Index(None, "stored_ms"),
)

# The director's latest signed instruction per device. No foreign key to devices:
# the counter must survive a device's removal, or a re-registered device would
# be sent counters it already saw and refuse them as replays.
director_instructions = Table(
    "director_instructions",
    metadata,
    Column("device_id", String(ID_LEN), primary_key=True),
    Column("counter", BigInteger, nullable=False),
    Column("generation", BigInteger, nullable=False),
    Column("expires_ms", BigInteger, nullable=False),
    Column("signed_ms", BigInteger, nullable=False),
    Column("payload_sha256", String(64), nullable=False),
    Column("instruction", LargeBinary, nullable=False),
)

# What devices refused or contained, as they reported it (coalesced per window).
device_security_events = Table(
    "device_security_events",
    metadata,
    Column("id", _BIG_ID, primary_key=True, autoincrement=True),
    Column("msg_id", String(ID_LEN), nullable=False, unique=True),
    Column("device_id", String(ID_LEN), nullable=False),
    Column("kind", String(NAME_LEN), nullable=False),
    Column("reason", String(NAME_LEN), nullable=False),
    Column("subject", String(255), nullable=False),
    Column("detail", Text, nullable=False),
    Column("count", BigInteger, nullable=False),
    Column("received_ms", BigInteger, nullable=False),
    Index(None, "device_id", "received_ms"),
    Index(None, "kind", "reason"),
)

# What happened in the fleet, newest last: deployments, skill state transitions on
# devices, connections, refusals. No foreign key: events outlive a removed device.
# ``device_id`` is '' for events that concern no single device.
hub_events = Table(
    "hub_events",
    metadata,
    Column("id", _BIG_ID, primary_key=True, autoincrement=True),
    Column("at_ms", BigInteger, nullable=False),
    Column("kind", String(NAME_LEN), nullable=False),
    Column("device_id", String(ID_LEN), nullable=False),
    Column("subject", String(255), nullable=False),
    Column("message", Text, nullable=False),
    Index(None, "device_id", "id"),
    Index(None, "kind", "id"),
)

# No foreign key to devices: telemetry is never refused for want of a device row.
telemetry = Table(
    "telemetry",
    metadata,
    Column("id", _BIG_ID, primary_key=True, autoincrement=True),
    Column("msg_id", String(ID_LEN), nullable=False, unique=True),
    Column("device_id", String(ID_LEN), nullable=False),
    Column("skill", String(NAME_LEN), nullable=False),
    Column("version", String(NAME_LEN), nullable=False),
    Column("inferences", BigInteger, nullable=False),
    Column("labelled", BigInteger, nullable=False),
    Column("correct", BigInteger, nullable=False),
    Column("latency_p50_ms", Float, nullable=False),
    Column("latency_p99_ms", Float, nullable=False),
    Column("latency_p95_ms", Float, nullable=False, server_default="0"),
    Column("errors", BigInteger, nullable=False, server_default="0"),
    Column("window_start_ms", BigInteger, nullable=False),
    Column("window_end_ms", BigInteger, nullable=False),
    Column("dropped_messages", BigInteger, nullable=False),
    Column("metrics", Text, nullable=False),
    Column("received_ms", BigInteger, nullable=False),
    Index(None, "device_id", "skill", "window_end_ms"),
    Index(None, "skill"),
)

from cloud.store import access_schema as _access_schema  # noqa: E402, F401 - console access
from cloud.store import drift_schema as _drift_schema  # noqa: E402, F401 - drift loop tables
from cloud.store import models_schema as _models_schema  # noqa: E402, F401 - model factory tables
