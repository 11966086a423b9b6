"""Mistakes an operator makes with the fleet commands: exit status 2, one message, nothing changed.

Each case runs the real ``edgeskill`` command on a real hub home and checks
that the refusal names the bad value and that no deployment, group, bundle,
signed target or data set folder appeared.
"""

from __future__ import annotations

import hashlib
import os
import tomllib
from pathlib import Path

import pytest
from click.testing import Result
from typer.testing import CliRunner

from edgeskill.cli import app
from skills.bundle import build_bundle, read_manifest
from tests.support.tiny_models import digits_like_onnx, skill_source

runner = CliRunner()


def _refused(result: Result, message: str) -> None:
    """Exit status 2 and nothing but ``error: MESSAGE`` (as one message, however wrapped)."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert " ".join(result.output.split()) == f"error: {message}"


def _files(root: Path) -> dict[str, str]:
    """Every file under ``root`` by path, with its digest."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """An initialised hub home."""
    path = tmp_path / "hub"
    made = runner.invoke(app, ["hub", "init", "--home", str(path), "--insecure"])
    assert made.exit_code == 0, made.output
    return path


@pytest.fixture
def good_model(tmp_path: Path) -> bytes:
    return digits_like_onnx(tmp_path / "good.onnx").read_bytes()


def _cli(*args: str, home: Path) -> Result:
    return runner.invoke(app, [*args, "--home", str(home)])


def test_config_typos_are_refused_and_nothing_is_deployed(
    home: Path, tmp_path: Path, good_model: bytes
) -> None:
    bundle = build_bundle(skill_source(tmp_path / "src", {"m.onnx": good_model}), tmp_path / "d")
    assert _cli("skill", "push", str(bundle), home=home).exit_code == 0
    assert _cli("groups", "create", "cams", "kind=camera", home=home).exit_code == 0
    deploy = ("deploy", "create", "tiny", "1.0.0", "--group", "cams")
    before = _cli("deploy", "status", home=home).output

    for typo in ("notkv", "a:b"):
        _refused(
            _cli(*deploy, "--config", typo, home=home),
            f"bad config pair '{typo}': expected key=value (several as k=v,k=v)",
        )
    _refused(
        _cli(*deploy, "--config", "t=0.5", "--config", "mode=fast,", home=home),
        "bad config pair '': expected key=value (several as k=v,k=v)",
    )
    _refused(
        _cli(*deploy, "--config", "t=1,t=2", home=home),
        "config key 't' given twice",
    )
    assert _cli("deploy", "status", home=home).output == before

    made = _cli(*deploy, "--config", "t=0.5,mode=fast", "--config", "x=1", home=home)
    assert made.exit_code == 0, made.output
    assert "tiny" in _cli("deploy", "status", home=home).output


def test_an_empty_selector_needs_all(home: Path) -> None:
    before = _cli("groups", "ls", home=home).output
    expected = (
        "empty selector '' would select every device; give labels such as kind=camera, "
        "or --all to mean every device"
    )
    _refused(_cli("groups", "create", "everyone", "", home=home), expected)
    _refused(_cli("groups", "create", "everyone", home=home), expected)
    _refused(
        _cli("groups", "create", "everyone", "kind=camera", "--all", home=home),
        "a group of all devices takes no selector, got 'kind=camera'; drop the selector or --all",
    )
    assert _cli("groups", "ls", home=home).output == before

    made = _cli("groups", "create", "everyone", "--all", home=home)
    assert made.exit_code == 0 and "(all devices)" in made.output
    assert "everyone" in _cli("groups", "ls", home=home).output


def test_a_wrong_sha256_in_skill_toml_is_an_error_not_overwritten(
    tmp_path: Path, good_model: bytes
) -> None:
    actual = hashlib.sha256(good_model).hexdigest()
    wrong = "0" * 64
    src = skill_source(tmp_path / "src", {"m.onnx": good_model}, sha256=wrong)
    toml_before = (src / "skill.toml").read_bytes()
    out = tmp_path / "dist"

    _refused(
        runner.invoke(app, ["skill", "build", str(src), "--out", str(out)]),
        f"models/m.onnx: skill.toml declares sha256 {wrong} but the file's is {actual}; "
        "correct skill.toml, or build with --fix-hashes to use the file's",
    )
    assert (src / "skill.toml").read_bytes() == toml_before
    assert not out.exists()

    fixed = runner.invoke(app, ["skill", "build", str(src), "--out", str(out), "--fix-hashes"])
    assert fixed.exit_code == 0, fixed.output
    assert (src / "skill.toml").read_bytes() == toml_before
    assert read_manifest(out / "tiny-1.0.0.skill").models[0].sha256 == actual


def test_a_wrong_size_is_an_error_and_a_missing_hash_is_filled_in(
    tmp_path: Path, good_model: bytes
) -> None:
    src = skill_source(tmp_path / "src", {"m.onnx": good_model})
    doc = tomllib.loads((src / "skill.toml").read_text())
    assert "sha256" not in doc["models"][0] or not doc["models"][0]["sha256"]
    built = runner.invoke(app, ["skill", "build", str(src), "--out", str(tmp_path / "dist")])
    assert built.exit_code == 0, built.output
    variant = read_manifest(tmp_path / "dist" / "tiny-1.0.0.skill").models[0]
    assert (variant.sha256, variant.size) == (
        hashlib.sha256(good_model).hexdigest(),
        len(good_model),
    )

    toml = (src / "skill.toml").read_text().replace("size = 0", "size = 12")
    (src / "skill.toml").write_text(toml)
    _refused(
        runner.invoke(app, ["skill", "build", str(src), "--out", str(tmp_path / "dist2")]),
        f"models/m.onnx: skill.toml declares size 12 but the file has {len(good_model)} bytes; "
        "correct skill.toml, or build with --fix-hashes to use the file's",
    )
    assert not (tmp_path / "dist2").exists()


def test_a_junk_model_is_refused_at_build_and_at_push(home: Path, tmp_path: Path) -> None:
    src = skill_source(tmp_path / "src", {"m.onnx": os.urandom(3000)})
    out = tmp_path / "dist"
    built = runner.invoke(app, ["skill", "build", str(src), "--out", str(out)])
    assert built.exit_code == 2 and "Traceback" not in built.output
    assert " ".join(built.output.split()).startswith(
        "error: models/m.onnx (target onnx-cpu) does not load in ONNX Runtime: "
    )
    assert built.output.count("error:") == 1
    assert not out.exists()

    # A bundle built past the command (the library builds without a check) is stopped at push.
    bundle = build_bundle(src, out)
    trust_before = _files(home / "trust")
    pushed = _cli("skill", "push", str(bundle), home=home)
    assert pushed.exit_code == 2 and "Traceback" not in pushed.output
    assert " ".join(pushed.output.split()).startswith(
        "error: cannot publish tiny-1.0.0.skill: models/m.onnx (target onnx-cpu) does not load "
        "in ONNX Runtime: "
    )
    assert _files(home / "trust") == trust_before
    assert "tiny" not in _cli("skill", "ls", home=home).output


def test_an_unrunnable_target_passes_only_with_the_loud_flag(home: Path, tmp_path: Path) -> None:
    src = skill_source(tmp_path / "src", {"m.om": os.urandom(300)}, target="om")
    out = tmp_path / "dist"
    _refused(
        runner.invoke(app, ["skill", "build", str(src), "--out", str(out)]),
        "models/m.om (target om) cannot be checked here: Ascend OM models run only on an Ascend "
        "device; pass --unchecked-target om to sign it unchecked",
    )
    assert not out.exists()
    args = ["skill", "build", str(src), "--out", str(out), "--unchecked-target", "om"]
    built = runner.invoke(app, args)
    assert built.exit_code == 0, built.output
    assert "WARNING" in built.output and "models/m.om (target om) was not run" in built.output

    bundle = out / "tiny-1.0.0.skill"
    trust_before = _files(home / "trust")
    refused = _cli("skill", "push", str(bundle), home=home)
    assert refused.exit_code == 2 and "--unchecked-target om" in refused.output
    assert _files(home / "trust") == trust_before
    pushed = _cli("skill", "push", str(bundle), "--unchecked-target", "om", home=home)
    assert pushed.exit_code == 0, pushed.output
    assert "signed without being run" in pushed.output


def _undecodable_dataset(root: Path) -> Path:
    for name in ("cat", "dog"):
        (root / name).mkdir(parents=True)
        (root / name / "a.png").write_bytes(b"not a png")
    return root


def test_a_refused_data_set_leaves_no_folder(home: Path, tmp_path: Path) -> None:
    before = _files(home)
    bad = _undecodable_dataset(tmp_path / "pets")
    result = _cli("model", "train", "--dataset-dir", str(bad), home=home)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert " ".join(result.output.split()).startswith("error: data set ")
    assert "cannot decode" in result.output
    assert not (home / "datasets").exists()

    _refused(
        _cli("model", "train", "--dataset", "nope", home=home),
        "unknown built-in data set 'nope'; known: digits",
    )
    assert not (home / "datasets").exists()
    # The store's own file may change; every other file of the home stays as it was.
    assert {k: v for k, v in _files(home).items() if k != "hub.db"} == {
        k: v for k, v in before.items() if k != "hub.db"
    }
