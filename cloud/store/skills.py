"""Skill versions: immutable signed bundles the hub can deploy."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Row, select

from cloud.errors import ConflictError, NotFoundError
from cloud.store import checks as check
from cloud.store.base import StoreBase
from cloud.store.records import SkillVersionRecord
from cloud.store.schema import skill_versions

__all__ = ["SkillTables"]


def _skill_version(row: Row[Any]) -> SkillVersionRecord:
    return SkillVersionRecord(
        row.name, row.version, row.target_name, row.sha256, row.size, row.manifest, row.created_ms
    )


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
    ) -> SkillVersionRecord:
        """Register an immutable skill version; re-adding the same bundle is a no-op.

        Raises:
            ValidationError: A malformed field or a manifest over the cap.
            ConflictError: The version exists with a different sha256.
            StoreError: The database failed.
        """
        check.name(name, "skill name")
        check.version(version)
        check.target_name(target_name)
        check.sha256(sha256)
        check.counter(size, "size")
        check.text(manifest, "manifest", check.MAX_MANIFEST_BYTES)
        check.counter(now_ms, "now_ms")
        row = {
            "name": name,
            "version": version,
            "target_name": target_name,
            "sha256": sha256,
            "size": size,
            "manifest": manifest,
            "created_ms": now_ms,
        }
        stmt = (
            self._dialect.insert(skill_versions)
            .values(**row)
            .on_conflict_do_nothing(index_elements=["name", "version"])
        )
        with self._tx(write=True) as conn:
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
    def _skill_version(conn: Connection, name: str, version: str) -> SkillVersionRecord:
        row = conn.execute(
            select(skill_versions).where(
                skill_versions.c.name == name, skill_versions.c.version == version
            )
        ).first()
        if row is None:
            raise NotFoundError(f"no skill {name} version {version}")
        return _skill_version(row)

    def get_skill_version(self, name: str, version: str) -> SkillVersionRecord:
        """Return one skill version.

        Raises:
            NotFoundError: No such skill version.
            StoreError: The database failed.
        """
        with self._tx() as conn:
            return self._skill_version(conn, name, version)

    def list_skill_versions(self, name: str | None = None) -> list[SkillVersionRecord]:
        """Return skill versions (of one skill when ``name`` is given), oldest first per skill.

        Raises:
            StoreError: The database failed.
        """
        query = select(skill_versions).order_by(
            skill_versions.c.name, skill_versions.c.created_ms, skill_versions.c.version
        )
        if name is not None:
            query = query.where(skill_versions.c.name == name)
        with self._tx() as conn:
            return [_skill_version(row) for row in conn.execute(query)]
