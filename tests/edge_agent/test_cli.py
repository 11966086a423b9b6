"""``python -m edge_agent run``: the firmware's entry takes what ``edgeskill agent run`` takes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from edge_agent.cli import parser
from edgeskill.cli import build_command


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
