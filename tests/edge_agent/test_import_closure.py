"""The agent stays small: its whole import closure loads no heavy dependency.

The idle agent's memory is mostly what it imported (tests/bench/bench_footprint.py
measures it); model runtimes belong in the skills' own processes, and the CLI
framework in ``edgeskill``'s commands, not in the agent the firmware starts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HEAVY = ("torch", "fastapi", "sqlalchemy", "cloud", "converters", "onnx", "starlette")
#: Model runtimes: only a skill's control process loads one.
RUNTIMES = ("onnxruntime", "openvino", "ai_edge_litert", "tflite_runtime", "acl")
#: Typer (and what it brings: Click, Rich, Pydantic) and the other commands of ``edgeskill``.
CLI_FRAMEWORK = ("typer", "click", "rich", "pydantic", "pydantic_core", "edgeskill")
#: Loaded only once there is work: numpy (~12 MB) with a skill or an input source, the
#: tensor codec and the drift statistics with it; prometheus_client (and its HTTP server)
#: with ``--metrics-bind``. An idle agent has none of them.
IDLE_DEFERRED = ("numpy", "prometheus_client")
#: Never in the agent: python-tuf's HTTP fetcher and what it brings (the agent fetches
#: TUF files over its hub connection; ``edge_agent.tuf_imports``).
NO_HTTP = ("urllib3", "http")
IDLE_DEFERRED_MODULES = (
    # Loaded at the first install: the bundle reader, tarfile and gzip.
    "skills.bundle",
    "skills.archive",
    "tarfile",
    # The link estimator's trimmed mean is plain arithmetic: no statistics, no decimal.
    "statistics",
    "decimal",
    "skills.tensor_codec",
    "skills.drift_reference",
    "skills.drift_stats",
    "edge_agent.adapters",
    "edge_agent.media",
    "edge_agent.drift",
    "edge_agent.split.device",
)

PROBE = """
import json, sys
import edge_agent
import edge_agent.agent, edge_agent.transport.grpc, edge_agent.reconciler, edge_agent.sandbox
import edge_agent.sandbox.worker, edge_agent.runtime, edge_agent.cli, edge_agent.wiring
print(json.dumps(sorted(m.split('.')[0] for m in sys.modules)))
"""


def test_agent_import_closure_has_no_heavy_dependencies() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True
    ).stdout
    loaded = set(json.loads(out))
    assert "edge_agent" in loaded
    assert not loaded & {*HEAVY, *RUNTIMES}, sorted(loaded & {*HEAVY, *RUNTIMES})


# What `python -m edge_agent run` (the firmware's entry) has loaded once its options are
# parsed and its start-up path imported, up to where it would connect (the gRPC transport).
ENTRY_PROBE = """
import json, sys
import edge_agent.cli as cli
args = cli.parser().parse_args(["run", "--hub", "grpcs://hub:7443", "--device-id", "cam-1"])
assert cli.skip_http_fetcher()  # as cli.main, before _config's checks
config = cli._config(args)
from edge_agent.startup_checks import check_run_config
from edge_agent.wiring import run_agent
import edge_agent.transport.grpc
print(json.dumps(sorted(sys.modules)))
"""


def test_the_agents_entry_loads_no_runtime_no_cli_framework_and_no_numpy() -> None:
    out = subprocess.run(
        [sys.executable, "-c", ENTRY_PROBE], capture_output=True, text=True, check=True
    ).stdout
    modules = set(json.loads(out))
    loaded = {m.split(".")[0] for m in modules}
    assert {"edge_agent", "grpc"} <= loaded  # the probe did reach the start-up path
    assert "edge_agent.transport.grpc" in modules
    unwanted = {*HEAVY, *RUNTIMES, *CLI_FRAMEWORK, *IDLE_DEFERRED, *NO_HTTP}
    assert not loaded & unwanted, sorted(loaded & unwanted)
    assert not modules & set(IDLE_DEFERRED_MODULES), sorted(modules & set(IDLE_DEFERRED_MODULES))


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


def test_an_mqtt_agent_loads_no_grpc_until_it_enrols_or_renews() -> None:
    # gRPC (~9 MB, and the code its channel runs) is for gRPC hubs and the enrolment port.
    probe = ENTRY_PROBE.replace("grpcs://hub:7443", "mqtts://hub:8883/es").replace(
        "import edge_agent.transport.grpc", "import edge_agent.transport.mqtt"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    modules = set(json.loads(out))
    assert {"edge_agent.transport.mqtt", "edge_agent.enrolment", "paho"} <= modules
    assert not {m for m in modules if m.split(".")[0] == "grpc"}, sorted(modules)


def test_the_agents_entry_never_imports_an_http_library(tmp_path: Path) -> None:
    # The real entry, up to its first refusal (not enrolled): by then it has imported
    # python-tuf's client, and the stand-in kept urllib3 and http.client out.
    argv = ["-X", "importtime", "-m", "edge_agent", "run", "--hub", "grpcs://hub:7443"]
    done = subprocess.run(
        [sys.executable, *argv, "--device-id", "cam-1"],
        check=False,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr
    assert "not enrolled" in done.stderr
    imported = {
        line.rsplit("|", 1)[1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert "tuf.ngclient.updater" in imported
    assert not {m for m in imported if m.split(".")[0] in NO_HTTP}, sorted(imported)
