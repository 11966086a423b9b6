"""The hub's model factory: data set versions, training jobs, compressed variants,
per-target artefacts and their lineage, with model files in a content-addressed blob store.

The factory (jobs runner, blobs, builds, data sets) lives here; its records and
tables sit with the other tables in :mod:`cloud.store` (``model_records``,
``models``, ``jobs``) and are re-exported here for callers of the factory.
Importing this package does not import torch; the steps that need it load it when run.
"""

from cloud.models.blobs import BlobStore
from cloud.models.errors import BlobError, FactoryError, JobError
from cloud.models.factory import ModelFactory
from cloud.models.jobs import JobRunner
from cloud.store.model_records import (
    JOB_FAILED,
    JOB_QUEUED,
    JOB_RUNNING,
    JOB_STATES,
    JOB_SUCCEEDED,
    ArtifactDraft,
    ArtifactFile,
    ArtifactRecord,
    DatasetRecord,
    EpochRecord,
    JobRecord,
    Lineage,
    ModelDraft,
    ModelRecord,
    VariantDraft,
    VariantMetrics,
    VariantRecord,
)
from cloud.store.models import ModelTables

__all__ = [
    "JOB_FAILED",
    "JOB_QUEUED",
    "JOB_RUNNING",
    "JOB_STATES",
    "JOB_SUCCEEDED",
    "ArtifactDraft",
    "ArtifactFile",
    "ArtifactRecord",
    "BlobError",
    "BlobStore",
    "DatasetRecord",
    "EpochRecord",
    "FactoryError",
    "JobError",
    "JobRecord",
    "JobRunner",
    "Lineage",
    "ModelDraft",
    "ModelFactory",
    "ModelRecord",
    "ModelTables",
    "VariantDraft",
    "VariantMetrics",
    "VariantRecord",
]
