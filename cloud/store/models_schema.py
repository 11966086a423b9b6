"""Tables of the model factory: dataset versions, training jobs, models, variants, artefacts.

They live on the store's one :data:`cloud.store.schema.metadata`, so Alembic's
comparison covers them; ``cloud/migrations/versions/0002_model_factory.py``
creates them. Lineage runs dataset version → training job → model → variant
→ per-target artefact → skill versions. Model files themselves are blobs
(``<home>/blobs/sha256/..``); rows hold their sha256.
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
    String,
    Table,
    Text,
    UniqueConstraint,
)

from cloud.store.schema import NAME_LEN, metadata

__all__ = [
    "dataset_versions",
    "model_artifacts",
    "model_variants",
    "models",
    "skill_models",
    "training_epochs",
    "training_jobs",
]

HASH_LEN = 64
TAG_LEN = 32

dataset_versions = Table(
    "dataset_versions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(NAME_LEN), nullable=False),
    Column("version", Integer, nullable=False),
    Column("kind", String(16), nullable=False),
    Column("location", String(255), nullable=False),
    Column("content_hash", String(80), nullable=False),
    Column("classes", Text, nullable=False),
    Column("samples", Integer, nullable=False),
    Column("created_ms", BigInteger, nullable=False),
    UniqueConstraint("name", "version"),
    UniqueConstraint("name", "content_hash"),
)

training_jobs = Table(
    "training_jobs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("dataset_id", Integer, ForeignKey("dataset_versions.id"), nullable=False),
    Column("model_name", String(NAME_LEN), nullable=False),
    Column("arch", String(TAG_LEN), nullable=False),
    Column("spec", Text, nullable=False),
    Column("epochs", Integer, nullable=False),
    Column("status", String(16), nullable=False),
    Column("pid", Integer, nullable=True),
    Column("error", Text, nullable=True),
    Column("resumed_from_epoch", Integer, nullable=True),
    Column("created_ms", BigInteger, nullable=False),
    Column("started_ms", BigInteger, nullable=True),
    Column("finished_ms", BigInteger, nullable=True),
    Index(None, "status"),
)

training_epochs = Table(
    "training_epochs",
    metadata,
    Column(
        "job_id",
        Integer,
        ForeignKey("training_jobs.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("epoch", Integer, primary_key=True),
    Column("train_loss", Float, nullable=False),
    Column("val_accuracy", Float, nullable=False),
    Column("seconds", Float, nullable=False),
)

models = Table(
    "models",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(NAME_LEN), nullable=False, unique=True),
    Column("arch", String(TAG_LEN), nullable=False),
    Column("job_id", Integer, ForeignKey("training_jobs.id"), nullable=True, unique=True),
    Column("dataset_id", Integer, ForeignKey("dataset_versions.id"), nullable=True),
    Column("weights_sha256", String(HASH_LEN), nullable=True),
    Column("onnx_sha256", String(HASH_LEN), nullable=False),
    Column("onnx_size", BigInteger, nullable=False),
    Column("test_accuracy", Float, nullable=True),
    Column("image_size", Integer, nullable=False),
    Column("split_seed", Integer, nullable=False),
    Column("created_ms", BigInteger, nullable=False),
)

model_variants = Table(
    "model_variants",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("model_id", Integer, ForeignKey("models.id"), nullable=False),
    Column("name", String(TAG_LEN), nullable=False),
    Column("quantized", Boolean, nullable=False),
    Column("onnx_sha256", String(HASH_LEN), nullable=False),
    Column("onnx_size", BigInteger, nullable=False),
    Column("tflite_sha256", String(HASH_LEN), nullable=True),
    Column("weights_sha256", String(HASH_LEN), nullable=True),
    Column("accuracy", Float, nullable=False),
    Column("accuracy_loss_pt", Float, nullable=False),
    Column("size_ratio", Float, nullable=False),
    Column("meets_bar", Boolean, nullable=False),
    Column("report", Text, nullable=False),
    Column("created_ms", BigInteger, nullable=False),
    UniqueConstraint("model_id", "name"),
)

model_artifacts = Table(
    "model_artifacts",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("variant_id", Integer, ForeignKey("model_variants.id"), nullable=False),
    Column("target", String(TAG_LEN), nullable=False),
    Column("sha256", String(HASH_LEN), nullable=False),
    Column("files", Text, nullable=False),
    Column("max_abs_diff", Float, nullable=False),
    Column("tolerance", Float, nullable=False),
    Column("checked_with", String(TAG_LEN), nullable=False),
    Column("notes", Text, nullable=False),
    Column("created_ms", BigInteger, nullable=False),
    UniqueConstraint("variant_id", "target"),
    Index(None, "sha256"),
)

skill_models = Table(
    "skill_models",
    metadata,
    Column("artifact_id", Integer, ForeignKey("model_artifacts.id"), primary_key=True),
    Column("skill", String(NAME_LEN), primary_key=True),
    Column("version", String(NAME_LEN), primary_key=True),
    ForeignKeyConstraint(
        ["skill", "version"],
        ["skill_versions.name", "skill_versions.version"],
        name="fk_skill_models_skill_skill_versions",
    ),
    Index(None, "skill", "version"),
)
