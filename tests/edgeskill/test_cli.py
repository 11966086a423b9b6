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
    ["hub", "claim"],
    ["hub", "claim", "create"],
    ["hub", "revoke"],
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
    ["devices", "label"],
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
    unknown = runner.invoke(app, [*deploy, "--strategy", "blue-green"])
    assert unknown.exit_code == 2
    known = "known: all-at-once, canary, waves, rolling, ab"
    assert f"unknown rollout strategy 'blue-green'; {known}" in unknown.output
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
    plain = runner.invoke(app, args)
    assert plain.exit_code == 2 and "grpc:// is not authenticated" in plain.output
    tls = ["agent", "run", "--hub", "grpcs://127.0.0.1:9", "--device-id", "cam-1"]
    not_enrolled = runner.invoke(app, [*tls, "--state-dir", str(tmp_path / "agent")])
    assert not_enrolled.exit_code == 2 and "--claim-token" in not_enrolled.output
    args.append("--insecure")
    no_root = runner.invoke(app, args)
    assert "INSECURE MODE" in no_root.output
    assert no_root.exit_code == 2 and "trusted root" in no_root.output

    assert runner.invoke(app, ["hub", "init", "--home", str(tmp_path / "hub")]).exit_code == 0
    root = tmp_path / "hub" / "trust" / "metadata" / "root.json"
    bad_bind = runner.invoke(app, [*args, "--trusted-root", str(root), "--metrics-bind", "nowhere"])
    assert bad_bind.exit_code == 2 and "error" in bad_bind.output


def test_identity_commands(tmp_path: Path) -> None:
    home = tmp_path / "hub"
    init = runner.invoke(app, ["hub", "init", "--home", str(home), "--grpc-bind", "0.0.0.0:7443"])
    assert init.exit_code == 0, init.output
    assert "grpcs://0.0.0.0:7444" in init.output
    for name in ("ca.crt", "server.crt", "hub-client.crt", "crl.pem"):
        assert (home / "pki" / name).is_file()
    for name in ("ca.key", "server.key", "hub-client.key"):
        assert stat.S_IMODE((home / "pki" / name).stat().st_mode) == 0o600

    made = runner.invoke(
        app,
        ["hub", "claim", "create", "--label", "kind=camera", "--ttl", "2h", "--home", str(home)],
    )
    assert made.exit_code == 0, made.output
    token = made.output.strip()
    assert len(token) == 43 and token not in (home / "pki" / "claims.json").read_text()
    bad_ttl = runner.invoke(app, ["hub", "claim", "create", "--ttl", "soon", "--home", str(home)])
    assert bad_ttl.exit_code == 2

    unknown = runner.invoke(app, ["devices", "label", "cam-9", "kind=x", "--home", str(home)])
    assert unknown.exit_code == 2 and "no device 'cam-9'" in unknown.output
    revoke = runner.invoke(app, ["hub", "revoke", "cam-9", "--home", str(home)])
    assert revoke.exit_code == 2 and "cam-9 is not enrolled" in revoke.output


def test_an_insecure_hub_says_so_loudly(tmp_path: Path) -> None:
    home = tmp_path / "hub"
    init = runner.invoke(app, ["hub", "init", "--home", str(home), "--insecure"])
    assert init.exit_code == 0 and "INSECURE MODE" in init.output
    assert not (home / "pki").exists()


def test_an_error_text_with_brackets_is_printed_as_text_not_markup(tmp_path: Path) -> None:
    home = tmp_path / "hub"
    made = runner.invoke(app, ["hub", "init", "--home", str(home), "--insecure"])
    assert made.exit_code == 0, made.output
    # The URL the person typed comes back inside the message, with the brackets of the
    # expected form: rich must print it, not read "[/prefix]" as a closing tag.
    bad = runner.invoke(app, ["hub", "serve", "--home", str(home), "--mqtt", "http://x"])
    assert bad.exit_code == 2
    assert "error: 'http://x' is not an mqtt://host[:port][/prefix] URL" in bad.output
    assert "MarkupError" not in bad.output
