"""Where a published skill version's models came from: artefact, variant, model, job, data set.

The model factory links a version to the artefacts its bundle ships
(``skill_models``); this reads that chain back in one query per skill, for the
console's skill catalogue.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select

from cloud.store.base import StoreBase
from cloud.store.models_schema import (
    dataset_versions,
    model_artifacts,
    model_variants,
    models,
    skill_models,
    training_jobs,
)

__all__ = ["LineageStep", "LineageTables"]


@dataclass(frozen=True)
class LineageStep:
    """One model artefact a skill version ships, and what it was made from."""

    version: str
    artifact_id: int
    target: str
    variant: str
    variant_accuracy: float
    model: str
    model_id: int
    arch: str
    test_accuracy: float | None
    job_id: int | None
    dataset: str
    dataset_version: int | None


class LineageTables(StoreBase):
    """Reads of the factory's lineage by skill."""

    def skill_lineage(self, skill: str) -> list[LineageStep]:
        """Every artefact the versions of ``skill`` ship, by version then artefact id.

        Raises:
            StoreError: the store failed.
        """
        a, v, m = model_artifacts.c, model_variants.c, models.c
        query = (
            select(
                skill_models.c.version,
                a.id,
                a.target,
                v.name.label("variant"),
                v.accuracy,
                m.name.label("model"),
                m.id.label("model_id"),
                m.arch,
                m.test_accuracy,
                m.job_id,
                dataset_versions.c.name.label("dataset"),
                dataset_versions.c.version.label("dataset_version"),
            )
            .join(model_artifacts, a.id == skill_models.c.artifact_id)
            .join(model_variants, v.id == a.variant_id)
            .join(models, m.id == v.model_id)
            .outerjoin(training_jobs, training_jobs.c.id == m.job_id)
            .outerjoin(dataset_versions, dataset_versions.c.id == m.dataset_id)
            .where(skill_models.c.skill == skill)
            .order_by(skill_models.c.version, a.id)
        )
        with self._tx() as conn:
            rows = conn.execute(query).all()
        return [
            LineageStep(
                version=r.version,
                artifact_id=int(r.id),
                target=r.target,
                variant=r.variant,
                variant_accuracy=float(r.accuracy),
                model=r.model,
                model_id=int(r.model_id),
                arch=r.arch,
                test_accuracy=None if r.test_accuracy is None else float(r.test_accuracy),
                job_id=None if r.job_id is None else int(r.job_id),
                dataset=r.dataset or "",
                dataset_version=None if r.dataset_version is None else int(r.dataset_version),
            )
            for r in rows
        ]
