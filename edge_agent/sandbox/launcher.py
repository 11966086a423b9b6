"""Starting an installed skill version: the seam between the reconciler and the sandbox.

The reconciler only needs "start this installed folder with this configuration
and tell me whether it is healthy"; a :data:`SkillLauncher` is exactly that,
so an agent under test (or thousands of them in one simulator process) can be
given a launcher that starts something lighter than a real control process.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from edge_agent.errors import HealthCheckError
from edge_agent.sandbox.process import SkillProcess
from skills.manifest import Manifest

__all__ = ["SkillLauncher", "make_launcher"]

#: ``launcher(skill_dir, config)``: start the installed version in ``skill_dir`` with the
#: hub's ``config`` (laid over the manifest's defaults) and return it once its health check
#: passed. Raises :class:`~edge_agent.errors.HealthCheckError`,
#: :class:`~edge_agent.errors.SandboxError` or :class:`~skills.errors.SkillError`.
SkillLauncher = Callable[[Path, Mapping[str, str]], SkillProcess]


def make_launcher(
    profile_targets: Sequence[str], precisions: Sequence[str], log_dir: Path
) -> SkillLauncher:
    """The launcher that runs control code in a sandboxed :class:`SkillProcess`.

    Args:
        profile_targets: The device's targets, best first, for model selection.
        precisions: The precisions the device runs well, best first.
        log_dir: Folder for the skills' logs, one file per name and version.

    Returns:
        The launcher.
    """
    targets = tuple(profile_targets)
    device_precisions = tuple(precisions)

    def launch(skill_dir: Path, config: Mapping[str, str]) -> SkillProcess:
        try:
            text = (skill_dir / "skill.toml").read_text(encoding="utf-8")
        except OSError as exc:
            raise HealthCheckError(f"cannot read {skill_dir.name}'s manifest: {exc}") from exc
        manifest = Manifest.from_toml(text)
        try:
            log_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise HealthCheckError(f"cannot create the skill log folder: {exc}") from exc
        proc = SkillProcess(
            skill_dir,
            manifest,
            targets,
            config={**dict(manifest.config), **config},
            log_path=log_dir / f"{manifest.name}-{manifest.version}.log",
            precisions=device_precisions,
        )
        proc.start()
        return proc

    return launch
