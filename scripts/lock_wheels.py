"""Resolve each firmware target's wheels for its architecture and write its lock.

For every target in ``firmware_images/`` (or those named), this asks the package index,
through pip, which wheels exist for the target's platform (linux + its architecture,
manylinux tags up to its glibc, CPython of its version): first each pin alone
(``--no-deps``), so that a runtime without a wheel for the architecture is named, then
the whole set with its dependencies, the dependencies held to the versions this
environment runs (checked here). Only metadata is fetched (pip's ``--dry-run --report``;
PyPI serves wheel metadata apart), so locking ``tensorrt`` costs no gigabytes.

Writes ``firmware_images/locks/<target>.lock``. Needs the network; checking that the
locks are current does not (``tests/firmware/test_locks.py``).

Usage: ``python scripts/lock_wheels.py [TARGET ...]``
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from edgeskill.firmware_recipes import (
    FIRMWARE_DIR,
    TARGETS,
    LockedWheel,
    Recipe,
    canonical,
    load_recipe,
    manylinux_tags,
    pins_for,
    render_lock,
)

PIP_TIMEOUT_S = 300


def pip_report(recipe: Recipe, requirements: list[str], *, deps: bool, work: Path) -> dict | None:
    """pip's resolution report for ``requirements`` on the recipe's platform, or None."""
    report = work / "report.json"
    report.unlink(missing_ok=True)
    constraints = work / "constraints.txt"
    argv = [
        sys.executable, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed",
        "--report", str(report), "--target", str(work / "t"), "--only-binary=:all:",
        "--python-version", recipe.python, "--implementation", "cp",
        "--abi", f"cp{recipe.python.replace('.', '')}", "--constraint", str(constraints),
    ]  # fmt: skip
    for tag in manylinux_tags(recipe.arch, recipe.glibc):
        argv += ["--platform", tag]
    if not deps:
        argv.append("--no-deps")
    done = subprocess.run(
        [*argv, *requirements], capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False
    )
    if done.returncode != 0 or not report.exists():
        return None
    return json.loads(report.read_text())


def local_constraints(pins: dict[str, str]) -> str:
    """This environment's versions, for dependencies the pins do not fix."""
    lines = []
    for dist in importlib.metadata.distributions():
        name = canonical(dist.metadata["Name"] or "")
        if name and name not in pins and name not in {"pip", "setuptools", "edgeskill"}:
            lines.append(f"{name}=={dist.version}")
    return "\n".join(sorted(set(lines))) + "\n"


def wheels_of(report: dict) -> list[LockedWheel]:
    wheels = []
    for item in report["install"]:
        info = item["download_info"]
        digest = info.get("archive_info", {}).get("hashes", {}).get("sha256", "")
        meta = item["metadata"]
        filename = info["url"].rsplit("/", 1)[-1].split("#", 1)[0]
        wheels.append(LockedWheel(canonical(meta["name"]), meta["version"], digest, filename))
    return wheels


def lock_target(target: str, console: Console) -> tuple[Recipe, int, dict[str, str]]:
    """Resolve and write one target's lock; returns the recipe, wheel count and missing pins."""
    recipe = load_recipe(target)
    pins = pins_for(recipe)
    with tempfile.TemporaryDirectory(prefix="edgeskill-lock-") as tmp:
        work = Path(tmp)
        (work / "constraints.txt").write_text(local_constraints(pins))
        missing: dict[str, str] = {}
        wanted = dict(pins)
        for name, version in pins.items():
            pin = f"{name}=={version}"
            if pip_report(recipe, [pin], deps=False, work=work) is not None:
                continue
            why = (
                f"no wheel on the package index for linux {recipe.arch} "
                f"(CPython {recipe.python}, glibc {recipe.glibc})"
            )
            del wanted[name]
            substitute = recipe.fallback.get(name)
            if substitute is not None:
                why += f"; installs {substitute} instead (CPU only)"
                wanted.setdefault(substitute, _fallback_version(substitute))
            missing[pin] = why
            console.print(f"[yellow]{target}: {pin}: {why}")
        requirements = [f"{n}=={v}" for n, v in wanted.items()]
        report = pip_report(recipe, requirements, deps=True, work=work)
        if report is None:
            raise SystemExit(f"{target}: pip could not resolve {requirements}")
    wheels = wheels_of(report)
    out = FIRMWARE_DIR / "locks" / f"{target}.lock"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_lock(recipe, pins, wheels, missing))
    return recipe, len(wheels), missing


def _fallback_version(name: str) -> str:
    """A fallback's version: the core pin when it has one (onnxruntime)."""
    from edgeskill.firmware_recipes import pyproject_pins  # noqa: PLC0415

    core, runtimes = pyproject_pins()
    return core.get(name) or runtimes[name]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="*", default=list(TARGETS))
    args = parser.parse_args()
    console = Console()
    table = Table(title="wheel locks")
    for column in ("target", "arch", "wheels", "missing for the architecture"):
        table.add_column(column)
    for target in args.targets:
        recipe, count, missing = lock_target(target, console)
        table.add_row(target, recipe.arch, str(count), "\n".join(missing) or "-")
    console.print(table)


if __name__ == "__main__":
    main()
