"""One agent per state folder: a second one refuses to start and names the first."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from edge_agent.errors import AgentError
from edge_agent.state_lock import LOCK_FILE, hold_state_folder


def test_a_second_holder_is_refused_and_told_who_holds_it(tmp_path: Path) -> None:
    with hold_state_folder(tmp_path / "agent"):
        assert (tmp_path / "agent" / LOCK_FILE).read_text().strip() == str(os.getpid())
        second = hold_state_folder(tmp_path / "agent")
        with pytest.raises(AgentError, match=rf"another agent \(pid {os.getpid()}\)"):
            second.__enter__()
    with hold_state_folder(tmp_path / "agent"):  # released when the first one ended
        pass


def test_a_second_agent_process_on_one_state_folder_exits_2(tmp_path: Path) -> None:
    state = tmp_path / "agent"
    args = [sys.executable, "-m", "edgeskill.cli", "agent", "run", "--hub", "grpcs://127.0.0.1:9"]
    args += ["--device-id", "cam-1", "--state-dir", str(state)]
    with hold_state_folder(state):  # the first agent
        second = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    assert second.returncode == 2
    assert f"another agent (pid {os.getpid()}) already runs on {state}" in " ".join(
        second.stderr.split()
    )
    assert "Traceback" not in second.stdout + second.stderr
