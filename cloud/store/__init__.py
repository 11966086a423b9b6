"""The hub's store (SQLAlchemy + Alembic; SQLite or PostgreSQL).

Open it with :func:`open_store`; every :class:`Store` method is one
transaction and returns frozen records from :mod:`cloud.store.records`.
"""

from cloud.store.records import (
    DEPLOYMENT_ABORTED,
    DEPLOYMENT_ACTIVE,
    DeploymentRecord,
    DesiredRecord,
    DesiredSkill,
    DeviceRecord,
    DeviceSkillSummary,
    DeviceStateRecord,
    GroupRecord,
    InstructionRecord,
    ReportedRecord,
    SecurityEventRecord,
    SkillStatusRecord,
    SkillVersionRecord,
    TelemetryRecord,
)
from cloud.store.store import Store, open_store

__all__ = [
    "DEPLOYMENT_ABORTED",
    "DEPLOYMENT_ACTIVE",
    "DeploymentRecord",
    "DesiredRecord",
    "DesiredSkill",
    "DeviceRecord",
    "DeviceSkillSummary",
    "DeviceStateRecord",
    "GroupRecord",
    "InstructionRecord",
    "ReportedRecord",
    "SecurityEventRecord",
    "SkillStatusRecord",
    "SkillVersionRecord",
    "Store",
    "TelemetryRecord",
    "open_store",
]
