"""Skill versions: immutable signed bundles the hub can deploy."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Row, select

from cloud.errors import ConflictError, NotFoundError
from cloud.store import checks as check
from cloud.store.base import StoreBase
from cloud.store.projects import DEFAULT_PROJECT, require_project
from cloud.store.records import SkillVersionRecord
from cloud.store.schema import skill_versions

__all__ = ["SkillTables"]


def _skill_version(row: Row[Any]) -> SkillVersionRecord:
    return SkillVersionRecord(
        row.name, row.version, row.target_name, row.sha256, row.size, row.manifest,
        row.created_ms, row.project,
    )  # fmt: skip


def _owner(conn: Connection, name: str) -> str | None:
    """The project skill ``name`` belongs to (None while it has no version)."""
    query = select(skill_versions.c.project).where(skill_versions.c.name == name).limit(1)
    row = conn.execute(query).first()
    return None if row is None else str(row.project)


class SkillTables(StoreBase):
    """Transactional access to skill versions."""

    def add_skill_version(
        self,
        name: str,
        version: str,
        *,
        target_name: str,
        sha256: str,
        size: int,
        manifest: str,
        now_ms: int,
        project: str = DEFAULT_PROJECT,
    ) -> SkillVersionRecord:
        """Register an immutable skill version in ``project``; re-adding the same bundle is a no-op.

        Skill names are unique across projects: every version of a skill is in
        the project of its first one, and another project's name is refused as
        taken, without saying by whom.

        Raises:
            ValidationError: A malformed field or project name, or a manifest over the cap.
            NotFoundError: No such project.
            ConflictError: The version exists with a different sha256, or the
                skill's name is taken by another project.
            StoreError: The database failed.
        """
        check.name(name, "skill name")
        check.version(version)
        check.target_name(target_name)
        check.sha256(sha256)
        check.counter(size, "size")
        check.text(manifest, "manifest", check.MAX_MANIFEST_BYTES)
        check.counter(now_ms, "now_ms")
        check.name(project, "project name")
        row = {
            "name": name,
            "version": version,
            "target_name": target_name,
            "sha256": sha256,
            "size": size,
            "manifest": manifest,
            "created_ms": now_ms,
            "project": project,
        }
        stmt = (
            self._dialect.insert(skill_versions)
            .values(**row)
            .on_conflict_do_nothing(index_elements=["name", "version"])
        )
        with self._tx(write=True) as conn:
            require_project(conn, project)
            if _owner(conn, name) not in (None, project):
                raise ConflictError(f"skill name {name!r} is taken")
            if conn.execute(stmt).rowcount == 1:
                return SkillVersionRecord(**row)  # type: ignore[arg-type]
            existing = self._skill_version(conn, name, version)
        if existing.sha256 != sha256:
            raise ConflictError(
                f"skill {name} {version} exists with another sha256 ({existing.sha256}); "
                "versions are immutable"
            )
        return existing

    @staticmethod
    def _skill_version(
        conn: Connection, name: str, version: str, project: str | None = None
    ) -> SkillVersionRecord:
        query = select(skill_versions).where(
            skill_versions.c.name == name, skill_versions.c.version == version
        )
        if project is not None:
            query = query.where(skill_versions.c.project == project)
        row = conn.execute(query).first()
        if row is None:
            raise NotFoundError(f"no skill {name} version {version}")
        return _skill_version(row)

    def get_skill_version(
        self, name: str, version: str, *, project: str | None = None
    ) -> SkillVersionRecord:
        """Return one skill version (of ``project``, when given).

        Raises:
            NotFoundError: No such skill version (in ``project``).
            StoreError: The database failed.
        """
        with self._tx() as conn:
            return self._skill_version(conn, name, version, project)

    def skill_project(self, name: str) -> str | None:
        """The project skill ``name`` belongs to, or None while no version of it exists.

        For refusing a taken name before a bundle is signed; the insert checks again.

        Raises:
            StoreError: The database failed.
        """
        with self._tx() as conn:
            return _owner(conn, name)

    def list_skill_versions(
        self, name: str | None = None, *, project: str | None = None
    ) -> list[SkillVersionRecord]:
        """Return skill versions (of one skill when ``name`` is given), oldest first per skill.

        Args:
            name: Only this skill's versions.
            project: Only versions of this project (None: every project).

        Raises:
            StoreError: The database failed.
        """
        query = select(skill_versions).order_by(
            skill_versions.c.name, skill_versions.c.created_ms, skill_versions.c.version
        )
        if name is not None:
            query = query.where(skill_versions.c.name == name)
        if project is not None:
            query = query.where(skill_versions.c.project == project)
        with self._tx() as conn:
            return [_skill_version(row) for row in conn.execute(query)]
