"""Model tables: lineage from data set version to the skill versions that ship a model.

data set version → training job (epochs) → model → variants (compression reports)
→ per-target artefacts (conversion checks) → skill versions. Every method is
one transaction; input is checked before anything is written, so a bad call
changes nothing. Model files are blobs (:class:`cloud.models.blobs.BlobStore`);
rows hold their sha256.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, insert, select

from cloud.errors import ConflictError, NotFoundError, ValidationError
from cloud.store import checks as check
from cloud.store import model_codec as codec
from cloud.store.jobs import JobTables
from cloud.store.model_records import (
    ArtifactDraft,
    ArtifactRecord,
    EpochRecord,
    Lineage,
    ModelDraft,
    ModelRecord,
    VariantDraft,
    VariantRecord,
)
from cloud.store.models_schema import (
    model_artifacts,
    model_variants,
    models,
    skill_models,
    training_epochs,
)
from cloud.store.schema import skill_versions
from skills.errors import SkillError
from skills.manifest import Manifest

__all__ = ["ModelTables"]

MAX_VARIANTS_PER_CALL = 32


class ModelTables(JobTables):
    """Models, their variants and artefacts, on top of data sets and jobs."""

    # models

    def finish_job(
        self,
        job_id: int,
        draft: ModelDraft,
        *,
        epochs: Sequence[EpochRecord],
        resumed_from_epoch: int,
        now_ms: int,
    ) -> ModelRecord:
        """Record a running job's model and final epochs, and mark the job succeeded, together.

        The model takes the job's model name and data set.

        Raises:
            ValidationError: A malformed draft or epochs.
            NotFoundError: No such job.
            ConflictError: The job is not running, or the model name is taken.
            StoreError: The database failed.
        """
        codec.model_row(draft)
        epoch_rows = [{"job_id": job_id, **r} for r in codec.epochs(epochs)]
        codec.small_int(resumed_from_epoch, "resumed epoch", 0, codec.MAX_EPOCHS)
        check.counter(now_ms, "now_ms")
        with self._tx(write=True) as conn:
            job = self._finish(conn, job_id, resumed_from_epoch, now_ms)
            conn.execute(training_epochs.delete().where(training_epochs.c.job_id == job_id))
            if epoch_rows:
                conn.execute(insert(training_epochs), epoch_rows)
            row = codec.model_row(draft)
            row.update(name=job.model_name, dataset_id=job.dataset_id, job_id=job_id)
            return self._insert_model(conn, row, now_ms)

    def add_model(self, draft: ModelDraft, *, now_ms: int) -> ModelRecord:
        """Register a model that no job of this hub trained (an imported file).

        Raises:
            ValidationError: A malformed draft.
            NotFoundError: ``draft.dataset_id`` names no data set version.
            ConflictError: The name is taken.
            StoreError: The database failed.
        """
        row = codec.model_row(draft)
        check.counter(now_ms, "now_ms")
        with self._tx(write=True) as conn:
            if draft.dataset_id is not None:
                self._dataset_row(conn, draft.dataset_id)
            self._check_model_name_free(conn, draft.name)
            return self._insert_model(conn, row, now_ms)

    @staticmethod
    def _insert_model(conn: Connection, row: dict[str, Any], now_ms: int) -> ModelRecord:
        if conn.execute(select(models.c.id).where(models.c.name == row["name"])).first():
            raise ConflictError(f"model name {row['name']!r} is taken")
        stmt = insert(models).values(**row, created_ms=now_ms).returning(models.c.id)
        model_id = conn.execute(stmt).scalar_one()
        return codec.model_record(conn.execute(select(models).where(models.c.id == model_id)).one())

    def get_model(self, ref: int | str) -> ModelRecord:
        """Return a model by id or by name.

        Raises:
            NotFoundError: No such model.
            StoreError: The database failed.
        """
        with self._tx() as conn:
            return codec.model_record(self._model_row(conn, ref))

    @staticmethod
    def _model_row(conn: Connection, ref: int | str) -> Any:
        if isinstance(ref, str) and ref.isdigit():
            ref = int(ref)
        where = models.c.id == ref if isinstance(ref, int) else models.c.name == ref
        row = conn.execute(select(models).where(where)).first()
        if row is None:
            raise NotFoundError(f"no model {ref!r}")
        return row

    def list_models(self) -> list[ModelRecord]:
        """Return every model, oldest first.

        Raises:
            StoreError: The database failed.
        """
        with self._tx() as conn:
            rows = conn.execute(select(models).order_by(models.c.id)).all()
        return [codec.model_record(r) for r in rows]

    # variants

    def add_variants(
        self, model_id: int, drafts: Sequence[VariantDraft], *, now_ms: int
    ) -> list[VariantRecord]:
        """Record compressed variants of a model, all or none.

        Raises:
            ValidationError: A malformed draft, or a name given twice.
            NotFoundError: No such model.
            ConflictError: The model already has a variant of one of these names.
            StoreError: The database failed or holds corrupt data.
        """
        if not 1 <= len(drafts) <= MAX_VARIANTS_PER_CALL:
            raise ValidationError(f"give 1..{MAX_VARIANTS_PER_CALL} variants")
        rows = [codec.variant_row(d) for d in drafts]
        if len({r["name"] for r in rows}) != len(rows):
            raise ValidationError("a variant name appears twice")
        check.counter(now_ms, "now_ms")
        with self._tx(write=True) as conn:
            self._model_row(conn, model_id)
            have = {v.name for v in self._variants(conn, model_id)}
            clash = sorted(have & {r["name"] for r in rows})
            if clash:
                raise ConflictError(f"model {model_id} already has variants {', '.join(clash)}")
            for row in rows:
                conn.execute(
                    insert(model_variants).values(**row, model_id=model_id, created_ms=now_ms)
                )
            return [
                v for v in self._variants(conn, model_id) if v.name in {r["name"] for r in rows}
            ]

    def variants_of(self, model_id: int) -> list[VariantRecord]:
        """Return a model's variants, oldest first.

        Raises:
            StoreError: The database failed or holds corrupt data.
        """
        with self._tx() as conn:
            return self._variants(conn, model_id)

    @staticmethod
    def _variants(conn: Connection, model_id: int) -> list[VariantRecord]:
        query = (
            select(model_variants)
            .where(model_variants.c.model_id == model_id)
            .order_by(model_variants.c.id)
        )
        return [codec.variant_record(r) for r in conn.execute(query)]

    def get_variant(self, variant_id: int) -> VariantRecord:
        """Return one variant.

        Raises:
            NotFoundError: No such variant.
            StoreError: The database failed or holds corrupt data.
        """
        query = select(model_variants).where(model_variants.c.id == variant_id)
        with self._tx() as conn:
            row = conn.execute(query).first()
        if row is None:
            raise NotFoundError(f"no variant {variant_id}")
        return codec.variant_record(row)

    # artefacts and skills

    def add_artifact(self, variant_id: int, draft: ArtifactDraft, *, now_ms: int) -> ArtifactRecord:
        """Record a checked per-target conversion of a variant.

        Raises:
            ValidationError: A malformed draft, or one whose difference exceeds its tolerance.
            NotFoundError: No such variant.
            ConflictError: The variant already has an artefact for this target.
            StoreError: The database failed.
        """
        row = codec.artifact_row(draft)
        check.counter(now_ms, "now_ms")
        with self._tx(write=True) as conn:
            if not conn.execute(
                select(model_variants.c.id).where(model_variants.c.id == variant_id)
            ).first():
                raise NotFoundError(f"no variant {variant_id}")
            if self._artifact_rows(conn, variant_id=variant_id, target=draft.target):
                raise ConflictError(f"variant {variant_id} already has a {draft.target} artefact")
            stmt = insert(model_artifacts).values(**row, variant_id=variant_id, created_ms=now_ms)
            new_id = conn.execute(stmt.returning(model_artifacts.c.id)).scalar_one()
            return self._artifacts(conn, artifact_id=new_id)[0]

    def artifacts_of(self, variant_id: int) -> list[ArtifactRecord]:
        """Return a variant's artefacts.

        Raises:
            StoreError: The database failed or holds corrupt data.
        """
        with self._tx() as conn:
            return self._artifacts(conn, variant_id=variant_id)

    def get_artifact(self, artifact_id: int) -> ArtifactRecord:
        """Return one artefact.

        Raises:
            NotFoundError: No such artefact.
            StoreError: The database failed or holds corrupt data.
        """
        with self._tx() as conn:
            found = self._artifacts(conn, artifact_id=artifact_id)
        if not found:
            raise NotFoundError(f"no artefact {artifact_id}")
        return found[0]

    @staticmethod
    def _artifact_rows(conn: Connection, **where: Any) -> list[Any]:
        query = select(model_artifacts).order_by(model_artifacts.c.id)
        for column, value in where.items():
            key = "id" if column == "artifact_id" else column
            if isinstance(value, list):
                query = query.where(model_artifacts.c[key].in_(value))
            else:
                query = query.where(model_artifacts.c[key] == value)
        return list(conn.execute(query))

    def _artifacts(self, conn: Connection, **where: Any) -> list[ArtifactRecord]:
        rows = self._artifact_rows(conn, **where)
        links: dict[int, list[tuple[str, str]]] = defaultdict(list)
        if rows:
            query = (
                select(skill_models)
                .where(skill_models.c.artifact_id.in_([r.id for r in rows]))
                .order_by(skill_models.c.skill, skill_models.c.version)
            )
            for link in conn.execute(query):
                links[link.artifact_id].append((link.skill, link.version))
        return [codec.artifact_record(r, links) for r in rows]

    def link_skill_version(self, skill: str, version: str) -> list[ArtifactRecord]:
        """Link a published skill version to every artefact its bundle ships (by sha256).

        Linking again changes nothing.

        Returns:
            The artefacts now linked to the skill version.

        Raises:
            NotFoundError: No such skill version.
            StoreError: The database failed, or the stored manifest is corrupt.
        """
        check.name(skill, "skill name")
        check.version(version)
        with self._tx(write=True) as conn:
            found = conn.execute(
                select(skill_versions.c.manifest).where(
                    (skill_versions.c.name == skill) & (skill_versions.c.version == version)
                )
            ).first()
            if found is None:
                raise NotFoundError(f"no skill version {skill} {version}")
            try:
                hashes = [m.sha256 for m in Manifest.from_toml(found.manifest).models if m.sha256]
            except SkillError as exc:
                raise ValidationError(
                    f"manifest of {skill} {version} is unreadable: {exc}"
                ) from exc
            rows = self._artifact_rows(conn, sha256=hashes) if hashes else []
            linked = {
                r.artifact_id
                for r in conn.execute(
                    select(skill_models.c.artifact_id).where(
                        (skill_models.c.skill == skill) & (skill_models.c.version == version)
                    )
                )
            }
            new = [
                {"artifact_id": r.id, "skill": skill, "version": version}
                for r in rows
                if r.id not in linked
            ]
            if new:
                conn.execute(insert(skill_models), new)
            return self._artifacts(conn, artifact_id=[r.id for r in rows]) if rows else []

    # lineage

    def lineage(self, ref: int | str) -> Lineage:
        """Everything a model came from and everything made from it, read consistently.

        Raises:
            NotFoundError: No such model.
            StoreError: The database failed or holds corrupt data.
        """
        with self._tx() as conn:
            model = codec.model_record(self._model_row(conn, ref))
            dataset = job = None
            epochs: list[EpochRecord] = []
            if model.dataset_id is not None:
                dataset = codec.dataset_record(self._dataset_row(conn, model.dataset_id))
            if model.job_id is not None:
                job = codec.job_record(self._job_row(conn, model.job_id))
                query = (
                    select(training_epochs)
                    .where(training_epochs.c.job_id == model.job_id)
                    .order_by(training_epochs.c.epoch)
                )
                epochs = [codec.epoch_record(r) for r in conn.execute(query)]
            variants = self._variants(conn, model.id)
            ids = [v.id for v in variants]
            artifacts = self._artifacts(conn, variant_id=ids) if ids else []
        return Lineage(model, dataset, job, tuple(epochs), tuple(variants), tuple(artifacts))
