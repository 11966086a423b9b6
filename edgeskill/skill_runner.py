"""Running one skill's control code on inputs, here, through the agent's own skill runtime.

The same path a device takes once a skill is installed: the control code in its
own :class:`~edge_agent.sandbox.SkillProcess`, its models through the runtime
facade, items over the pipe. ``edgeskill agent try`` uses it, and so does the
library build to compute a skill's drift reference
(:func:`cloud.models.library.build_library_skill` is given
:func:`reference_runner`), so the reference is what a device would report.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge_agent.adapters import Source, load_input
from edge_agent.sandbox import SkillItemError, SkillProcess
from skills.manifest import Manifest

__all__ = ["Outcome", "prepare_skill", "reference_runner", "run_source", "running", "try_targets"]

#: Targets tried after the device's own, so a skill runs here whatever its variants are.
_ALL_TARGETS = ("onnx-cpu", "openvino", "tflite", "onnx-cuda", "onnx-tensorrt")


@dataclass(frozen=True)
class Outcome:
    """What the skill made of one item: its result, or the error it raised."""

    name: str
    result: dict[str, Any] | None
    latency_ms: float
    error: str = ""


def try_targets(board: str | None = None) -> tuple[str, ...]:
    """This device's targets, best first, then every other target whose runtime is here.

    Raises:
        RuntimeBackendError: ``board`` is not a known board.
    """
    from edge_agent.profile import available_targets, detect_profile  # noqa: PLC0415

    own = detect_profile(board).targets
    here = available_targets()
    return (*own, *(t for t in _ALL_TARGETS if t in here and t not in own))


def prepare_skill(path: Path, work: Path) -> Path:
    """A runnable skill folder for ``path``, under ``work`` when it has to be made.

    A ``.skill`` bundle is installed (its hashes checked); a library source folder
    (with ``sources.toml``) gets its models from their packages; any other folder
    with ``skill.toml`` is used as it is.

    Raises:
        SkillError: The bundle is malformed or does not verify; the folder has no manifest.
        HubError: A library source's models cannot be made (its packages are missing).
    """
    from skills.bundle import install_bundle  # noqa: PLC0415
    from skills.errors import BundleError  # noqa: PLC0415
    from skills.model_sources import SOURCES_NAME  # noqa: PLC0415

    if path.is_file():
        install_bundle(path, work / "installed")
        return work / "installed"
    if (path / SOURCES_NAME).is_file() and not (path / "models").exists():
        from cloud.models.library import materialise_skill  # noqa: PLC0415 - hub side

        materialise_skill(path, work / "built")
        return work / "built"
    if not (path / "skill.toml").is_file():
        raise BundleError(f"{path} is neither a .skill bundle nor a folder with skill.toml")
    return path


def _manifest(skill_dir: Path) -> Manifest:
    return Manifest.from_toml((skill_dir / "skill.toml").read_text(encoding="utf-8"))


@contextlib.contextmanager
def running(
    skill_dir: Path,
    targets: Sequence[str],
    config: Mapping[str, str] | None = None,
    log_dir: Path | None = None,
) -> Iterator[SkillProcess]:
    """The skill in ``skill_dir`` started in its own process; stopped on the way out.

    Raises:
        HealthCheckError: Its ``setup()`` failed or it did not become ready.
        SandboxError: The configuration is not strings or is too large.
        SkillError: The manifest is invalid.
    """
    manifest = _manifest(skill_dir)
    with contextlib.ExitStack() as stack:
        logs = log_dir or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        proc = SkillProcess(
            skill_dir,
            manifest,
            targets,
            config={**dict(manifest.config), **dict(config or {})},
            log_path=logs / f"{manifest.name}.log",
        )
        proc.start()
        stack.callback(proc.stop)
        yield proc


def run_source(
    proc: SkillProcess, source: Source, *, limit: int | None = None, timeout_s: float = 60.0
) -> Iterator[Outcome]:
    """Feed ``source``'s items to ``proc`` in order; one outcome each.

    Raises:
        SandboxError: The skill process died or did not answer in time.
        InputError: An item cannot be read.
    """
    name = getattr(source, "name", None)
    count = len(source) if limit is None else min(limit, len(source))
    for i in range(count):
        item, _ = source.item(i)
        label = name(i) if name else str(i)
        try:
            result, ms = proc.process(item, timeout=timeout_s)
        except SkillItemError as exc:
            yield Outcome(label, None, 0.0, str(exc).splitlines()[-1])
        else:
            yield Outcome(label, result, ms)


def reference_runner(skill_dir: Path, files: Sequence[Path]) -> list[dict[str, Any]]:
    """The skill's results on ``files``, one each: how a library build learns its reference.

    Raises:
        HealthCheckError: The skill does not start.
        SandboxError: It died on an item.
        InputError: A file cannot be read.
        SkillItemError: It raised on a reference input (the reference must cover them all).
    """
    results = []
    with running(skill_dir, try_targets()) as proc:
        for path in files:
            source = load_input(path)
            for i in range(len(source)):
                results.append(proc.process(source.item(i)[0], timeout=120.0)[0])
    return results
