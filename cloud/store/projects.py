"""Projects (tenants): every device, group, skill version and deployment belongs to one.

Migration 0008 creates project ``default`` and puts everything that existed
before projects in it. The other tables check a project exists with
:func:`require_project` inside their own transaction.
"""

from __future__ import annotations

from sqlalchemy import Connection, select

from cloud.errors import ConflictError, NotFoundError
from cloud.rollout.rule import DEFAULT_PROJECT
from cloud.store import checks as check
from cloud.store.access_schema import projects
from cloud.store.base import StoreBase
from cloud.store.records import ProjectRecord

__all__ = ["DEFAULT_PROJECT", "ProjectTables", "require_project"]


def require_project(conn: Connection, name: str) -> None:
    """Check, inside the caller's transaction, that project ``name`` exists.

    Raises:
        ValidationError: A malformed name.
        NotFoundError: No such project.
    """
    check.name(name, "project name")
    if conn.execute(select(projects.c.name).where(projects.c.name == name)).first() is None:
        raise NotFoundError(f"no project {name!r}")


class ProjectTables(StoreBase):
    """Transactional access to projects."""

    def create_project(self, name: str, now_ms: int) -> ProjectRecord:
        """Create a project.

        Raises:
            ValidationError: A malformed name or time.
            ConflictError: A project of that name exists.
            StoreError: The database failed.
        """
        check.name(name, "project name")
        check.counter(now_ms, "now_ms")
        stmt = (
            self._dialect.insert(projects)
            .values(name=name, created_ms=now_ms)
            .on_conflict_do_nothing(index_elements=["name"])
        )
        with self._tx(write=True) as conn:
            if conn.execute(stmt).rowcount == 0:
                raise ConflictError(f"project {name!r} exists")
        return ProjectRecord(name, now_ms)

    def list_projects(self) -> list[ProjectRecord]:
        """Return every project, by name.

        Raises:
            StoreError: The database failed.
        """
        with self._tx() as conn:
            rows = conn.execute(select(projects).order_by(projects.c.name)).all()
        return [ProjectRecord(row.name, int(row.created_ms)) for row in rows]

    def project_exists(self, name: str) -> bool:
        """Whether project ``name`` exists (False for a malformed name).

        Raises:
            StoreError: The database failed.
        """
        with self._tx() as conn:
            found = conn.execute(select(projects.c.name).where(projects.c.name == name)).first()
        return found is not None
