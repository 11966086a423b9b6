"""A bundle's ``[drift]`` table and the reference file it names, read as hostile input.

The manifest side (paths, names, caps) is refused field by field in
``test_manifest.py``; here the file itself: written and read back, and every
way a publisher can get it wrong refused at build and publish time, while a
device still installs a bundle whose reference does not parse.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from skills.bundle import build_bundle, install_bundle, read_manifest
from skills.drift_reference import ReferenceLimits, build_reference
from skills.drift_spec import DriftSpec, read_reference, write_reference
from skills.errors import BundleError, DriftReferenceError, ManifestError
from skills.model_check import check_bundle
from tests.skills.conftest import REFERENCE
from tests.support.skillkit import rewrite_bundle

SPEC = DriftSpec("drift/reference.json", ("brightness",))


def test_a_written_reference_reads_back_with_its_table(tmp_path: Path) -> None:
    built = build_reference([1, 2, 2], [0.9, 0.8, 0.7], {"ink": [0.1, 0.2, 0.3], "edges": [1.0]})
    spec = write_reference(tmp_path, built)
    assert spec == DriftSpec("drift/reference.json", ("edges", "ink"))
    assert read_reference(tmp_path, spec) == built
    other = write_reference(tmp_path, built, "stats/ref.json")
    assert other.reference == "stats/ref.json" and read_reference(tmp_path, other) == built


def test_a_reference_the_manifest_cannot_declare_is_not_written(tmp_path: Path) -> None:
    built = build_reference([1], [0.9], {"Mean Ink": [0.1]})
    with pytest.raises(ManifestError, match="inputs"):
        write_reference(tmp_path, built)
    assert not (tmp_path / "drift").exists()


def test_the_table_validates_itself() -> None:
    assert DriftSpec("r.json").inputs == ()
    assert DriftSpec("r.json", ["a", "b"]).inputs == ("a", "b")  # type: ignore[arg-type]
    for bad in ("../r.json", "r.txt", ""):
        with pytest.raises(ManifestError, match="reference"):
            DriftSpec(bad)
    with pytest.raises(ManifestError, match="inputs"):
        DriftSpec("r.json", "ink")  # type: ignore[arg-type]


def _write(root: Path, data: str | bytes) -> None:
    path = root / "drift" / "reference.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)


def test_a_valid_file_is_read(tmp_path: Path) -> None:
    _write(tmp_path, REFERENCE)
    assert read_reference(tmp_path, SPEC).input("brightness").n == 3


@pytest.mark.parametrize(
    ("content", "spec", "match"),
    [
        ("{not json", SPEC, "not valid JSON"),
        ('{"format": "x"}', SPEC, "drift reference"),
        (b"\xff\xfe", SPEC, "not valid JSON"),
        (
            REFERENCE,
            DriftSpec("drift/reference.json", ()),
            r"holds input summaries \['brightness'\]",
        ),
        (REFERENCE, DriftSpec("drift/reference.json", ("brightness", "ink")), "declares"),
        (REFERENCE, DriftSpec("drift/other.json", ("brightness",)), "cannot open"),
    ],
    ids=["not-json", "not-a-reference", "bad-utf8", "undeclared", "missing-input", "missing"],
)
def test_a_bad_file_is_refused(
    tmp_path: Path, content: str | bytes, spec: DriftSpec, match: str
) -> None:
    _write(tmp_path, content)
    with pytest.raises(DriftReferenceError, match=match):
        read_reference(tmp_path, spec)


def test_an_oversized_file_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    _write(tmp_path, REFERENCE + " " * 100)
    with pytest.raises(DriftReferenceError, match="over the cap of 64 bytes"):
        read_reference(tmp_path, SPEC, ReferenceLimits(max_bytes=64))


def test_links_pipes_and_folders_are_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    _write(outside, REFERENCE)
    root = tmp_path / "bundle"
    (root / "drift").mkdir(parents=True)
    (root / "drift" / "reference.json").symlink_to(outside / "drift" / "reference.json")
    with pytest.raises(DriftReferenceError, match="leaves the bundle"):
        read_reference(root, SPEC)
    (root / "drift" / "reference.json").unlink()
    _write(root / "copy", REFERENCE)  # a link that stays inside is not followed either
    (root / "drift" / "reference.json").symlink_to(root / "copy" / "drift" / "reference.json")
    with pytest.raises(DriftReferenceError, match="cannot open"):
        read_reference(root, SPEC)
    (root / "drift" / "reference.json").unlink()
    os.mkfifo(root / "drift" / "reference.json")  # opening it must not block
    with pytest.raises(DriftReferenceError, match="not a regular file"):
        read_reference(root, SPEC)
    (root / "drift" / "reference.json").unlink()
    (root / "drift" / "reference.json").mkdir()
    with pytest.raises(DriftReferenceError, match="not a regular file"):
        read_reference(root, SPEC)
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "drift").symlink_to(outside / "drift")
    with pytest.raises(DriftReferenceError, match="leaves the bundle"):
        read_reference(linked, SPEC)


def test_a_bundle_ships_its_reference_and_one_without_stays_valid(
    skill_src: Path, tmp_path: Path
) -> None:
    bundle = build_bundle(skill_src, tmp_path / "dist")
    assert read_manifest(bundle).drift == SPEC
    installed = install_bundle(bundle, tmp_path / "installed")
    assert installed.drift == SPEC
    assert read_reference(tmp_path / "installed", SPEC).input("brightness").n == 3
    text = (skill_src / "skill.toml").read_text()
    (skill_src / "skill.toml").write_text(text.split("[drift]")[0])
    (skill_src / "drift" / "reference.json").unlink()
    plain = build_bundle(skill_src, tmp_path / "plain")
    assert read_manifest(plain).drift is None
    assert install_bundle(plain, tmp_path / "plain-installed").drift is None


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("{not json", "not valid JSON"),
        (build_reference(["a"], [0.5]).to_json(), "holds input summaries"),
        (" " * ((1 << 20) + 1), "over the cap"),
    ],
    ids=["malformed", "inconsistent", "oversized"],
)
def test_the_build_refuses_a_bad_reference(
    skill_src: Path, tmp_path: Path, content: str, match: str
) -> None:
    _write(skill_src, content)
    with pytest.raises(DriftReferenceError, match=match):
        build_bundle(skill_src, tmp_path / "dist")
    assert not (tmp_path / "dist").exists()


def test_the_hub_refuses_a_bad_reference_a_device_installs_it(
    skill_src: Path, tmp_path: Path
) -> None:
    good = build_bundle(skill_src, tmp_path / "dist")
    bad = rewrite_bundle(good, tmp_path / "bad.skill", {"drift/reference.json": b"{not json"})
    # The hub's check before signing: the publisher is at fault, nothing is signed.
    with pytest.raises(BundleError, match="drift reference: not valid JSON"):
        check_bundle(bad, unchecked_targets=("onnx-cpu", "tflite"))
    # A device installs what a hub signed anyway, and runs it without drift statistics.
    manifest = install_bundle(bad, tmp_path / "installed")
    assert manifest.drift == SPEC
    with pytest.raises(DriftReferenceError):
        read_reference(tmp_path / "installed", SPEC)
