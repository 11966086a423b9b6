"""Starting an installed skill version: the seam between the reconciler and the sandbox.

The reconciler only needs "start this installed folder with this configuration
and tell me whether it is healthy"; a :data:`SkillLauncher` is exactly that,
so an agent under test (or thousands of them in one simulator process) can be
given a launcher that starts something lighter than a real control process.

The real launcher confines control code whenever the agent runs as root: each
skill gets a user id of its own (:class:`~edge_agent.sandbox.users.SkillUsers`),
a working folder under ``<state>/sandbox/``, a view of the filesystem without
the agent's state, and no network unless its manifest asks for it. Its limits
are the manifest's, clamped to the device owner's caps
(:class:`~edge_agent.sandbox.policy.OwnerLimits`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from edge_agent.errors import HealthCheckError
from edge_agent.sandbox.confine import UNCONFINED_WARNING, Confinement, prepare_work_dir
from edge_agent.sandbox.policy import OwnerLimits
from edge_agent.sandbox.process import SkillProcess
from edge_agent.sandbox.reaper import kill_user
from edge_agent.sandbox.users import SkillUsers
from skills.manifest import Manifest

__all__ = ["SkillLauncher", "make_launcher"]

log = logging.getLogger(__name__)

#: ``launcher(skill_dir, config)``: start the installed version in ``skill_dir`` with the
#: hub's ``config`` (laid over the manifest's defaults) and return it once its health check
#: passed. Raises :class:`~edge_agent.errors.HealthCheckError`,
#: :class:`~edge_agent.errors.SandboxError` or :class:`~skills.errors.SkillError`.
SkillLauncher = Callable[[Path, Mapping[str, str]], SkillProcess]

_warned_unconfined = False


def _warn_unconfined() -> None:
    global _warned_unconfined  # noqa: PLW0603 - one warning per process, not per agent
    if not _warned_unconfined:
        _warned_unconfined = True
        log.warning(UNCONFINED_WARNING)


def make_launcher(
    profile_targets: Sequence[str],
    precisions: Sequence[str],
    log_dir: Path,
    *,
    owner: OwnerLimits | None = None,
    state_dir: Path | None = None,
    confine: bool | None = None,
    providers: Sequence[str] = (),
) -> SkillLauncher:
    """The launcher that runs control code in a sandboxed :class:`SkillProcess`.

    Args:
        profile_targets: The device's targets, best first, for model selection.
        precisions: The precisions the device runs well, best first.
        log_dir: Folder for the skills' logs, one file per name and version.
        owner: The device owner's caps; the defaults of :class:`OwnerLimits` if not given.
        state_dir: The agent's state folder, hidden from skills and home of their working
            folders (``<state>/sandbox/<name>``); the parent of ``log_dir`` if not given.
        confine: Give each skill a user of its own and a hidden view; by default whenever
            the agent runs as root. ``False`` as root is the explicit insecure mode.
        providers: The device profile's ONNX Runtime providers, best first, for the
            skills' sessions; the CPU only when empty.

    Returns:
        The launcher.
    """
    targets = tuple(profile_targets)
    device_precisions = tuple(precisions)
    device_providers = tuple(providers)
    caps = owner or OwnerLimits()
    state = (state_dir or log_dir.parent).resolve()
    confined = os.geteuid() == 0 if confine is None else confine
    users = SkillUsers(state / "sandbox" / "users.json", caps.uid_base, caps.uid_count)
    if not confined:
        _warn_unconfined()

    def launch(skill_dir: Path, config: Mapping[str, str]) -> SkillProcess:
        manifest = _read_manifest(skill_dir)
        try:
            log_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise HealthCheckError(f"cannot create the skill log folder: {exc}") from exc
        clamped = caps.clamp(manifest.resources)
        for note in clamped.notes:
            log.warning("%s %s: %s", manifest.name, manifest.version, note)
        confinement = None
        if confined:
            uid = users.uid_for(manifest.name)
            if kill_user(uid):  # leftovers of a crashed run must not count against its limits
                raise HealthCheckError(f"old processes of {manifest.name} cannot be killed")
            work = prepare_work_dir(state / "sandbox" / manifest.name, uid)
            confinement = Confinement(uid, work, (state,), clamped.network)
        proc = SkillProcess(
            skill_dir,
            manifest,
            targets,
            config={**dict(manifest.config), **config},
            log_path=log_dir / f"{manifest.name}-{manifest.version}.log",
            precisions=device_precisions,
            providers=device_providers,
            limits=clamped.limits,
            confinement=confinement,
        )
        proc.limit_notes = clamped.notes
        proc.start()
        return proc

    return launch


def _read_manifest(skill_dir: Path) -> Manifest:
    try:
        text = (skill_dir / "skill.toml").read_text(encoding="utf-8")
    except OSError as exc:
        raise HealthCheckError(f"cannot read {skill_dir.name}'s manifest: {exc}") from exc
    return Manifest.from_toml(text)
