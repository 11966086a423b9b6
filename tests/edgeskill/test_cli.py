"""The command line: every command explains itself, and the hub commands work on a real home."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from edgeskill.cli import app

COMMANDS = [
    [],
    ["hub"],
    ["hub", "init"],
    ["hub", "serve"],
    ["hub", "issue-cert"],
    ["agent", "run"],
    ["skill", "build"],
    ["skill", "push"],
    ["skill", "ls"],
    ["deploy", "create"],
    ["deploy", "status"],
    ["deploy", "abort"],
    ["groups", "create"],
    ["groups", "ls"],
    ["devices", "ls"],
    ["model", "train"],
    ["model", "compress"],
    ["model", "convert"],
    ["model", "ls"],
    ["model", "show"],
    ["demo"],
]

runner = CliRunner()


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "edgeskill")
def test_every_command_has_useful_help(command: list[str]) -> None:
    result = runner.invoke(app, [*command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output
    assert len(result.output.splitlines()) > 4


def test_hub_commands_on_a_fresh_home(tmp_path: Path) -> None:
    home = tmp_path / "hub"
    assert runner.invoke(app, ["hub", "init", "--home", str(home)]).exit_code == 0
    keys = list((home / "trust" / "keys").iterdir())
    assert keys and all(stat.S_IMODE(k.stat().st_mode) == 0o600 for k in keys)
    again = runner.invoke(app, ["hub", "init", "--home", str(home)])
    assert again.exit_code == 2 and "already" in again.output

    assert (
        runner.invoke(
            app, ["groups", "create", "cams", "kind=camera", "--home", str(home)]
        ).exit_code
        == 0
    )
    listed = runner.invoke(app, ["groups", "ls", "--home", str(home)])
    assert "cams" in listed.output and "kind=camera" in listed.output

    missing = runner.invoke(
        app, ["deploy", "create", "digits", "9.9.9", "--group", "cams", "--home", str(home)]
    )
    assert missing.exit_code == 2 and "error" in missing.output
    deploy = ["deploy", "create", "digits", "9.9.9", "--group", "cams", "--home", str(home)]
    unknown = runner.invoke(app, [*deploy, "--strategy", "canary"])
    assert unknown.exit_code == 2
    assert "unknown rollout strategy 'canary'; known: all-at-once" in unknown.output
    devices = runner.invoke(app, ["devices", "ls", "--home", str(home)])
    assert devices.exit_code == 0 and "desired gen" in devices.output
    assert "digits" not in runner.invoke(app, ["deploy", "status", "--home", str(home)]).output


def test_commands_on_a_missing_home_say_how_to_start(tmp_path: Path) -> None:
    result = runner.invoke(app, ["devices", "ls", "--home", str(tmp_path / "nowhere")])
    assert result.exit_code == 2
    assert "hub init" in result.output


def test_agent_with_a_bad_setting_says_so_and_exits_2(tmp_path: Path) -> None:
    args = ["agent", "run", "--hub", "grpc://127.0.0.1:9", "--device-id", "cam-1"]
    args += ["--state-dir", str(tmp_path / "agent")]
    no_root = runner.invoke(app, args)
    assert no_root.exit_code == 2 and "trusted root" in no_root.output

    assert runner.invoke(app, ["hub", "init", "--home", str(tmp_path / "hub")]).exit_code == 0
    root = tmp_path / "hub" / "trust" / "metadata" / "root.json"
    bad_bind = runner.invoke(app, [*args, "--trusted-root", str(root), "--metrics-bind", "nowhere"])
    assert bad_bind.exit_code == 2 and "error" in bad_bind.output
