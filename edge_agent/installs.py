"""Skill installs on disk, with an atomic ``current`` switch and one-step rollback.

Layout under the agent's state folder::

    <root>/skills/<name>/<version>/     an unpacked bundle; complete once it holds MARKER
    <root>/skills/<name>/current        symlink -> "<version>" (the active version)
    <root>/skills/<name>/previous       symlink -> the version active before it
    <root>/bundles/                     the downloaded bundle cache

Every change is a sequence of atomic steps (a rename of a whole folder, an
``os.replace`` of a symlink, a marker written last), so a crash at any point
leaves something :meth:`InstallStore.recover` can turn back into exactly one
complete, verified active version per skill.
"""

from __future__ import annotations

import os
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from edge_agent._install_layout import (
    LINKS,
    MARKER,
    NAME,
    TEMP_LINK_PREFIXES,
    check_name,
    delete_path,
    fsync,
    installed_ns,
    is_complete,
    is_verified,
    is_version_dir,
    read_link,
    scan_skill,
    write_marker,
)
from edge_agent.errors import InstallError

__all__ = ["MARKER", "InstallStore", "InstalledSkill", "SkillOnDisk"]


InstallFn = Callable[[Path, Path], object]


def _install_bundle(bundle: Path, dest: Path) -> object:
    """Install with :func:`skills.bundle.install_bundle`, imported at the first install.

    An agent with nothing to install never loads tarfile, gzip and the bundle reader.
    """
    from skills.bundle import install_bundle  # noqa: PLC0415

    return install_bundle(bundle, dest)


StepHook = Callable[[str], None]


@dataclass(frozen=True)
class InstalledSkill:
    """The active version of one skill.

    Attributes:
        name: The skill name.
        version: The active version.
        path: Its unpacked folder.
        previous: The version a rollback would return to, if any.
    """

    name: str
    version: str
    path: Path
    previous: str | None


@dataclass(frozen=True)
class SkillOnDisk:
    """One skill folder as :meth:`InstallStore.inventory` found it.

    Attributes:
        name: The skill name.
        active: Its active version, if it has one.
        versions: Its complete versions, sorted by name.
    """

    name: str
    active: InstalledSkill | None
    versions: tuple[str, ...]


@dataclass(frozen=True)
class _Scan:
    epoch: int
    at: float
    skills: tuple[SkillOnDisk, ...]


class InstallStore:
    """Skill versions unpacked under ``<root>/skills`` and switched atomically.

    Thread-safe within one process; one agent process owns a state folder.

    Args:
        root: The agent's state folder.
        install_fn: ``install_fn(bundle, dest)`` unpacks and verifies a bundle into ``dest``,
            which must not exist; defaults to :func:`skills.bundle.install_bundle`.
        step_hook: Called with the name of each durable step as it completes (``unpacked``,
            ``marked``, ``previous-tmp``, ``previous-replaced``, ``current-tmp``,
            ``current-replaced``, ``trashed``); for tracing and fault-injection tests.

    Raises:
        InstallError: The state folder cannot be created.
    """

    def __init__(
        self,
        root: Path,
        install_fn: InstallFn | None = None,
        *,
        step_hook: StepHook | None = None,
    ) -> None:
        self._root = root
        self._skills = root / "skills"
        self._install_fn = install_fn or _install_bundle
        self._hook: StepHook = step_hook or (lambda _step: None)
        self._lock = threading.RLock()
        #: Bumped by every change made through this store; a scan of an older epoch is stale.
        self._epoch = 0
        self._scan: _Scan | None = None
        try:
            self._skills.mkdir(parents=True, exist_ok=True)
            self.bundles_dir.mkdir(exist_ok=True)
        except OSError as exc:
            raise InstallError(f"cannot create the install folders under {root}: {exc}") from exc

    @contextmanager
    def _changing(self) -> Iterator[None]:
        """Hold the lock for a change; the last inventory is stale afterwards, even on error."""
        with self._lock:
            try:
                yield
            finally:
                self._epoch += 1

    def inventory(self, max_age_s: float = 60.0) -> tuple[SkillOnDisk, ...]:
        """Every skill folder with its active and complete versions, sorted by name.

        The agent asks every few seconds whether its installs match what it wants.
        Nothing changes on disk but through this store (one agent owns a state
        folder), so the last scan is reused until a change is made here or it is
        ``max_age_s`` old: an idle device does not list and stat its skill folders
        every few seconds, and a change behind the agent's back (an operator, a
        damaged disk) is still seen within ``max_age_s``.

        Raises:
            InstallError: The folders cannot be read.
        """
        cached = self.cached_inventory(max_age_s)
        if cached is not None:
            return cached
        with self._lock:
            epoch = self._epoch
            skills = tuple(self._on_disk(name) for name in self.skill_names())
            self._scan = _Scan(epoch, time.monotonic(), skills)
        return skills

    def _on_disk(self, name: str) -> SkillOnDisk:
        """One skill folder as :meth:`current` and :meth:`versions` see it, in one listing."""
        skill_dir = self._skill_dir(name)
        try:
            versions, cur, prev = scan_skill(skill_dir)
        except OSError as exc:
            raise InstallError(f"cannot list the versions of {name}: {exc}") from exc
        if cur is None:
            return SkillOnDisk(name, None, versions)
        active = InstalledSkill(name, cur, skill_dir / cur, None if prev == cur else prev)
        return SkillOnDisk(name, active, versions)

    def cached_inventory(self, max_age_s: float = 60.0) -> tuple[SkillOnDisk, ...] | None:
        """The last :meth:`inventory` if nothing changed since and it is fresh; never blocks."""
        scan = self._scan  # one read: a scan and its epoch belong together
        if scan is None or scan.epoch != self._epoch or time.monotonic() - scan.at > max_age_s:
            return None
        return scan.skills

    @property
    def bundles_dir(self) -> Path:
        """The folder that caches downloaded bundles."""
        return self._root / "bundles"

    def recover(self) -> list[str]:
        """Repair what an interrupted install, switch or removal left behind; call at start-up.

        Removes staging and trash folders, temporary symlinks and version folders without
        their marker or whose files no longer match it; a ``current`` that is dangling or
        broken falls back to ``previous``; a ``previous`` that is broken or equal to
        ``current`` is dropped.

        Returns:
            What was cleaned, as paths relative to the state folder with a reason.

        Raises:
            InstallError: The folders cannot be read or changed.
        """
        cleaned: list[str] = []
        with self._changing():
            try:
                for entry in sorted(self._skills.iterdir()):
                    if entry.name.startswith("."):
                        delete_path(entry)
                        cleaned.append(f"{self._rel(entry)}: leftover")
                    elif entry.is_dir() and not entry.is_symlink() and NAME.fullmatch(entry.name):
                        cleaned.extend(self._recover_skill(entry))
            except OSError as exc:
                raise InstallError(f"cannot recover the installs: {exc}") from exc
        return cleaned

    def _recover_skill(self, skill_dir: Path) -> list[str]:
        cleaned: list[str] = []
        for entry in sorted(skill_dir.iterdir()):
            if entry.name.startswith(".") or entry.name.startswith(TEMP_LINK_PREFIXES):
                delete_path(entry)
                cleaned.append(f"{self._rel(entry)}: leftover")
            elif is_version_dir(entry) and not is_verified(entry):
                self._discard(entry)
                cleaned.append(f"{self._rel(entry)}: incomplete or damaged")
        for link in LINKS:
            if (skill_dir / link).is_symlink() and self._active(skill_dir, link) is None:
                (skill_dir / link).unlink()
                cleaned.append(f"{self._rel(skill_dir / link)}: dangling")
        cur = self._active(skill_dir, "current")
        prev = self._active(skill_dir, "previous")
        if cur is None and prev is not None:
            self._set_link(skill_dir, "current", prev)
            cleaned.append(f"{self._rel(skill_dir / 'current')}: fell back to {prev}")
        if prev is not None and cur in (None, prev):
            (skill_dir / "previous").unlink()
        fsync(skill_dir)
        if not any(skill_dir.iterdir()):
            skill_dir.rmdir()
        return cleaned

    def is_installed(self, name: str, version: str) -> bool:
        """Whether a complete unpacked folder exists for this version (its marker is present).

        Raises:
            InstallError: The name or version is not a safe folder name.
        """
        return is_complete(self._skill_dir(name) / check_name("version", version, version=True))

    def version_dir(self, name: str, version: str) -> Path:
        """The folder of a complete unpacked version, active or not.

        Raises:
            InstallError: Bad name or version, or that version is not installed.
        """
        path = self._skill_dir(name) / check_name("version", version, version=True)
        if not is_complete(path):
            raise InstallError(f"{name} {version} is not installed")
        return path

    def unpack(self, name: str, version: str, bundle: Path) -> Path:
        """Unpack a bundle into ``skills/<name>/<version>`` unless that version is already there.

        Args:
            name: The skill name.
            version: The skill version.
            bundle: The bundle file to unpack with ``install_fn``.

        Returns:
            The complete version folder.

        Raises:
            InstallError: Bad name or version, or the bundle could not be unpacked or verified;
                nothing of this version is left behind.
        """
        skill_dir = self._skill_dir(name)
        dest = skill_dir / check_name("version", version, version=True)
        with self._changing():
            if is_complete(dest):
                return dest
            new_skill = not skill_dir.exists()
            try:
                skill_dir.mkdir(parents=True, exist_ok=True)
                if dest.exists() or dest.is_symlink():
                    delete_path(dest)  # an interrupted unpack that recover() has not seen
                self._install_fn(bundle, dest)
                if not is_version_dir(dest):
                    raise InstallError(f"the installer did not create {dest.name}/")
                self._hook("unpacked")
                write_marker(name, version, dest)
            except Exception as exc:
                self._undo_unpack(dest, skill_dir, new_skill)
                if isinstance(exc, InstallError):
                    raise
                raise InstallError(f"cannot install {name} {version} from {bundle}: {exc}") from exc
            self._hook("marked")
            return dest

    def _undo_unpack(self, dest: Path, skill_dir: Path, new_skill: bool) -> None:
        if dest.exists() and not dest.is_symlink():
            shutil.rmtree(dest, ignore_errors=True)
        if new_skill and skill_dir.is_dir() and not any(skill_dir.iterdir()):
            skill_dir.rmdir()

    def activate(self, name: str, version: str) -> None:
        """Make an unpacked version the active one; the former active one becomes ``previous``.

        ``previous`` is switched before ``current``: a crash between the two leaves both on
        the old version, and simply calling :meth:`activate` again finishes the job.

        Raises:
            InstallError: The version is not installed, or the links cannot be switched.
        """
        skill_dir = self._skill_dir(name)
        check_name("version", version, version=True)
        with self._changing():
            if not is_complete(skill_dir / version):
                raise InstallError(f"{name} {version} is not installed")
            cur = self._active(skill_dir, "current")
            if cur == version:
                return
            try:
                if cur is not None:
                    self._set_link(skill_dir, "previous", cur)
                self._set_link(skill_dir, "current", version)
            except OSError as exc:
                raise InstallError(f"cannot activate {name} {version}: {exc}") from exc

    def rollback(self, name: str) -> str:
        """Make ``previous`` the active version again (and the rolled-back one ``previous``).

        ``current`` is switched first, so a crash in between has already rolled back.

        Returns:
            The version now active.

        Raises:
            InstallError: There is no complete previous version, or the links cannot be switched.
        """
        skill_dir = self._skill_dir(name)
        with self._changing():
            prev = self._active(skill_dir, "previous")
            cur = self._active(skill_dir, "current")
            if prev is None or prev == cur:
                raise InstallError(f"{name} has no previous version to roll back to")
            try:
                self._set_link(skill_dir, "current", prev)
                if cur is not None:
                    self._set_link(skill_dir, "previous", cur)
                else:
                    (skill_dir / "previous").unlink()
                    fsync(skill_dir)
            except OSError as exc:
                raise InstallError(f"cannot roll {name} back to {prev}: {exc}") from exc
            return prev

    def current(self, name: str) -> InstalledSkill | None:
        """The active version of a skill, or ``None`` if it has none.

        Raises:
            InstallError: The name is not a safe folder name.
        """
        skill_dir = self._skill_dir(name)
        with self._lock:
            cur = self._active(skill_dir, "current")
            if cur is None:
                return None
            prev = self._active(skill_dir, "previous")
            return InstalledSkill(name, cur, skill_dir / cur, None if prev == cur else prev)

    def installed(self) -> list[InstalledSkill]:
        """The active version of every skill that has one, sorted by name.

        Raises:
            InstallError: The skills folder cannot be read.
        """
        try:
            names = sorted(p.name for p in self._skills.iterdir() if NAME.fullmatch(p.name))
        except OSError as exc:
            raise InstallError(f"cannot list {self._skills}: {exc}") from exc
        found = (self.current(n) for n in names)
        return [skill for skill in found if skill is not None]

    def skill_names(self) -> list[str]:
        """Every skill with a folder here, active or not, sorted.

        Raises:
            InstallError: The skills folder cannot be read.
        """
        try:
            with os.scandir(self._skills) as entries:
                return sorted(e.name for e in entries if NAME.fullmatch(e.name) and e.is_dir())
        except OSError as exc:
            raise InstallError(f"cannot list {self._skills}: {exc}") from exc

    def versions(self, name: str) -> list[str]:
        """The complete versions of a skill on disk, sorted by name.

        Raises:
            InstallError: Bad name, or the skill's folder cannot be read.
        """
        skill_dir = self._skill_dir(name)
        with self._lock:
            if not skill_dir.is_dir():
                return []
            try:
                return sorted(p.name for p in skill_dir.iterdir() if is_complete(p))
            except OSError as exc:
                raise InstallError(f"cannot list the versions of {name}: {exc}") from exc

    def remove_skill(self, name: str) -> None:
        """Deactivate and delete every version of a skill; a skill not installed is fine.

        Raises:
            InstallError: Bad name, or the folder cannot be removed.
        """
        skill_dir = self._skill_dir(name)
        with self._changing():
            if not skill_dir.exists():
                return
            try:
                self._discard(skill_dir)
            except OSError as exc:
                raise InstallError(f"cannot remove {name}: {exc}") from exc

    def prune(self, name: str, keep: int = 2) -> None:
        """Delete old versions, keeping ``current``, ``previous`` and the newest up to ``keep``.

        Args:
            name: The skill name.
            keep: How many complete versions to keep; 1 keeps only ``current`` (and drops
                ``previous``).

        Raises:
            InstallError: Bad name, ``keep`` < 1, or a folder cannot be removed.
        """
        if keep < 1:
            raise InstallError(f"prune must keep at least one version, got keep={keep}")
        skill_dir = self._skill_dir(name)
        with self._changing():
            if not skill_dir.is_dir():
                return
            try:
                self._prune(skill_dir, keep)
            except OSError as exc:
                raise InstallError(f"cannot prune {name}: {exc}") from exc

    def _prune(self, skill_dir: Path, keep: int) -> None:
        cur = self._active(skill_dir, "current")
        prev = self._active(skill_dir, "previous")
        complete = [p for p in skill_dir.iterdir() if is_complete(p)]
        complete.sort(key=installed_ns, reverse=True)
        ranked = [v for v in (cur, prev) if v is not None]
        ranked += [p.name for p in complete if p.name not in ranked]
        kept = set(ranked[:keep])
        if prev is not None and prev not in kept:
            (skill_dir / "previous").unlink()
            fsync(skill_dir)
        for path in complete:
            if path.name not in kept:
                self._discard(path)

    def _skill_dir(self, name: str) -> Path:
        return self._skills / check_name("skill name", name)

    def _active(self, skill_dir: Path, link: str) -> str | None:
        """The version a link points at, if that version is complete."""
        target = read_link(skill_dir / link)
        return target if target is not None and is_complete(skill_dir / target) else None

    def _set_link(self, skill_dir: Path, link: str, version: str) -> None:
        tmp = skill_dir / f"{link}.tmp-{secrets.token_hex(4)}"
        tmp.symlink_to(version)
        self._hook(f"{link}-tmp")
        tmp.replace(skill_dir / link)
        fsync(skill_dir)
        self._hook(f"{link}-replaced")

    def _discard(self, path: Path) -> None:
        """Delete a complete folder so that no crash can leave it looking complete."""
        trash = path.parent / f".trash-{path.name}-{secrets.token_hex(4)}"
        path.replace(trash)
        fsync(path.parent)
        self._hook("trashed")
        shutil.rmtree(trash)

    def _rel(self, path: Path) -> str:
        return path.relative_to(self._root).as_posix()
