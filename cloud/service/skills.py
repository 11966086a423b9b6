"""Skill versions: publish a built bundle (sign, record, link its models) and list them."""

from __future__ import annotations

import builtins
import hashlib
from collections.abc import Callable, Collection
from pathlib import Path

from cloud.errors import ConflictError, NotFoundError, ValidationError
from cloud.service.views import PublishedSkill, SkillVersionView
from cloud.store import SkillVersionRecord, Store
from cloud.store.checks import name as check_name
from cloud.store.lineage import LineageStep
from cloud.store.models import ModelTables
from skills.bundle import read_manifest
from skills.errors import SkillError
from skills.model_check import check_bundle, parse_unchecked_targets
from skills.trust import TrustRepository

__all__ = ["SkillService", "version_view"]


def version_view(rec: SkillVersionRecord) -> SkillVersionView:
    """The view of a stored skill version."""
    return SkillVersionView(
        rec.name, rec.version, rec.target_name, rec.sha256, rec.size, rec.created_ms, rec.project
    )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


class SkillService:
    """Publishing and listing skill versions."""

    def __init__(self, store: Store, trust: TrustRepository, clock: Callable[[], int]) -> None:
        """Publish into ``trust`` and record in ``store``; ``clock`` gives milliseconds."""
        self._store = store
        self._trust = trust
        self._clock = clock
        self._models = ModelTables(store.engine)

    def publish(
        self,
        bundle: Path,
        *,
        unchecked_targets: Collection[str] = (),
        project: str = "default",
    ) -> PublishedSkill:
        """Check a built bundle's models, sign it into the TUF repository, record it, link them.

        The version is recorded in ``project``. Skill names are unique across
        projects: a name another project publishes under is refused as taken
        before anything is signed.

        Every model variant must load in its runtime and run once on a sample
        input (:mod:`skills.model_check`) before anything is signed; a variant
        that cannot run on the hub (``om``, a TensorRT engine) passes only when
        its target is in ``unchecked_targets``. Versions are immutable:
        publishing the same bundle again changes nothing; other content under a
        published name and version is refused before anything is signed.

        Raises:
            ValidationError: The bundle is unreadable or malformed, a model
                fails its check, or a malformed project name.
            NotFoundError: No such project.
            ConflictError: This name and version exist with other content, or
                the name is taken by another project.
            StoreError: The store failed.
        """
        try:
            allowed = parse_unchecked_targets(unchecked_targets)
            manifest = read_manifest(bundle)
            digest = _sha256(bundle)
        except (SkillError, OSError) as exc:
            raise ValidationError(f"cannot publish {bundle}: {exc}") from exc
        self._refuse_taken(manifest.name, project)
        self._refuse_other_content(manifest.name, manifest.version, digest)
        try:
            check_bundle(bundle, unchecked_targets=allowed)
        except (SkillError, OSError) as exc:
            raise ValidationError(f"cannot publish {bundle.name}: {exc}") from exc
        target_name = f"{manifest.name}/{manifest.name}-{manifest.version}.skill"
        try:
            ref = self._trust.add_target(target_name, bundle)
        except (SkillError, OSError) as exc:
            raise ValidationError(f"cannot sign {bundle}: {exc}") from exc
        rec = self._store.add_skill_version(
            manifest.name,
            manifest.version,
            target_name=target_name,
            sha256=ref.sha256,
            size=ref.length,
            manifest=manifest.to_toml(),
            now_ms=self._clock(),
            project=project,
        )
        linked = self._models.link_skill_version(rec.name, rec.version)
        return PublishedSkill(version_view(rec), len(linked))

    def _refuse_taken(self, name: str, project: str) -> None:
        check_name(project, "project name")
        if not self._store.project_exists(project):
            raise NotFoundError(f"no project {project!r}")
        if self._store.skill_project(name) not in (None, project):
            raise ConflictError(f"skill name {name!r} is taken")

    def _refuse_other_content(self, name: str, version: str, digest: str) -> None:
        try:
            existing = self._store.get_skill_version(name, version)
        except NotFoundError:
            return
        if existing.sha256 != digest:
            raise ConflictError(
                f"{name} {version} exists with other content; versions are immutable"
            )

    def list(
        self, name: str | None = None, *, project: str | None = None
    ) -> list[SkillVersionView]:
        """Published versions (of one skill when ``name`` is given), oldest first per skill.

        Args:
            name: Only this skill's versions.
            project: Only versions of this project (None: every project).

        Raises:
            StoreError: The store failed.
        """
        return [version_view(r) for r in self._store.list_skill_versions(name, project=project)]

    def lineage(self, name: str, *, project: str | None = None) -> builtins.list[LineageStep]:
        """What each version of skill ``name`` ships: artefact, variant, model, job, data set.

        Raises:
            NotFoundError: no such skill (in ``project``, when given).
            StoreError: the store failed.
        """
        if not self.list(name, project=project):
            raise NotFoundError(f"no skill {name!r}")
        return self._store.skill_lineage(name)
