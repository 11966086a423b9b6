"""``edgeskill trust``: the key ceremony from the command line, on a real repository."""

from __future__ import annotations

import stat
from pathlib import Path

from typer.testing import CliRunner

from edgeskill.cli import app as main_app
from edgeskill.cli_trust import app
from skills.trust import TrustRepository

runner = CliRunner()


def _home(tmp_path: Path) -> Path:
    home = tmp_path / "hub"
    TrustRepository.init(home / "trust")
    return home


def test_moving_an_online_root_offline_then_renewing_and_rotating(tmp_path: Path) -> None:
    home = _home(tmp_path)
    status = runner.invoke(app, ["status", "--home", str(home)])
    assert status.exit_code == 0, status.output
    assert "the root key is online" in status.output

    out = tmp_path / "offline"
    made = runner.invoke(app, ["generate-root-keys", "--out", str(out), "--count", "3"])
    assert made.exit_code == 0, made.output
    keys = sorted(out.glob("root-*.pem"))
    assert len(keys) == 3
    assert all(stat.S_IMODE(k.stat().st_mode) == 0o600 for k in keys)

    new = [a for k in keys for a in ("--new-root-key", str(k))]
    rotated = runner.invoke(app, ["rotate-root", "--home", str(home), "--threshold", "2", *new])
    assert rotated.exit_code == 0, rotated.output
    assert "published root v2: 3 root keys, threshold 2" in rotated.output
    assert not (home / "trust" / "keys" / "root.pem").exists()

    # Offline now: without --root-key the command says what it needs.
    renew = runner.invoke(app, ["renew-root", "--home", str(home)])
    assert renew.exit_code == 2
    assert "the root is offline" in renew.output
    one = runner.invoke(app, ["renew-root", "--home", str(home), "--root-key", str(keys[0])])
    assert one.exit_code == 2
    assert "threshold is not met" in one.output
    two = [a for k in keys[:2] for a in ("--root-key", str(k))]
    renewed = runner.invoke(app, ["renew-root", "--home", str(home), *two])
    assert renewed.exit_code == 0, renewed.output
    assert "published root v3" in renewed.output

    key = runner.invoke(app, ["rotate-key", "targets", "--home", str(home), *two])
    assert key.exit_code == 0, key.output
    assert "published root v4 with a new targets key" in key.output
    status = runner.invoke(app, ["status", "--home", str(home)])
    assert "the root key is online" not in status.output


def test_repair_and_errors_are_clear(tmp_path: Path) -> None:
    home = _home(tmp_path)
    fine = runner.invoke(app, ["repair", "--home", str(home)])
    assert fine.exit_code == 0
    assert "nothing to do" in fine.output
    missing = runner.invoke(app, ["status", "--home", str(tmp_path / "nowhere")])
    assert missing.exit_code == 2
    assert "no TUF repository" in missing.output
    bad = runner.invoke(app, ["rotate-key", "root", "--home", str(home)])
    assert bad.exit_code == 2
    assert "has no online key" in bad.output


def test_hub_init_can_start_with_an_offline_root(tmp_path: Path) -> None:
    out = tmp_path / "offline"
    assert (
        runner.invoke(app, ["generate-root-keys", "--out", str(out), "--count", "2"]).exit_code == 0
    )
    keys = [a for k in sorted(out.glob("root-*.pem")) for a in ("--root-key", str(k))]
    home = tmp_path / "hub"
    made = runner.invoke(
        main_app, ["hub", "init", "--home", str(home), "--insecure", "--root-threshold", "2", *keys]
    )
    assert made.exit_code == 0, made.output
    assert not (home / "trust" / "keys" / "root.pem").exists()
    status = runner.invoke(app, ["status", "--home", str(home)])
    assert "the root key is online" not in status.output
    root = TrustRepository.open(home / "trust").metadata("root").signed
    assert (len(root.roles["root"].keyids), root.roles["root"].threshold) == (2, 2)

    too_many = runner.invoke(
        main_app,
        ["hub", "init", "--home", str(tmp_path / "other"), "--root-threshold", "3", *keys],
    )
    assert too_many.exit_code == 2
    assert "a root threshold of 3 needs at least that many --root-key files" in too_many.output
    assert not (tmp_path / "other").exists()  # refused before anything was written
