"""``python -m edge_agent run|enroll``: the firmware's entry, with ``edgeskill agent run``'s
options."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from cryptography.x509.oid import NameOID

from edge_agent.cli import parser
from edge_agent.enrolment import load_identity
from edgeskill.cli import build_command
from tests.security.test_identity_attacks import identity_hub


def _entry_options() -> set[str]:
    run = next(action.choices["run"] for action in parser()._actions if action.dest == "command")
    return {o for action in run._actions for o in action.option_strings} - {"-h", "--help"}


def test_the_entry_and_the_edgeskill_command_take_the_same_options() -> None:
    command = build_command().commands["agent"].commands["run"]  # type: ignore[attr-defined]
    typer_options = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
    assert _entry_options() == typer_options - {"--help"}


def _run(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "edge_agent", "run", "--state-dir", "state", *args]
    env = {**os.environ, "GRPC_VERBOSITY": "ERROR"}
    return subprocess.run(
        argv, cwd=folder, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_a_refused_setting_is_one_line_exit_2_and_creates_nothing(tmp_path: Path) -> None:
    proc = _run(tmp_path, "--hub", "grpc://127.0.0.1:9", "--device-id", "cam-1")
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "grpc:// is not authenticated" in lines[0]
    assert not (tmp_path / "state").exists()


def test_a_bad_label_and_an_unreadable_token_file_are_refused(tmp_path: Path) -> None:
    base = ("--hub", "grpcs://127.0.0.1:9", "--device-id", "cam-1")
    label = _run(tmp_path, *base, "--label", "no-equals-sign")
    assert label.returncode == 2 and label.stderr.strip() == "error: labels are k=v"
    token = _run(tmp_path, *base, "--claim-token-file", str(tmp_path / "missing"))
    assert token.returncode == 2 and "claim token file" in token.stderr
    assert not (tmp_path / "state").exists()


async def _enroll(folder: Path, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "edge_agent", "enroll", *args,
        cwd=folder, env={**os.environ, "GRPC_VERBOSITY": "ERROR"},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(120):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def test_enroll_makes_the_identity_in_a_process_of_its_own_and_exits(tmp_path: Path) -> None:
    # The firmware's launcher enrols this way before it starts the agent.
    async def scenario() -> None:
        async with identity_hub(tmp_path / "hub") as hub:
            state = tmp_path / "state"
            root = hub.home / "trust" / "metadata" / "root.json"
            base = ["--hub", hub.url, "--device-id", "cam-1", "--state-dir", str(state),
                    "--trusted-root", str(root), "--hub-ca", str(hub.ca),
                    "--enroll-url", hub.enroll_url]  # fmt: skip
            code, out, err = await _enroll(tmp_path, *base, "--claim-token", "not-a-token")
            assert code == 2 and "unknown-token" in err and out == ""
            assert load_identity(state) is None  # a refusal writes no identity
            token = hub.enroller.create_claim({"kind": "camera"})
            code, out, err = await _enroll(tmp_path, *base, "--claim-token", token)
            assert code == 0, err
            assert out.startswith("cam-1 enrolled: identity in ")
            made = load_identity(state)
            assert made is not None
            names = made.certificate().subject.get_attributes_for_oid(NameOID.COMMON_NAME)
            assert [n.value for n in names] == ["cam-1"]
            serial = made.certificate().serial_number
            code, out, err = await _enroll(tmp_path, *base)  # the next boot: kept, no token
            assert code == 0 and out.startswith("cam-1 is enrolled"), err
            kept = load_identity(state)
            assert kept is not None and kept.certificate().serial_number == serial
            code, _, err = await _enroll(tmp_path, *base, "--insecure")
            assert code == 2 and "nothing to enrol" in err

    asyncio.run(scenario())
