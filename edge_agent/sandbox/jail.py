"""The confinement of a control process, applied by root just before the worker starts.

``python -m edge_agent.sandbox.jail`` is what :class:`~edge_agent.sandbox.SkillProcess`
runs when the agent is root. It reads a :class:`JailSpec` from ``EDGESKILL_JAIL``
and, in this fresh single-threaded process (no ``preexec_fn`` in the threaded
agent), does what Linux offers and then ``exec``s the worker:

1. a mount namespace of its own, and an empty network namespace unless the
   manifest declared ``network = true``;
2. a filesystem view: each folder in ``hide`` (the agent's state folder,
   ``/tmp``) is covered by an empty tmpfs, and each folder on the way to what
   the worker needs (the interpreter, our packages, the skill's installed
   version, its working folder) that the skill's user could not pass is
   covered the same way, with only the needed entry bound back; the installed
   version is bound read-only;
3. its process and address-space rlimits, set as root so they are hard;
4. ``no_new_privs``, no supplementary groups, and the skill's own user and
   group id, which also drops every capability.

Nothing here is a container runtime: it is ``unshare(2)``, ``mount(2)`` and
``setuid(2)`` in the order the kernel needs them.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import stat
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from edge_agent.sandbox.env import ENV_JAIL

__all__ = ["JailSpec", "main"]

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
_MS_RDONLY = 0x1
_MS_NOSUID = 0x2
_MS_NODEV = 0x4
_MS_REMOUNT = 0x20
_MS_BIND = 0x1000
_MS_REC = 0x4000
_MS_PRIVATE = 0x40000
_PR_SET_NO_NEW_PRIVS = 38
_EXIT_JAIL_FAILED = 126
#: Folders covered by a writable, private tmpfs instead of a closed one.
_SCRATCH = frozenset({"/tmp", "/var/tmp", "/dev/shm"})  # noqa: S108 - covered, not used

_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class JailSpec:
    """What the jail sets up before it runs ``argv``.

    Attributes:
        uid: The skill's user id (also its group id).
        skill_dir: The installed version, shown read-only.
        work_dir: The skill's working folder, writable, the current folder.
        reveal: Folders the worker must reach (the interpreter, import roots).
        hide: Folders covered by an empty tmpfs, apart from what must be reached.
        network: Whether to keep the device's network.
        max_processes: ``RLIMIT_NPROC``; 0 for none.
        address_space_mb: ``RLIMIT_AS`` in MiB; 0 for none.
        argv: The worker's command line.
    """

    uid: int
    skill_dir: str
    work_dir: str
    reveal: tuple[str, ...]
    hide: tuple[str, ...]
    network: bool
    max_processes: int
    address_space_mb: int
    argv: tuple[str, ...]

    def to_json(self) -> str:
        """The spec for :data:`~edge_agent.sandbox.env.ENV_JAIL`."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> JailSpec:
        """Read a spec back.

        Raises:
            ValueError: Not a spec.
            TypeError: A field is missing or unknown.
        """
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("the jail spec is not an object")
        for key in ("reveal", "hide", "argv"):
            data[key] = tuple(str(v) for v in data.get(key, ()))
        return cls(**data)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    _check(
        _libc.mount(
            None if source is None else source.encode(),
            target.encode(),
            None if fstype is None else fstype.encode(),
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {target}",
    )


def _passable(path: str, uid: int) -> bool:
    """Whether ``uid`` (with its own group and no others) may search the folder."""
    info = Path(path).stat()
    if info.st_uid == uid:
        return bool(info.st_mode & stat.S_IXUSR)
    if info.st_gid == uid:
        return bool(info.st_mode & stat.S_IXGRP)
    return bool(info.st_mode & stat.S_IXOTH)


class _View:
    """Covers folders with a tmpfs and binds single entries of the original back."""

    def __init__(self, uid: int, hide: set[str]) -> None:
        self._uid = uid
        self._hide = hide
        self._covered: dict[str, int] = {}  # folder -> O_PATH fd of the original
        self._shown: set[str] = set()
        self._reached: set[str] = set()  # targets shown whole

    def cover(self, folder: str) -> None:
        if folder in self._covered:
            return
        self._covered[folder] = os.open(folder, os.O_PATH | os.O_DIRECTORY)
        mode = "1777" if folder in _SCRATCH else "0711"
        _mount("tmpfs", folder, "tmpfs", _MS_NOSUID | _MS_NODEV, f"mode={mode},size=64m")

    def reach(self, target: str) -> None:
        """Make ``target`` reachable, covering every folder above it that hides or blocks.

        Reach shallow targets first: a folder reached earlier is shown whole, so a
        deeper target under it (site-packages under a virtual environment that lives
        below a hidden ``/tmp``) must not cover it again.
        """
        parts = Path(target).parts
        below_hidden = False  # under a hidden folder only the path itself is shown
        for depth in range(1, len(parts)):
            folder = str(Path(*parts[:depth]))
            child = str(Path(folder, parts[depth]))
            whole = folder in self._reached
            below_hidden = (below_hidden and not whole) or folder in self._hide
            blocked = below_hidden or not _passable(folder, self._uid)
            if folder not in self._covered and not whole and blocked:
                self.cover(folder)
            if folder in self._covered and child not in self._shown:
                self._show(folder, parts[depth])
        self._reached.add(target)

    def _show(self, folder: str, name: str) -> None:
        source = f"/proc/self/fd/{self._covered[folder]}/{name}"
        target = str(Path(folder, name))
        if Path(source).is_dir():
            Path(target).mkdir(0o711)
        else:
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT, 0o600))
        _mount(source, target, None, _MS_BIND | _MS_REC)
        self._shown.add(target)


def _read_only(path: str) -> None:
    _mount(path, path, None, _MS_BIND | _MS_REC)
    _mount(None, path, None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)


def _confine(spec: JailSpec) -> None:
    flags = CLONE_NEWNS | (0 if spec.network else CLONE_NEWNET)
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    hide = {str(Path(h).resolve()) for h in spec.hide}
    view = _View(spec.uid, hide)
    targets = {str(Path(t)) for t in (spec.skill_dir, spec.work_dir, *spec.reveal)}
    for target in sorted(targets, key=lambda t: (len(Path(t).parts), t)):
        view.reach(target)
    for folder in sorted(hide):
        if Path(folder).is_dir():
            view.cover(folder)
    _read_only(spec.skill_dir)
    if spec.max_processes > 0:
        resource.setrlimit(resource.RLIMIT_NPROC, (spec.max_processes, spec.max_processes))
    if spec.address_space_mb > 0:
        limit = spec.address_space_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    os.setgroups([])
    os.setresgid(spec.uid, spec.uid, spec.uid)
    os.setresuid(spec.uid, spec.uid, spec.uid)
    os.chdir(spec.work_dir)


def main() -> int:
    """Confine this process and exec the worker; returns only when that failed."""
    env = dict(os.environ)
    try:
        spec = JailSpec.from_json(env.pop(ENV_JAIL))
        _confine(spec)
        os.execve(spec.argv[0], list(spec.argv), env)  # noqa: S606 - our own worker
    except (OSError, ValueError, TypeError, KeyError) as exc:
        sys.stderr.write(f"edgeskill jail: cannot confine the skill: {exc}\n")
        sys.stderr.flush()
    return _EXIT_JAIL_FAILED


if __name__ == "__main__":
    sys.exit(main())
