"""The README's quick start, run as written from a folder outside the clone; quiet library logs.

The quick start is the first thing a new user runs, so it is tested the way
they run it: the fenced block under "Quick start by hand" goes through bash
line by line (``set -euo pipefail``), its hub and agent in the background, and
the device has to end up running the skill and counting inferences, with
nothing new in the clone.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from edgeskill.cli import app
from tests.support import free_port, wait_for_port, wait_until

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
HEADING = "## Quick start by hand"
SETUP_LINE = "make setup && . .venv/bin/activate"
VENV_BIN = Path(sys.executable).parent
QUICK_START_PORTS = (7443, 7444)  # the hub's defaults, which the quick start uses
LIBRARY_DIGITS = REPO / "skills" / "library" / "digits"


def quick_start_block() -> str:
    """The fenced ``sh`` block under the quick-start heading of README.md."""
    section = README.read_text(encoding="utf-8").split(f"\n{HEADING}\n", 1)[1]
    return section.split("```sh\n", 1)[1].split("\n```", 1)[0]


def _edgeskill(work: Path, *args: str) -> str:
    result = subprocess.run(
        [str(VENV_BIN / "edgeskill"), *args],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    return result.stdout


def _inferences(work: Path) -> int:
    table = _edgeskill(work, "devices", "telemetry", "--home", "hub")
    row = re.search(r"cam-1\s*│\s*digits\s*│\s*1\.0\.0\s*│\s*(\d+)", table)
    return int(row.group(1)) if row else 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _stop(shell: subprocess.Popen[bytes], pids_file: Path) -> None:
    """Stop the quick start's shell (its trap stops the jobs), then any job still running."""
    if shell.poll() is None:
        shell.terminate()
        shell.wait(30)
    pids = [int(p) for p in pids_file.read_text().split()] if pids_file.exists() else []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    with contextlib.suppress(TimeoutError):
        wait_until(lambda: not any(map(_alive, pids)), 20, "the hub and the agent to stop")
    for pid in filter(_alive, pids):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _port_taken(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_readme_quick_start_runs_from_any_folder(tmp_path: Path) -> None:
    first, commands = quick_start_block().split("\n", 1)
    # The first line installs the clone's virtual environment and activates it. This
    # test already runs in that environment (the same set-up installed pytest), so
    # instead of running `make setup` again, which would reinstall into the environment
    # under test, it puts that environment's bin folder first on PATH.
    assert first.split("#", 1)[0].strip() == SETUP_LINE
    taken = [port for port in QUICK_START_PORTS if _port_taken(port)]
    assert not taken, f"the quick start needs 127.0.0.1 ports {taken} free"
    pids_file, work_file, log = tmp_path / "pids", tmp_path / "work", tmp_path / "quickstart.log"
    script = "\n".join(
        [
            "set -euo pipefail",
            "trap 'exit 143' TERM",
            "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT",
            commands,
            f"jobs -p > {pids_file}",
            f"pwd > {work_file}",
            "wait",
        ]
    )
    start_dir = tmp_path / "somewhere"
    start_dir.mkdir()
    env = {
        "PATH": f"{VENV_BIN}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "TMPDIR": str(tmp_path),  # where the quick start's `mktemp -d` makes its folder
        "COLUMNS": "200",
        "LANG": "C.UTF-8",
    }
    repo_before = set(os.listdir(REPO))
    with log.open("wb") as out:
        shell = subprocess.Popen(
            ["bash", "-c", script], cwd=start_dir, stdout=out, stderr=subprocess.STDOUT, env=env
        )
    try:
        wait_until(lambda: work_file.exists() or shell.poll() is not None, 600, "the quick start")
        assert shell.poll() is None, f"a quick-start command failed:\n{log.read_text()[-6000:]}"
        work = Path(work_file.read_text().strip())
        assert work.parent == tmp_path
        assert {"hub", "dist", "my-digits", "cam-1", "digits-stream.npz"} <= set(os.listdir(work))
        wait_until(
            lambda: "digits 1.0.0 running" in _edgeskill(work, "devices", "ls", "--home", "hub"),
            120,
            "cam-1 to run digits 1.0.0",
            interval_s=1,
        )
        wait_until(lambda: _inferences(work) > 0, 60, "cam-1's inferences", interval_s=1)
    finally:
        _stop(shell, pids_file)
    assert set(os.listdir(REPO)) - repo_before == set()


@pytest.mark.slow
@pytest.mark.parametrize("verbose", [False, True])
def test_hub_serve_prints_library_info_lines_only_when_verbose(
    tmp_path: Path, verbose: bool
) -> None:
    home, grpc, enrol = tmp_path / "hub", free_port(), free_port()
    cli = [sys.executable, "-m", "edgeskill.cli", "hub"]
    binds = ["--grpc-bind", f"127.0.0.1:{grpc}", "--enroll-bind", f"127.0.0.1:{enrol}"]
    init = subprocess.run(
        [*cli, "init", "--home", str(home), *binds],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert init.returncode == 0, init.stdout + init.stderr
    assert "alembic" not in init.stdout + init.stderr
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        serve = subprocess.Popen(
            [*cli, "serve", "--home", str(home), *(["--verbose"] if verbose else [])],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for_port(grpc, 60)
    finally:
        serve.send_signal(signal.SIGINT)
        serve.wait(30)
    text = log.read_text()
    assert "hub serving" in text  # the hub's own INFO lines stay
    assert ("INFO alembic" in text) is verbose, text


def _files(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_skill_new_copies_a_builtin_skill_out_of_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no skills/ folder here: the template comes from the package
    runner = CliRunner()
    made = runner.invoke(app, ["skill", "new", "my-digits", "--from", "digits"])
    assert made.exit_code == 0, made.output
    assert _files(tmp_path / "my-digits") == _files(LIBRARY_DIGITS)
    assert sorted(os.listdir(tmp_path)) == ["my-digits"]  # no half-copied folder left beside it


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["skill", "new", "my-digits"],
            "my-digits already exists; give a new folder for the skill",
        ),
        (
            ["skill", "new", "other", "--from", "nope"],
            "no built-in skill 'nope'; the built-in skills are: digits, face-detect, imagenet, "
            "keyword-spot, ocr, text-embed, voice-activity",
        ),
        (["skill", "new", "missing/other"], "cannot create missing/other: missing is not a folder"),
    ],
)
def test_skill_new_refuses_with_one_line_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my-digits").mkdir()
    (tmp_path / "my-digits" / "mine.txt").write_text("keep me")
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert result.output.strip() == f"error: {message}"
    assert sorted(os.listdir(tmp_path)) == ["my-digits"]
    assert _files(tmp_path / "my-digits") == {"mine.txt": b"keep me"}
