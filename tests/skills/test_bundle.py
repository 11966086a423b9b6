from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from skills.archive import safe_extract, write_archive
from skills.bundle import build_bundle, install_bundle, read_manifest, verify_tree
from skills.errors import ArchiveError, BundleError, ManifestError
from skills.manifest import Manifest, ModelVariant

Snapshot = Callable[[Path], list[str]]


def test_build_fills_in_hashes_without_touching_source(skill_src: Path, tmp_path: Path) -> None:
    original = (skill_src / "skill.toml").read_text()
    bundle = build_bundle(skill_src, tmp_path / "dist")
    assert bundle == tmp_path / "dist" / "face-detect-1.2.0.skill"
    manifest = read_manifest(bundle)
    for variant in manifest.models:
        data = (skill_src / variant.path).read_bytes()
        assert variant.sha256 == hashlib.sha256(data).hexdigest()
        assert variant.size == len(data)
    assert (skill_src / "skill.toml").read_text() == original
    with tarfile.open(bundle) as tar:
        names = tar.getnames()
    assert names[0] == "skill.toml"  # the manifest first, before any folder
    assert names.index("drift/reference.json") < names.index("models/detector.onnx")
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)
    assert "data/labels.txt" in names


def test_build_is_deterministic(skill_src: Path, tmp_path: Path) -> None:
    first = build_bundle(skill_src, tmp_path / "one").read_bytes()
    for path in skill_src.rglob("*"):
        os.utime(path, (2_000_000, 2_000_000))
    second = build_bundle(skill_src, tmp_path / "two").read_bytes()
    assert first == second


def test_build_into_folder_inside_source(skill_src: Path) -> None:
    first = build_bundle(skill_src, skill_src / "dist")
    data = first.read_bytes()
    second = build_bundle(skill_src, skill_src / "dist")
    assert second.read_bytes() == data  # the first bundle was not packed into the second
    assert [p.name for p in (skill_src / "dist").iterdir()] == ["face-detect-1.2.0.skill"]


def test_build_accepts_package_entrypoint(skill_src: Path, tmp_path: Path) -> None:
    (skill_src / "control" / "detector.py").unlink()
    (skill_src / "control" / "detector").mkdir()
    (skill_src / "control" / "detector" / "__init__.py").write_text("class FaceDetect: ...\n")
    assert build_bundle(skill_src, tmp_path / "dist").exists()


@pytest.mark.parametrize(
    ("remove", "fragment"),
    [
        ("models/detector.tflite", "models/detector.tflite"),
        ("control/detector.py", "entrypoint module 'detector'"),
        ("drift/reference.json", "drift reference file"),
        ("skill.toml", "skill.toml is missing"),
    ],
)
def test_build_refuses_missing_files(
    skill_src: Path, tmp_path: Path, remove: str, fragment: str
) -> None:
    (skill_src / remove).unlink()
    with pytest.raises(BundleError, match=fragment):
        build_bundle(skill_src, tmp_path / "dist")
    assert not (tmp_path / "dist").exists()


def test_build_refuses_invalid_manifest(skill_src: Path, tmp_path: Path) -> None:
    text = (skill_src / "skill.toml").read_text().replace('"1.2.0"', '"1.2"')
    (skill_src / "skill.toml").write_text(text)
    with pytest.raises(ManifestError, match="version"):
        build_bundle(skill_src, tmp_path / "dist")


def test_build_refuses_symlinked_model(skill_src: Path, tmp_path: Path) -> None:
    target = skill_src / "models" / "detector.onnx"
    shutil.move(target, tmp_path / "real.onnx")
    target.symlink_to(tmp_path / "real.onnx")
    with pytest.raises(BundleError, match=r"detector\.onnx"):
        build_bundle(skill_src, tmp_path / "dist")


def test_install_puts_complete_bundle_in_place(
    skill_src: Path, tmp_path: Path, snapshot: Snapshot
) -> None:
    bundle = build_bundle(skill_src, tmp_path / "dist")
    dest = tmp_path / "state" / "skills" / "face-detect" / "1.2.0"
    manifest = install_bundle(bundle, dest)
    assert manifest == read_manifest(bundle)
    assert manifest.config == {} and manifest.entry_class == "FaceDetect"
    for rel in (
        "control/detector.py",
        "models/detector.onnx",
        "drift/reference.json",
        "data/labels.txt",
    ):
        assert (dest / rel).read_bytes() == (skill_src / rel).read_bytes()
    assert stat.S_IMODE(dest.stat().st_mode) == 0o755
    assert [p.name for p in dest.parent.iterdir()] == ["1.2.0"]  # no staging left
    assert not any(".staging" in p for p in snapshot(tmp_path))
    assert verify_tree(dest) == manifest


def test_install_refuses_existing_dest(skill_src: Path, tmp_path: Path) -> None:
    bundle = build_bundle(skill_src, tmp_path / "dist")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "old").write_text("keep")
    with pytest.raises(BundleError, match="already exists"):
        install_bundle(bundle, dest)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".staging")] == []
    assert (dest / "old").read_text() == "keep"


def _repack(bundle: Path, work: Path, change: Callable[[Path], None]) -> Path:
    """Unpack a built bundle, apply ``change`` to the files, and pack it again as-is."""
    unpacked = work / "unpacked"
    safe_extract(bundle, unpacked)
    change(unpacked)
    out = work / "tampered.skill"
    write_archive(unpacked, out)
    shutil.rmtree(unpacked)
    return out


def _flip_byte(root: Path) -> None:
    path = root / "models" / "detector.onnx"
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))


def _append_byte(root: Path) -> None:
    with (root / "models" / "detector.onnx").open("ab") as out:
        out.write(b"\0")


def _drop_model(root: Path) -> None:
    (root / "models" / "detector.tflite").unlink()


def _drop_entrypoint(root: Path) -> None:
    (root / "control" / "detector.py").unlink()


def _clear_hashes(root: Path) -> None:
    manifest = Manifest.from_toml((root / "skill.toml").read_text())
    unhashed = [
        ModelVariant(v.model, v.target, v.path, precision=v.precision) for v in manifest.models
    ]
    (root / "skill.toml").write_text(manifest.with_models(unhashed).to_toml())


def _break_manifest(root: Path) -> None:
    (root / "skill.toml").write_text("[skill]\nname = 'x'\n")


@pytest.mark.parametrize(
    ("change", "error", "fragment"),
    [
        (_flip_byte, BundleError, "does not match its sha256"),
        (_append_byte, BundleError, "bytes, manifest says"),
        (_drop_model, BundleError, "detector.tflite"),
        (_drop_entrypoint, BundleError, "entrypoint module"),
        (_clear_hashes, BundleError, "no sha256"),
        (_break_manifest, ManifestError, r"skill\.version: missing"),
    ],
)
def test_install_refuses_tampered_bundle(
    skill_src: Path,
    tmp_path: Path,
    snapshot: Snapshot,
    change: Callable[[Path], None],
    error: type[Exception],
    fragment: str,
) -> None:
    bundle = _repack(build_bundle(skill_src, tmp_path / "dist"), tmp_path, change)
    before = snapshot(tmp_path)
    with pytest.raises(error, match=fragment):
        install_bundle(bundle, tmp_path / "dest")
    assert snapshot(tmp_path) == before


def test_install_refuses_unsafe_archive(
    unsafe_archive: tuple[Path, Any], tmp_path: Path, snapshot: Snapshot
) -> None:
    archive, case = unsafe_archive
    (tmp_path / "box").mkdir()
    before = snapshot(tmp_path)
    with pytest.raises(ArchiveError) as err:
        install_bundle(archive, tmp_path / "box" / "dest", case.limits)
    assert case.reason in str(err.value)
    assert snapshot(tmp_path) == before  # no dest, no staging, nothing outside


def test_read_manifest_refuses_bundle_without_manifest(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "control").mkdir(parents=True)
    (src / "control" / "m.py").write_text("")
    write_archive(src, tmp_path / "empty.skill")
    with pytest.raises(BundleError, match=r"no skill\.toml"):
        read_manifest(tmp_path / "empty.skill")


def test_read_manifest_refuses_oversized_manifest(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "skill.toml").write_bytes(b"#" * 70_000)
    write_archive(src, tmp_path / "big.skill")
    with pytest.raises(ArchiveError, match="at most 65536 bytes"):
        read_manifest(tmp_path / "big.skill")
