"""Firmware image recipes and their wheel locks: pure data in, data out (no network).

A recipe (``firmware_images/<target>/recipe.toml``) names a target's base system,
architecture, Python and the runtime packages its profile needs. The versions come from
``pyproject.toml`` (the core dependencies and the hub extra's runtime pins) and, for
runtimes pyproject does not pin (``onnxruntime-gpu``, ``onnxruntime-cann``, ``tensorrt``),
from the recipe. A lock (``firmware_images/locks/<target>.lock``) is a pip requirements
file with ``--hash`` lines for every wheel of the agent's dependency set on that
architecture, plus ``# pin:`` lines (what it was made from) and ``# missing:`` lines
(pins with no wheel for the architecture, and what replaces them).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "FIRMWARE_DIR",
    "TARGETS",
    "Lock",
    "LockedWheel",
    "Recipe",
    "RecipeError",
    "canonical",
    "load_recipe",
    "lock_problems",
    "manylinux_tags",
    "parse_lock",
    "pins_for",
    "pyproject_pins",
    "render_lock",
]

REPO = Path(__file__).resolve().parents[1]
FIRMWARE_DIR = REPO / "firmware_images"
TARGETS = ("arm64-cpu", "jetson", "ascend310", "x86-gateway")
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!-]+)$")
_MAX_RECIPE_BYTES = 64 * 1024


class RecipeError(Exception):
    """A recipe, a lock or the pins they come from cannot be used (the file's fault)."""


@dataclass(frozen=True)
class Recipe:
    """One firmware target.

    Attributes:
        target: The recipe's name (a folder under ``firmware_images/``).
        profile: The agent's device profile on this target.
        description: One line for people.
        arch: ``aarch64`` or ``x86_64``.
        debian_arch: Debian's name for it (``arm64``, ``amd64``).
        python: The target's Python (``3.11``): wheels are locked for its ABI.
        glibc: The base system's glibc: manylinux tags up to it are accepted.
        base_kind: ``debootstrap`` (a root file system built here) or ``vendor``
            (the vendor's root file system; the image is an overlay for it).
        suite: The Debian suite for ``debootstrap``.
        mirror: The Debian mirror for ``debootstrap``.
        vendor: The vendor base, in words, for ``vendor``.
        base_packages: Distribution packages the base needs.
        runtime: Runtime package names added to the core dependencies.
        pins: ``name==version`` pins of runtimes pyproject does not pin.
        replace: Core packages replaced by another (``onnxruntime`` -> ``onnxruntime-gpu``).
        fallback: A package to use instead when a pin has no wheel for the architecture.
    """

    target: str
    profile: str
    description: str
    arch: str
    debian_arch: str
    python: str
    glibc: str
    base_kind: str
    suite: str = ""
    mirror: str = ""
    vendor: str = ""
    base_packages: tuple[str, ...] = ()
    runtime: tuple[str, ...] = ()
    pins: tuple[str, ...] = ()
    replace: Mapping[str, str] = field(default_factory=dict)
    fallback: Mapping[str, str] = field(default_factory=dict)


def load_recipe(target: str, firmware_dir: Path = FIRMWARE_DIR) -> Recipe:
    """Read ``<firmware_dir>/<target>/recipe.toml``.

    Raises:
        RecipeError: The target is unknown, or its recipe is unreadable or malformed.
    """
    if target not in TARGETS:
        raise RecipeError(f"unknown target {target!r}; known: {', '.join(TARGETS)}")
    path = firmware_dir / target / "recipe.toml"
    try:
        raw = path.read_bytes()[: _MAX_RECIPE_BYTES + 1]
        if len(raw) > _MAX_RECIPE_BYTES:
            raise RecipeError(f"{path} is over {_MAX_RECIPE_BYTES} bytes")
        data = tomllib.loads(raw.decode())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise RecipeError(f"cannot read the recipe {path}: {exc}") from exc
    try:
        base, runtime = data["base"], data["runtime"]
        recipe = Recipe(
            target=data["target"],
            profile=data["profile"],
            description=data["description"],
            arch=data["arch"],
            debian_arch=data["debian_arch"],
            python=data["python"],
            glibc=data["glibc"],
            base_kind=base["kind"],
            suite=base.get("suite", ""),
            mirror=base.get("mirror", ""),
            vendor=base.get("vendor", ""),
            base_packages=tuple(base.get("packages", ())),
            runtime=tuple(runtime.get("packages", ())),
            pins=tuple(runtime.get("pins", ())),
            replace=dict(runtime.get("replace", {})),
            fallback=dict(runtime.get("fallback", {})),
        )
    except (KeyError, TypeError) as exc:
        raise RecipeError(f"{path}: missing or malformed field {exc}") from exc
    if recipe.target != target or recipe.base_kind not in {"debootstrap", "vendor"}:
        raise RecipeError(f"{path}: target must be {target!r}, base.kind debootstrap|vendor")
    for pin in recipe.pins:
        _split_pin(pin, str(path))
    return recipe


def pyproject_pins(
    pyproject: Path = REPO / "pyproject.toml",
) -> tuple[dict[str, str], dict[str, str]]:
    """``(core, runtimes)``: name -> version of the core dependencies and the hub extra.

    Raises:
        RecipeError: pyproject.toml is unreadable, or a dependency is not an exact pin.
    """
    try:
        project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    except (OSError, KeyError, tomllib.TOMLDecodeError) as exc:
        raise RecipeError(f"cannot read the pins of {pyproject}: {exc}") from exc
    core = dict(_split_pin(p, "dependencies") for p in project.get("dependencies", ()))
    hub = project.get("optional-dependencies", {}).get("hub", ())
    return core, dict(_split_pin(p, "the hub extra") for p in hub)


def pins_for(recipe: Recipe, pyproject: Path = REPO / "pyproject.toml") -> dict[str, str]:
    """The exact pins (name -> version) a target's lock is made from (pure but for reading).

    The core dependencies, with ``replace`` applied, plus the recipe's runtime packages
    (versions from the hub extra) and its own pins.

    Raises:
        RecipeError: A runtime package has no pin anywhere.
    """
    core, runtimes = pyproject_pins(pyproject)
    pins: dict[str, str] = {}
    explicit = dict(_split_pin(p, recipe.target) for p in recipe.pins)
    for name, version in core.items():
        if name not in recipe.replace:
            pins[name] = version
    for name in recipe.runtime:
        if name not in runtimes:
            raise RecipeError(f"{recipe.target}: runtime {name!r} is not pinned in pyproject.toml")
        pins[name] = runtimes[name]
    pins.update(explicit)
    for old, new in recipe.replace.items():
        if new not in pins:
            raise RecipeError(f"{recipe.target}: {old} is replaced by {new!r}, which has no pin")
    return dict(sorted(pins.items()))


def manylinux_tags(arch: str, glibc: str) -> list[str]:
    """Every manylinux platform tag a system with ``glibc`` on ``arch`` accepts, newest first."""
    major, minor = (int(part) for part in glibc.split(".")[:2])
    tags = [f"manylinux_{major}_{m}_{arch}" for m in range(minor, 16, -1)]
    return [*tags, f"manylinux2014_{arch}"]


@dataclass(frozen=True)
class LockedWheel:
    """One wheel of a lock: name, version and sha256 (of the wheel for the architecture)."""

    name: str
    version: str
    sha256: str
    filename: str = ""


@dataclass(frozen=True)
class Lock:
    """A parsed lock file."""

    target: str
    pins: dict[str, str]
    missing: dict[str, str]
    wheels: tuple[LockedWheel, ...]


def render_lock(
    recipe: Recipe,
    pins: Mapping[str, str],
    wheels: Iterable[LockedWheel],
    missing: Mapping[str, str],
) -> str:
    """The lock file's text: header, pins, missing wheels, then ``name==version --hash``."""
    lines = [
        f"# edgeskill wheel lock for {recipe.target} (profile {recipe.profile}): linux "
        f"{recipe.arch}, CPython {recipe.python}, glibc {recipe.glibc}",
        "# Made by scripts/lock_wheels.py from pyproject.toml and "
        f"firmware_images/{recipe.target}/recipe.toml; install with",
        "#   pip install --no-index --find-links wheelhouse --require-hashes --no-deps -r <this>",
    ]
    lines += [f"# pin: {name}=={version}" for name, version in sorted(pins.items())]
    lines += [f"# missing: {pin}: {why}" for pin, why in sorted(missing.items())]
    for wheel in sorted(wheels, key=lambda w: w.name):
        lines.append(f"{wheel.name}=={wheel.version} \\")
        lines.append(f"    --hash=sha256:{wheel.sha256}  # {wheel.filename}")
    return "\n".join(lines) + "\n"


def parse_lock(text: str, target: str) -> Lock:
    """Read a lock written by :func:`render_lock`.

    Raises:
        RecipeError: A line is not in the lock format.
    """
    pins: dict[str, str] = {}
    missing: dict[str, str] = {}
    wheels: list[LockedWheel] = []
    pending: tuple[str, str] | None = None
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("# pin: "):
            name, version = _split_pin(stripped[7:], f"line {number}")
            pins[name] = version
        elif stripped.startswith("# missing: "):
            pin, _, why = stripped[11:].partition(": ")
            missing[pin] = why
        elif stripped.startswith("--hash=sha256:") and pending is not None:
            digest, _, comment = stripped[14:].partition("#")
            wheels.append(LockedWheel(*pending, digest.strip(), comment.strip()))
            pending = None
        elif stripped.endswith("\\") and not stripped.startswith("#"):
            pending = _split_pin(stripped[:-1].strip(), f"line {number}")
        elif stripped and not stripped.startswith("#"):
            raise RecipeError(f"{target}.lock line {number}: not a lock line: {stripped[:80]!r}")
    return Lock(target, pins, missing, tuple(wheels))


def lock_problems(recipe: Recipe, lock: Lock, pins: Mapping[str, str]) -> list[str]:
    """Why a lock is not current for its recipe's pins (empty when it is).

    Current means: made from exactly these pins, and every pin either has a wheel of
    that version in the lock or is listed as missing with a fallback that has one.
    """
    problems = []
    if lock.pins != dict(pins):
        changed = sorted(set(lock.pins.items()) ^ set(pins.items()))
        problems.append(f"{recipe.target}: pins changed ({changed}); run scripts/lock_wheels.py")
    locked = {canonical(w.name): w.version for w in lock.wheels}
    for name, version in pins.items():
        pin = f"{name}=={version}"
        if locked.get(canonical(name)) == version:
            continue
        if pin not in lock.missing:
            problems.append(f"{recipe.target}: {pin} has no wheel in the lock and is not missing")
        elif name in recipe.fallback and canonical(recipe.fallback[name]) not in locked:
            problems.append(f"{recipe.target}: {pin} is missing and so is its fallback")
    return problems


def _split_pin(pin: str, where: str) -> tuple[str, str]:
    match = _PIN.match(pin.strip())
    if match is None:
        raise RecipeError(f"{where}: {pin!r} is not an exact name==version pin")
    return canonical(match.group(1)), match.group(2)


def canonical(name: str) -> str:
    """A distribution name as the package index compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()
