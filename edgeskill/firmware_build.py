"""``edgeskill image build``: an agent bundle and a root file system (or overlay) per target.

The agent bundle is what a device with an OS already installs (``python3 install.py``):
the wheelhouse of its lock (checked against the lock's sha256) and the agent's own
wheel, the lock, the systemd units, the settings and the first-boot script. The root
file system comes from ``debootstrap`` (``--foreign`` plus ``qemu-<arch>-static`` for
the second stage on a foreign architecture), cached per suite, architecture and package
set, with the bundle installed into it; for a vendor base (Jetson's L4T, the Atlas OS)
the image is an overlay tarball to lay onto the vendor's root file system.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edgeskill.firmware_recipes import (
    FIRMWARE_DIR,
    REPO,
    Recipe,
    RecipeError,
    load_recipe,
    manylinux_tags,
    parse_lock,
)

__all__ = [
    "ImageBuildError",
    "ImageResult",
    "Settings",
    "build_bundle",
    "build_image",
    "build_rootfs",
    "cache_dir",
    "download_wheels",
    "ensure_tools",
]

_QEMU = {"aarch64": "qemu-aarch64-static", "x86_64": "qemu-x86_64-static"}
_STEP_TIMEOUT_S = 3600
Say = Callable[[str], None]


def cache_dir() -> Path:
    """Where image builds keep downloaded wheels and debootstrapped bases, for every checkout.

    ``$EDGESKILL_CACHE_DIR/firmware`` if that is set, else ``$XDG_CACHE_HOME/edgeskill/firmware``
    (``~/.cache/edgeskill/firmware``): a base takes minutes to debootstrap (far more on a
    foreign architecture, under qemu), and depends only on its suite, architecture and
    packages, so a new clone reuses it, as pip reuses its wheel cache. Wheels are checked
    against the lock's sha256 every time they are taken from it.
    """
    own = os.environ.get("EDGESKILL_CACHE_DIR")
    if own:
        return Path(own) / "firmware"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "edgeskill" / "firmware"


class ImageBuildError(Exception):
    """An image could not be built: a tool failed or is missing, or a download mismatched."""


@dataclass(frozen=True)
class ImageResult:
    """What ``build_image`` wrote."""

    bundle: Path
    bundle_tar: Path
    rootfs_tar: Path | None
    notes: tuple[str, ...]


@dataclass(frozen=True)
class Settings:
    """What is baked into an image: the hub, its trust anchors and a claim token."""

    hub_url: str = "grpcs://hub.example.net:7443"
    enroll_url: str = ""
    labels: str = "kind=camera"
    hub_ca: Path | None = None
    trusted_root: Path | None = None
    claim_token: Path | None = None


def build_image(
    target: str,
    out: Path,
    settings: Settings,
    *,
    rootfs: bool = True,
    wheels: bool = True,
    say: Say = print,
) -> ImageResult:
    """Build a target's agent bundle and, with ``rootfs``, its root file system or overlay.

    Raises:
        ImageBuildError: A step failed (also for a bad recipe or lock).
    """
    try:
        recipe = load_recipe(target)
    except RecipeError as exc:
        raise ImageBuildError(str(exc)) from exc
    out.mkdir(parents=True, exist_ok=True)
    bundle, notes = build_bundle(recipe, out / f"edgeskill-{target}-bundle", settings, wheels, say)
    bundle_tar = _tar(bundle, out / f"edgeskill-{target}-bundle.tar.gz", say)
    rootfs_tar = None
    if rootfs:
        rootfs_tar = build_rootfs(recipe, bundle, out, say)
    return ImageResult(bundle, bundle_tar, rootfs_tar, notes)


def build_bundle(
    recipe: Recipe, dest: Path, settings: Settings, wheels: bool, say: Say
) -> tuple[Path, tuple[str, ...]]:
    """Write the agent bundle folder; returns it and notes (missing wheels).

    Raises:
        ImageBuildError: The lock is absent or stale-format, or a download failed.
    """
    lock_path = FIRMWARE_DIR / "locks" / f"{recipe.target}.lock"
    try:
        lock = parse_lock(lock_path.read_text(), recipe.target)
    except (OSError, RecipeError) as exc:
        raise ImageBuildError(
            f"{recipe.target}: no usable lock ({exc}); run scripts/lock_wheels.py"
        ) from exc
    if dest.exists():
        shutil.rmtree(dest)
    common = FIRMWARE_DIR / "common"
    for sub in ("wheelhouse", "bin", "etc", "systemd"):
        (dest / sub).mkdir(parents=True)
    shutil.copy2(lock_path, dest / lock_path.name)
    shutil.copy2(common / "install.py", dest / "install.py")
    for unit in ("edgeskill-agent.service", "edgeskill-firstboot.service"):
        shutil.copy2(common / unit, dest / "systemd" / unit)
    for script in ("edgeskill-agent", "edgeskill-firstboot"):
        shutil.copy2(common / script, dest / "bin" / script)
    _write_settings(recipe, dest / "etc", settings)
    notes = tuple(f"missing: {pin}: {why}" for pin, why in lock.missing.items())
    agent_wheel = _agent_wheel(dest / "wheelhouse", say)
    if wheels:
        download_wheels(recipe, lock_path, dest / "wheelhouse", say)
    else:
        notes += ("wheelhouse left empty (--no-wheels): install.py needs it filled",)
    meta = {
        "target": recipe.target,
        "profile": recipe.profile,
        "arch": recipe.arch,
        "python": recipe.python,
        "base": recipe.vendor or f"debian {recipe.suite} {recipe.debian_arch}",
        "lock": lock_path.name,
        "agent_wheel": agent_wheel.name,
        "wheels": sorted(p.name for p in (dest / "wheelhouse").glob("*.whl")),
        "notes": list(notes),
    }
    (dest / "bundle.json").write_text(json.dumps(meta, indent=2) + "\n")
    say(f"bundle for {recipe.target}: {dest}")
    return dest, notes


def _write_settings(recipe: Recipe, etc: Path, settings: Settings) -> None:
    env = (FIRMWARE_DIR / "common" / "agent.env").read_text()
    values = {
        "EDGESKILL_HUB_URL": settings.hub_url,
        "EDGESKILL_ENROLL_URL": settings.enroll_url,
        "EDGESKILL_LABELS": f'"{settings.labels}"',
        "EDGESKILL_BOARD": recipe.profile,
    }
    lines = []
    for line in env.splitlines():
        key = line.partition("=")[0]
        lines.append(f"{key}={values[key]}" if key in values else line)
    (etc / "agent.env").write_text("\n".join(lines) + "\n")
    for source, name in (
        (settings.hub_ca, "hub-ca.crt"),
        (settings.trusted_root, "root.json"),
        (settings.claim_token, "claim-token"),
    ):
        if source is not None:
            shutil.copyfile(source, etc / name)
    if (etc / "claim-token").exists():
        (etc / "claim-token").chmod(0o600)


def _agent_wheel(wheelhouse: Path, say: Say) -> Path:
    """The agent's own wheel (pure Python), built from this checkout."""
    say("building the edgeskill wheel")
    _run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(wheelhouse), str(REPO)],
        "pip wheel",
    )  # fmt: skip
    found = sorted(wheelhouse.glob("edgeskill-*.whl"))
    if not found:
        raise ImageBuildError("pip wheel wrote no edgeskill wheel")
    return found[-1]


def download_wheels(recipe: Recipe, lock: Path, wheelhouse: Path, say: Say) -> None:
    """The lock's wheels, through a cache; pip checks every sha256 (``--require-hashes``)."""
    cache = cache_dir() / "wheels" / recipe.arch
    cache.mkdir(parents=True, exist_ok=True)
    say(f"downloading the {recipe.target} wheelhouse ({recipe.arch}) into {cache}")
    argv = [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
        "--require-hashes", "--python-version", recipe.python, "--implementation", "cp",
        "--abi", f"cp{recipe.python.replace('.', '')}", "--dest", str(cache), "-r", str(lock),
    ]  # fmt: skip
    for tag in manylinux_tags(recipe.arch, recipe.glibc):
        argv += ["--platform", tag]
    _run(argv, "pip download")
    for wheel in parse_lock(lock.read_text(), recipe.target).wheels:
        cached = cache / wheel.filename
        if hashlib.sha256(cached.read_bytes()).hexdigest() != wheel.sha256:
            raise ImageBuildError(f"{wheel.filename} does not match the lock's sha256")
        shutil.copy2(cached, wheelhouse / wheel.filename)


def build_rootfs(recipe: Recipe, bundle: Path, out: Path, say: Say) -> Path:
    """A root file system (debootstrap) or an overlay (vendor base), the bundle installed.

    Raises:
        ImageBuildError: debootstrap, qemu or the install failed.
    """
    work = out / f"{recipe.target}-root"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    kind = "overlay" if recipe.base_kind == "vendor" else "rootfs"
    if recipe.base_kind == "debootstrap":
        base = base_rootfs(recipe, say)
        _run(["tar", "-C", str(work), "-xf", str(base)], "unpacking the base")
    say(f"installing the agent bundle into the {kind}")
    _run([sys.executable, str(bundle / "install.py"), "--root", str(work)], "install.py")
    target = out / f"edgeskill-{recipe.target}-{kind}.tar.gz"
    _run(["sh", "-c", f'tar -C "{work}" -cf - . | gzip -1 > "{target}"'], "packing")
    shutil.rmtree(work)
    say(f"{kind} for {recipe.target}: {target}")
    return target


def base_rootfs(recipe: Recipe, say: Say) -> Path:
    """The debootstrapped base as a tar, built once per suite, architecture and packages."""
    key = f"base-{recipe.suite}-{recipe.debian_arch}-{'+'.join(recipe.base_packages)}"
    cached = cache_dir() / "cache" / f"{key}.tar"
    if cached.exists():
        return cached
    ensure_tools(recipe.arch)
    cached.parent.mkdir(parents=True, exist_ok=True)
    # Built in a folder of its own and cached by a rename: another build of the same
    # base at the same time, or one killed half-way, never leaves a partial one cached.
    root = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=cached.parent))
    root.chmod(0o755)  # the image's "/" (mkdtemp makes it 0700)
    partial = root.with_suffix(".tar.partial")
    try:
        _debootstrap(recipe, root, say)
        _run(["tar", "-C", str(root), "-cf", str(partial), "."], "caching the base")
        partial.replace(cached)
    finally:
        partial.unlink(missing_ok=True)
        shutil.rmtree(root, ignore_errors=True)
    return cached


def _debootstrap(recipe: Recipe, root: Path, say: Say) -> None:
    foreign = recipe.arch != _machine()
    argv = ["debootstrap", "--variant=minbase", f"--arch={recipe.debian_arch}"]
    argv += [f"--include={','.join(recipe.base_packages)}"] if recipe.base_packages else []
    argv += ["--foreign"] if foreign else []
    say(f"debootstrap {recipe.suite} {recipe.debian_arch} (minutes; cached afterwards)")
    _run([*argv, recipe.suite, str(root), recipe.mirror], "debootstrap")
    if foreign:
        qemu = shutil.which(_QEMU[recipe.arch])
        if qemu is None:
            raise ImageBuildError(
                f"{_QEMU[recipe.arch]} is missing (apt-get install qemu-user-static)"
            )
        shutil.copy2(qemu, root / "usr" / "bin" / Path(qemu).name)
        _run(["chroot", str(root), "/debootstrap/debootstrap", "--second-stage"], "second stage")


def ensure_tools(arch: str) -> None:
    """debootstrap, and qemu-user-static with its binfmt handler for a foreign ``arch``.

    Installs the Debian packages with apt when missing, mounts binfmt_misc and enables
    the handler.

    Raises:
        ImageBuildError: They are missing and could not be installed or enabled.
    """
    foreign = arch != _machine()
    wanted = ["debootstrap"] + (["qemu-user-static", "binfmt-support"] if foreign else [])
    tools = {"debootstrap": "debootstrap", "qemu-user-static": _QEMU.get(arch, ""),
             "binfmt-support": "update-binfmts"}  # fmt: skip
    if any(shutil.which(tools[p]) is None for p in wanted):
        env_apt = ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get"]
        _run([*env_apt, "update", "-qq"], "apt-get update")
        _run([*env_apt, "install", "-y", "-qq", *wanted], "apt-get install")
    if not foreign:
        return
    binfmt = Path("/proc/sys/fs/binfmt_misc")
    if not (binfmt / "register").exists():
        _run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(binfmt)], "mounting binfmt_misc")
    handler = binfmt / f"qemu-{arch}"
    if not handler.exists() or "enabled" not in handler.read_text():
        _run(["update-binfmts", "--enable", f"qemu-{arch}"], "enabling the qemu binfmt handler")
    if "enabled" not in handler.read_text():
        raise ImageBuildError(f"the binfmt handler qemu-{arch} is not enabled")


def _tar(folder: Path, target: Path, say: Say) -> Path:
    with tarfile.open(target, "w:gz", compresslevel=1) as archive:
        archive.add(folder, arcname=folder.name)
    say(f"bundle archive: {target}")
    return target


def _machine() -> str:
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def _run(argv: list[str], what: str) -> None:
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=_STEP_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ImageBuildError(f"{what} could not run: {exc}") from exc
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip()[-1500:]
        raise ImageBuildError(f"{what} failed (exit {done.returncode}): {tail}")
