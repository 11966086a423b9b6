"""The agent stays small: its whole import closure loads no heavy dependency."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "fastapi", "sqlalchemy", "cloud", "converters", "onnx", "starlette")

PROBE = """
import json, sys
import edge_agent
import edge_agent.agent, edge_agent.transport.grpc, edge_agent.reconciler, edge_agent.sandbox
import edge_agent.sandbox.worker, edge_agent.runtime
print(json.dumps(sorted(m.split('.')[0] for m in sys.modules)))
"""


def test_agent_import_closure_has_no_heavy_dependencies() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True
    ).stdout
    loaded = set(json.loads(out))
    assert "edge_agent" in loaded
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))


def test_agent_cli_help_works_without_the_hub() -> None:
    # `edgeskill agent run --help` must not import the hub's dependencies either.
    probe = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from edgeskill.cli import app\n"
        "r = CliRunner().invoke(app, ['agent', 'run', '--help'])\n"
        "assert r.exit_code == 0, r.output\n"
        "assert '--hub' in r.output\n"
        "bad = [m for m in ('torch', 'sqlalchemy', 'fastapi', 'cloud') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", probe], check=True)
