"""A user id of its own for each skill, without entries in ``/etc/passwd``.

Where the agent runs as root, each skill's control code runs as a user and
group id from a fixed range, derived stably from the agent's state folder and
the skill's name (every version of a skill shares it, so its working folder
stays its own; two agents on one machine, as in the demo, get different ids
for the same skill, so stopping one's skill never touches the other's). A
derived id already taken by another skill, by an account of the system, or by
any running process is skipped for the next free one; the choice is kept in a
small JSON file in the agent's state folder so it survives restarts.
"""

from __future__ import annotations

import contextlib
import grp
import hashlib
import json
import os
import pwd
import threading
from pathlib import Path

from edge_agent.errors import SandboxError
from edge_agent.sandbox.reaper import processes_of

__all__ = ["SkillUsers"]

_MAX_REGISTRY_BYTES = 1024 * 1024


class SkillUsers:
    """Skill name to user id, kept in ``path``.

    Args:
        path: The registry file (created, mode 0600).
        base: The first id of the range.
        count: The size of the range.
    """

    def __init__(self, path: Path, base: int, count: int) -> None:
        self._path = path
        self._base = base
        self._count = count
        self._lock = threading.Lock()

    def uid_for(self, name: str) -> int:
        """The user (and group) id of a skill; the same on every call and after restarts.

        Raises:
            SandboxError: The range is full, or the registry cannot be read or written.
        """
        with self._lock:
            known = self._load()
            if name in known:
                return known[name]
            taken = set(known.values())
            seed = f"{self._path.resolve()}\0{name}".encode()
            start = int.from_bytes(hashlib.sha256(seed).digest()[:8], "big")
            for step in range(self._count):
                uid = self._base + (start + step) % self._count
                if uid not in taken and not _system_id(uid) and not processes_of(uid):
                    known[name] = uid
                    self._save(known)
                    return uid
        raise SandboxError(f"no free skill user id left in [{self._base}, +{self._count})")

    def _load(self) -> dict[str, int]:
        try:
            with self._path.open("rb") as fh:
                raw = fh.read(_MAX_REGISTRY_BYTES + 1)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise SandboxError(f"cannot read the skill users {self._path}: {exc}") from exc
        try:
            data = json.loads(raw) if len(raw) <= _MAX_REGISTRY_BYTES else None
        except ValueError:
            data = None
        if not isinstance(data, dict) or not all(
            isinstance(k, str) and isinstance(v, int) for k, v in data.items()
        ):
            raise SandboxError(f"the skill users file {self._path} is damaged")
        return {k: v for k, v in data.items() if self._base <= v < self._base + self._count}

    def _save(self, known: dict[str, int]) -> None:
        tmp = self._path.with_name(self._path.name + ".tmp")
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(known, fh, sort_keys=True)
                fh.flush()
                os.fsync(fh.fileno())
            tmp.replace(self._path)
        except OSError as exc:
            raise SandboxError(f"cannot write the skill users {self._path}: {exc}") from exc


def _system_id(uid: int) -> bool:
    """Whether an account or group of the system already uses this id."""
    for lookup in (pwd.getpwuid, grp.getgrgid):
        with contextlib.suppress(KeyError):
            lookup(uid)
            return True
    return False
