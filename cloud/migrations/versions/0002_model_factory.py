"""The model factory: dataset versions, training jobs and epochs, models, variants,
per-target artefacts and their links to skill versions.

Revision ID: 0002
Revises: 0001
Create Date: 2026-02-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def _fk(table: str, column: str, parent: str, **kwargs: str) -> sa.ForeignKeyConstraint:
    parent_table = parent.partition(".")[0]
    return sa.ForeignKeyConstraint(
        [column], [parent], name=f"fk_{table}_{column}_{parent_table}", **kwargs
    )


def upgrade() -> None:
    """Create the model factory's tables."""
    _create_datasets_and_jobs()
    _create_models_and_variants()
    _create_artifacts_and_links()


def _create_datasets_and_jobs() -> None:
    op.create_table(
        "dataset_versions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("location", sa.String(255), nullable=False),
        sa.Column("content_hash", sa.String(80), nullable=False),
        sa.Column("classes", sa.Text(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_dataset_versions"),
        sa.UniqueConstraint("name", "version", name="uq_dataset_versions_name_version"),
        sa.UniqueConstraint("name", "content_hash", name="uq_dataset_versions_name_content_hash"),
    )
    op.create_table(
        "training_jobs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("dataset_id", sa.Integer(), nullable=False),
        sa.Column("model_name", sa.String(64), nullable=False),
        sa.Column("arch", sa.String(32), nullable=False),
        sa.Column("spec", sa.Text(), nullable=False),
        sa.Column("epochs", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("resumed_from_epoch", sa.Integer(), nullable=True),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
        sa.Column("started_ms", sa.BigInteger(), nullable=True),
        sa.Column("finished_ms", sa.BigInteger(), nullable=True),
        _fk("training_jobs", "dataset_id", "dataset_versions.id"),
        sa.PrimaryKeyConstraint("id", name="pk_training_jobs"),
    )
    op.create_index("ix_training_jobs_status", "training_jobs", ["status"])
    op.create_table(
        "training_epochs",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("train_loss", sa.Float(), nullable=False),
        sa.Column("val_accuracy", sa.Float(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        _fk("training_epochs", "job_id", "training_jobs.id", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", "epoch", name="pk_training_epochs"),
    )


def _create_models_and_variants() -> None:
    op.create_table(
        "models",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("arch", sa.String(32), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("dataset_id", sa.Integer(), nullable=True),
        sa.Column("weights_sha256", sa.String(64), nullable=True),
        sa.Column("onnx_sha256", sa.String(64), nullable=False),
        sa.Column("onnx_size", sa.BigInteger(), nullable=False),
        sa.Column("test_accuracy", sa.Float(), nullable=True),
        sa.Column("image_size", sa.Integer(), nullable=False),
        sa.Column("split_seed", sa.Integer(), nullable=False),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
        _fk("models", "job_id", "training_jobs.id"),
        _fk("models", "dataset_id", "dataset_versions.id"),
        sa.PrimaryKeyConstraint("id", name="pk_models"),
        sa.UniqueConstraint("name", name="uq_models_name"),
        sa.UniqueConstraint("job_id", name="uq_models_job_id"),
    )
    op.create_table(
        "model_variants",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(32), nullable=False),
        sa.Column("quantized", sa.Boolean(), nullable=False),
        sa.Column("onnx_sha256", sa.String(64), nullable=False),
        sa.Column("onnx_size", sa.BigInteger(), nullable=False),
        sa.Column("tflite_sha256", sa.String(64), nullable=True),
        sa.Column("weights_sha256", sa.String(64), nullable=True),
        sa.Column("accuracy", sa.Float(), nullable=False),
        sa.Column("accuracy_loss_pt", sa.Float(), nullable=False),
        sa.Column("size_ratio", sa.Float(), nullable=False),
        sa.Column("meets_bar", sa.Boolean(), nullable=False),
        sa.Column("report", sa.Text(), nullable=False),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
        _fk("model_variants", "model_id", "models.id"),
        sa.PrimaryKeyConstraint("id", name="pk_model_variants"),
        sa.UniqueConstraint("model_id", "name", name="uq_model_variants_model_id_name"),
    )


def _create_artifacts_and_links() -> None:
    op.create_table(
        "model_artifacts",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("variant_id", sa.Integer(), nullable=False),
        sa.Column("target", sa.String(32), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("files", sa.Text(), nullable=False),
        sa.Column("max_abs_diff", sa.Float(), nullable=False),
        sa.Column("tolerance", sa.Float(), nullable=False),
        sa.Column("checked_with", sa.String(32), nullable=False),
        sa.Column("notes", sa.Text(), nullable=False),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
        _fk("model_artifacts", "variant_id", "model_variants.id"),
        sa.PrimaryKeyConstraint("id", name="pk_model_artifacts"),
        sa.UniqueConstraint("variant_id", "target", name="uq_model_artifacts_variant_id_target"),
    )
    op.create_index("ix_model_artifacts_sha256", "model_artifacts", ["sha256"])
    op.create_table(
        "skill_models",
        sa.Column("artifact_id", sa.Integer(), nullable=False),
        sa.Column("skill", sa.String(64), nullable=False),
        sa.Column("version", sa.String(64), nullable=False),
        _fk("skill_models", "artifact_id", "model_artifacts.id"),
        sa.ForeignKeyConstraint(
            ["skill", "version"],
            ["skill_versions.name", "skill_versions.version"],
            name="fk_skill_models_skill_skill_versions",
        ),
        sa.PrimaryKeyConstraint("artifact_id", "skill", "version", name="pk_skill_models"),
    )
    op.create_index("ix_skill_models_skill_version", "skill_models", ["skill", "version"])


def downgrade() -> None:
    """Drop the model factory's tables, children first."""
    for table in (
        "skill_models",
        "model_artifacts",
        "model_variants",
        "models",
        "training_epochs",
        "training_jobs",
        "dataset_versions",
    ):
        op.drop_table(table)
