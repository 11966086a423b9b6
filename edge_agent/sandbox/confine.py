"""How one control process is confined: its user, working folder, view and network.

:class:`Confinement` is what the launcher decides for a skill when the agent
runs as root; :class:`~edge_agent.sandbox.SkillProcess` turns it into the
jail's command line (:mod:`edge_agent.sandbox.jail`), watches every process of
the skill's user and kills them all on stop.

Without root the agent cannot give a skill a user of its own, so it runs the
control code as itself with the rlimits, the clean environment, the memory and
busy-loop watchdogs and process-group kills, and logs once, loudly, what is
not enforced (see :data:`UNCONFINED_WARNING`).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from edge_agent.errors import SandboxError
from edge_agent.sandbox.env import ENV_JAIL
from edge_agent.sandbox.limits import SandboxLimits
from edge_agent.sandbox.reaper import kill_user, processes_of

__all__ = ["UNCONFINED_WARNING", "Confinement", "prepare_work_dir", "runtime_paths"]

_JAIL_MODULE = "edge_agent.sandbox.jail"
#: Folders every skill gets a private, empty copy of.
SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")  # noqa: S108 - hidden from skills, not used

UNCONFINED_WARNING = (
    "SKILLS ARE NOT CONFINED: the agent does not run as root, so control code runs as the "
    "agent's own user. Still enforced: a clean environment, rlimits (CPU, open files, "
    "address space, core 0), the memory and busy-loop watchdogs, and killing the process "
    "group on stop. NOT enforced: a user of its own (skills can read the agent's state and "
    "keys, signal the agent, and share its process count), network isolation, the hidden "
    "filesystem view, and killing processes that left the skill's session."
)


@dataclass(frozen=True)
class Confinement:
    """A skill's own user, working folder, filesystem view and network decision.

    Attributes:
        uid: The skill's user and group id.
        work_dir: Its working folder (owned by ``uid``, mode 0700).
        hide: Folders it must not see (the agent's state folder, scratch folders).
        network: Whether it keeps the device's network.
    """

    uid: int
    work_dir: Path
    hide: tuple[Path, ...]
    network: bool

    def command(
        self, python: str, worker_argv: list[str], skill_dir: Path, limits: SandboxLimits
    ) -> tuple[list[str], dict[str, str]]:
        """The jail's command line and the variable that carries its spec.

        Args:
            python: The interpreter.
            worker_argv: The worker's command line.
            skill_dir: The installed version the skill runs from.
            limits: Its limits (the process and address-space ones are set by the jail).
        """
        from edge_agent.sandbox.jail import JailSpec  # noqa: PLC0415 - `python -m` runs it

        spec = JailSpec(
            uid=self.uid,
            skill_dir=str(skill_dir.resolve()),
            work_dir=str(self.work_dir.resolve()),
            reveal=runtime_paths(),
            hide=tuple(str(h) for h in (*self.hide, *SCRATCH)),
            network=self.network,
            max_processes=limits.max_processes,
            address_space_mb=limits.address_space_mb,
            argv=tuple(worker_argv),
        )
        return [python, "-s", "-B", "-P", "-m", _JAIL_MODULE], {ENV_JAIL: spec.to_json()}

    def members(self) -> list[int]:
        """Every live process of the skill's user."""
        return processes_of(self.uid)

    def kill_all(self) -> int:
        """Kill every process of the skill's user; returns how many survived (0 normally)."""
        return kill_user(self.uid)


def runtime_paths() -> tuple[str, ...]:
    """Folders the worker must reach: the interpreter, its libraries and our packages."""
    from edge_agent.sandbox.env import import_roots  # noqa: PLC0415 - keeps env.py light

    found: dict[str, None] = {}
    for raw in (
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        sys.base_exec_prefix,
        str(Path(sys.executable).resolve().parent),
        *import_roots(),
        *(p for p in sys.path if p.endswith("-packages")),
    ):
        if raw and Path(raw).is_dir():
            found[str(Path(raw).resolve())] = None
    return tuple(found)


def prepare_work_dir(path: Path, uid: int) -> Path:
    """Create the skill's working folder, owned by its user, mode 0700.

    Its parent is made root's and closed to everyone else, so one skill cannot
    reach another's folder even without the filesystem view.

    Raises:
        SandboxError: The folder cannot be created or handed over.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o711)
        path.parent.chmod(0o711)
        path.mkdir(exist_ok=True, mode=0o700)
        if path.is_symlink() or not path.is_dir():
            raise SandboxError(f"the skill's working folder {path} is not a folder")
        os.chown(path, uid, uid)
        path.chmod(0o700)
    except OSError as exc:
        raise SandboxError(f"cannot prepare the skill's working folder {path}: {exc}") from exc
    return path
