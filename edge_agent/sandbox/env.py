"""The control process's environment: built from scratch, never inherited.

Only ``PATH``, ``LANG``, ``HOME`` (the skill's folder), a ``PYTHONPATH`` that
finds our packages, and ``EDGESKILL_*`` settings cross over, so the agent's own
secrets (hub tokens, cloud keys) never reach a bundle author's code. The names
live here, apart from the worker, so the parent can use them without importing
the worker module (``python -m`` warns when its module is already imported).
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from edge_agent.errors import SandboxError

__all__ = [
    "ENV_ADDRESS_SPACE_MB",
    "ENV_CONFIG",
    "ENV_CPU_SECONDS",
    "ENV_JAIL",
    "ENV_MAX_OPEN_FILES",
    "ENV_MAX_PROCESSES",
    "ENV_MEMORY_MB",
    "ENV_PRECISIONS",
    "ENV_PROVIDERS",
    "ENV_SKILL_DIR",
    "ENV_TARGETS",
    "MAX_CONFIG_BYTES",
    "child_environment",
    "encode_config",
    "import_roots",
]

ENV_SKILL_DIR = "EDGESKILL_SKILL_DIR"
ENV_TARGETS = "EDGESKILL_TARGETS"
ENV_PRECISIONS = "EDGESKILL_PRECISIONS"
#: The device profile's ONNX Runtime execution providers, best first, comma-separated.
ENV_PROVIDERS = "EDGESKILL_PROVIDERS"
ENV_CONFIG = "EDGESKILL_CONFIG"
ENV_MEMORY_MB = "EDGESKILL_MEMORY_MB"
ENV_CPU_SECONDS = "EDGESKILL_CPU_SECONDS"
ENV_MAX_OPEN_FILES = "EDGESKILL_MAX_OPEN_FILES"
ENV_ADDRESS_SPACE_MB = "EDGESKILL_ADDRESS_SPACE_MB"
ENV_MAX_PROCESSES = "EDGESKILL_MAX_PROCESSES"
#: The jail's instructions (JSON); read and removed by :mod:`edge_agent.sandbox.jail`.
ENV_JAIL = "EDGESKILL_JAIL"

#: The skill's configuration as JSON; one environment string holds at most 128 KiB.
MAX_CONFIG_BYTES = 64 * 1024
#: Our packages; the child finds third-party ones through its interpreter's site-packages.
_OUR_PACKAGES = ("edge_agent", "skills", "protos")


def encode_config(config: Mapping[str, str]) -> str:
    """The configuration as compact JSON for :data:`ENV_CONFIG`.

    Raises:
        SandboxError: A key or value is not a string, or the JSON exceeds
            :data:`MAX_CONFIG_BYTES`.
    """
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in config.items()):
        raise SandboxError("skill config keys and values must be strings")
    encoded = json.dumps(dict(config), separators=(",", ":"))
    if len(encoded) > MAX_CONFIG_BYTES:
        raise SandboxError(f"skill config of {len(encoded)} bytes exceeds {MAX_CONFIG_BYTES}")
    return encoded


def import_roots() -> list[str]:
    """Folders that must be on the child's ``PYTHONPATH`` to import our packages."""
    roots: list[str] = []
    for name in _OUR_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            root = str(Path(spec.origin).resolve().parent.parent)
            if root not in roots:
                roots.append(root)
    return roots


def child_environment(
    skill_dir: Path,
    targets: Sequence[str],
    config_json: str,
    limits: Mapping[str, str],
    precisions: Sequence[str] = (),
    home: Path | None = None,
    providers: Sequence[str] = (),
) -> dict[str, str]:
    """The complete environment of a control process.

    Args:
        skill_dir: The skill's installed folder.
        targets: The device's targets, best first.
        config_json: The output of :func:`encode_config`.
        limits: ``EDGESKILL_*`` limit variables (``SandboxLimits.to_env()``).
        precisions: The device's preferred model precisions, best first.
        home: Its ``HOME``: its working folder when confined; ``skill_dir`` by default.
        providers: The device profile's ONNX Runtime providers, best first; none: the CPU.

    Returns:
        The variables, and nothing inherited beyond ``PATH`` and ``LANG``.
    """
    return {
        "PATH": os.environ.get("PATH") or os.defpath,
        "LANG": os.environ.get("LANG") or "C.UTF-8",
        "HOME": str(home or skill_dir),
        "PYTHONPATH": os.pathsep.join(import_roots()),
        ENV_SKILL_DIR: str(skill_dir),
        ENV_TARGETS: ",".join(targets),
        ENV_PRECISIONS: ",".join(precisions),
        ENV_PROVIDERS: ",".join(providers),
        ENV_CONFIG: config_json,
        **limits,
    }
