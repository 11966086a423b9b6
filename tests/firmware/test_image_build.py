"""``edgeskill image build``: the agent bundle's contents, per target, and its installer.

The arm64-cpu bundle is built with its wheelhouse (downloaded once into
~/.cache/edgeskill/firmware/wheels, every wheel checked against the lock's sha256) and installed
into a folder with the bundle's own stdlib installer; the other targets' bundles are
checked without their wheelhouses (Jetson's onnxruntime-gpu alone is hundreds of MB).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from edgeskill.cli_image import image_app
from edgeskill.firmware_build import ImageBuildError, Settings, build_image
from edgeskill.firmware_recipes import FIRMWARE_DIR, TARGETS, parse_lock


def settings(tmp_path: Path) -> Settings:
    (tmp_path / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    (tmp_path / "root.json").write_text("{}")
    (tmp_path / "token").write_text("claim-abc\n")
    return Settings(
        hub_url="grpcs://hub.plant-3:7443",
        enroll_url="grpcs://hub.plant-3:7444",
        labels="kind=camera site=plant-3",
        hub_ca=tmp_path / "ca.crt",
        trusted_root=tmp_path / "root.json",
        claim_token=tmp_path / "token",
    )


def check_bundle_layout(bundle: Path, target: str) -> dict:  # type: ignore[type-arg]
    meta = json.loads((bundle / "bundle.json").read_text())
    assert (meta["target"], meta["profile"]) == (target, target)
    assert (bundle / meta["lock"]).read_text() == (
        FIRMWARE_DIR / "locks" / f"{target}.lock"
    ).read_text()
    assert meta["agent_wheel"].startswith("edgeskill-") and meta["agent_wheel"].endswith(
        "-py3-none-any.whl"
    )
    assert (bundle / "wheelhouse" / meta["agent_wheel"]).is_file()
    for script in ("edgeskill-agent", "edgeskill-firstboot"):
        mode = (bundle / "bin" / script).stat().st_mode
        assert mode & stat.S_IXUSR, script
    unit = (bundle / "systemd" / "edgeskill-agent.service").read_text()
    assert "ExecStart=/opt/edgeskill/bin/edgeskill-agent" in unit
    assert "Requires=edgeskill-firstboot.service" in unit
    first = (bundle / "systemd" / "edgeskill-firstboot.service").read_text()
    assert "ConditionPathExists=!/var/lib/edgeskill/.firstboot-done" in first
    env = (bundle / "etc" / "agent.env").read_text()
    assert "EDGESKILL_HUB_URL=grpcs://hub.plant-3:7443" in env
    assert "EDGESKILL_ENROLL_URL=grpcs://hub.plant-3:7444" in env
    assert f"EDGESKILL_BOARD={target}" in env
    assert 'EDGESKILL_LABELS="kind=camera site=plant-3"' in env
    token = bundle / "etc" / "claim-token"
    assert token.read_text() == "claim-abc\n" and stat.S_IMODE(token.stat().st_mode) == 0o600
    assert (bundle / "etc" / "hub-ca.crt").exists() and (bundle / "etc" / "root.json").exists()
    return meta


@pytest.mark.parametrize("target", TARGETS)
def test_bundle_layout_for_every_target(target: str, tmp_path: Path) -> None:
    result = build_image(
        target, tmp_path / "out", settings(tmp_path), rootfs=False, wheels=False, say=lambda _: None
    )
    meta = check_bundle_layout(result.bundle, target)
    with tarfile.open(result.bundle_tar) as archive:
        names = set(archive.getnames())
    assert f"edgeskill-{target}-bundle/install.py" in names
    assert f"edgeskill-{target}-bundle/etc/claim-token" in names
    if target == "jetson":
        assert any("tensorrt==11.4.0.106" in note for note in meta["notes"])
    assert any("--no-wheels" in note for note in meta["notes"])


@pytest.mark.slow
def test_arm64_bundle_with_wheelhouse_installs_into_a_root(tmp_path: Path) -> None:
    result = build_image(
        "arm64-cpu", tmp_path / "out", settings(tmp_path), rootfs=False, say=lambda _: None
    )
    meta = check_bundle_layout(result.bundle, "arm64-cpu")
    lock = parse_lock((FIRMWARE_DIR / "locks" / "arm64-cpu.lock").read_text(), "arm64-cpu")
    assert set(meta["wheels"]) == {w.filename for w in lock.wheels} | {meta["agent_wheel"]}
    assert all("aarch64" in w or w.endswith("-any.whl") for w in meta["wheels"])
    root = tmp_path / "device"
    done = subprocess.run(
        [sys.executable, str(result.bundle / "install.py"), "--root", str(root)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lib = root / "opt" / "edgeskill" / "lib"
    for package in ("edge_agent", "skills", "protos", "ai_edge_litert", "onnxruntime", "grpc"):
        assert (lib / package).is_dir(), package
    assert list((lib / "numpy" / "_core").glob("*aarch64-linux-gnu.so"))
    # Compiled at install: the agent's user cannot write there, so it would compile each start.
    tag = sys.implementation.cache_tag
    assert (lib / "edge_agent" / "__pycache__" / f"agent.{tag}.pyc").is_file()
    assert (lib / "grpc" / "__pycache__" / f"__init__.{tag}.pyc").is_file()
    wants = root / "etc" / "systemd" / "system" / "multi-user.target.wants"
    assert os.readlink(wants / "edgeskill-agent.service") == (
        "/etc/systemd/system/edgeskill-agent.service"
    )
    assert (root / "etc" / "edgeskill" / "claim-token").exists()
    # A device's own settings survive a reinstall.
    (root / "etc" / "edgeskill" / "agent.env").write_text("EDGESKILL_HUB_URL=grpcs://mine:1\n")
    subprocess.run([sys.executable, str(result.bundle / "install.py"), "--root", str(root)],
                   capture_output=True, check=True, timeout=300)  # fmt: skip
    assert "mine" in (root / "etc" / "edgeskill" / "agent.env").read_text()


def test_a_tampered_wheel_is_refused_by_the_installer(tmp_path: Path) -> None:
    result = build_image(
        "arm64-cpu", tmp_path / "out", settings(tmp_path), rootfs=False, wheels=False,
        say=lambda _: None,
    )  # fmt: skip
    lock = parse_lock((result.bundle / "arm64-cpu.lock").read_text(), "arm64-cpu")
    for wheel in lock.wheels:
        (result.bundle / "wheelhouse" / wheel.filename).write_bytes(b"not the wheel")
    done = subprocess.run(
        [sys.executable, str(result.bundle / "install.py"), "--root", str(tmp_path / "r")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode != 0 and "does not match the lock's sha256" in done.stderr


def test_unknown_target_fails_cleanly_on_the_command_line(tmp_path: Path) -> None:
    with pytest.raises(ImageBuildError, match="unknown target"):
        build_image("toaster", tmp_path, Settings(), rootfs=False, wheels=False)
    app = typer.Typer()
    app.add_typer(image_app, name="image")
    out = CliRunner().invoke(app, ["image", "build", "--target", "toaster", "--out", str(tmp_path)])
    assert out.exit_code == 1 and "unknown target" in out.output
