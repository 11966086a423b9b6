"""Every ``--help`` page of the real ``edgeskill`` command helps.

Each option and argument says what it is for and shows a plain metavar (FILE,
N, URL, ...) rather than a Python type (``<bool>``, ``<list[str]>``), and the
main commands carry examples.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from typer.testing import CliRunner

from edgeskill.cli import build_command

COMMAND = build_command()
PYTHON_TYPES = ("<bool>", "<str>", "<int>", "<float>", "<path>", "<list[")
MAIN_COMMANDS = [
    "hub init",
    "hub serve",
    "agent run",
    "skill build",
    "skill push",
    "deploy create",
    "model train",
    "demo",
]


def _walk(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, Any]]:
    yield " ".join(path), command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _walk(sub, (*path, name))


COMMANDS = dict(_walk(COMMAND))


def help_page(path: str) -> str:
    """``edgeskill PATH --help`` as the built command renders it."""
    with CliRunner().isolation(env={"COLUMNS": "120", "TERMINAL_WIDTH": "120"}) as (out, _, _):
        with pytest.raises(SystemExit) as exit_info:
            COMMAND.main([*path.split(), "--help"], prog_name="edgeskill")
        assert exit_info.value.code == 0
        return out.getvalue().decode()


def test_the_walk_reaches_every_command_group() -> None:
    assert {"hub init", "agent run", "model train", "trust status", "hub claim create"} <= set(
        COMMANDS
    )


def test_every_option_and_argument_says_what_it_is_for() -> None:
    missing = [
        f"edgeskill {path} {param.name}"
        for path, command in COMMANDS.items()
        for param in command.params
        if not (getattr(param, "help", None) or "").strip()
    ]
    assert missing == []


@pytest.mark.parametrize("path", sorted(COMMANDS))
def test_help_shows_plain_metavars_not_python_types(path: str) -> None:
    page = help_page(path)
    assert "Usage: edgeskill" in page
    assert [t for t in PYTHON_TYPES if t in page] == [], page


@pytest.mark.parametrize("path", MAIN_COMMANDS)
def test_main_commands_show_examples(path: str) -> None:
    page = help_page(path)
    assert "Examples" in page
    assert f"edgeskill {path} " in page.split("Examples", 1)[1]


def test_the_installed_command_sets_the_metavars() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "edgeskill.cli", "agent", "run", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={"COLUMNS": "120", "PATH": "/usr/bin:/bin"},
    )
    assert [t for t in PYTHON_TYPES if t in result.stdout] == []
    assert "--state-dir" in result.stdout and "DIR" in result.stdout
    assert "--telemetry-window" in result.stdout and "SECONDS" in result.stdout
    assert "Examples" in result.stdout
