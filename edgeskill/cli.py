"""The ``edgeskill`` command.

Hub and model commands import the hub lazily, so ``edgeskill agent run``
works on a device where only the ``edge`` extra is installed.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
import typer.main

from edge_agent.cli import quiet_native_logs
from edgeskill import cli_broker as broker_cli
from edgeskill import cli_console as console_cli
from edgeskill import cli_deploy as deploy_cli
from edgeskill import cli_drift as drift_cli
from edgeskill import cli_fleet as fleet_cli
from edgeskill import cli_hub as hub_cli
from edgeskill import cli_image as image_cli
from edgeskill import cli_model as model_cli
from edgeskill import cli_project as project_cli
from edgeskill import cli_trust as trust_cli
from edgeskill import cli_try
from edgeskill._common import (
    MetricsBindOpt,
    _labels,
    _warn_insecure,
    console,
    print_error,
    set_metavars,
)
from edgeskill.sim import cli as sim_cli

app = typer.Typer(
    help="EdgeSkill: train, sign and roll out AI skills to edge device fleets.",
    no_args_is_help=True,
)
hub_app = hub_cli.app
agent_app = typer.Typer(help="Run the edge agent on a device.", no_args_is_help=True)
skill_app = fleet_cli.skill_app
deploy_app = deploy_cli.deploy_app
groups_app = fleet_cli.groups_app
devices_app = fleet_cli.devices_app
claim_app = hub_cli.claim_app
app.add_typer(model_cli.app, name="model")
app.add_typer(trust_cli.app, name="trust")
app.add_typer(broker_cli.app, name="broker")
app.add_typer(drift_cli.drift_app, name="drift")
app.add_typer(console_cli.console_app, name="console")
app.add_typer(project_cli.project_app, name="project")
app.add_typer(image_cli.image_app, name="image")
for sub, name in [
    (hub_app, "hub"),
    (agent_app, "agent"),
    (skill_app, "skill"),
    (deploy_app, "deploy"),
    (groups_app, "groups"),
    (devices_app, "devices"),
]:
    app.add_typer(sub, name=name)


# -- agent -------------------------------------------------------------------


agent_app.command("try")(cli_try.agent_try)


@agent_app.command("run")
def agent_run(
    hub: Annotated[
        str,
        typer.Option(
            help="grpc://HOST:PORT, grpcs://HOST:PORT (TLS), mqtt://HOST:PORT/PREFIX or mqtts://"
        ),
    ],
    device_id: Annotated[str, typer.Option(help="This device's id, unique in the fleet.")],
    label: Annotated[list[str] | None, typer.Option(help="A label k=v; repeat for more.")] = None,
    state_dir: Annotated[Path, typer.Option(help="Folder for the agent's state.")] = Path(
        ".edgeskill/agent"
    ),
    trusted_root: Annotated[Path | None, typer.Option(help="The hub's TUF root.json.")] = None,
    board: Annotated[
        str | None, typer.Option(help="Board from the profile table instead of detection.")
    ] = None,
    source: Annotated[
        Path | None, typer.Option(help="Replay file (.npz with x, y) to feed skills.")
    ] = None,
    source_loop: Annotated[bool, typer.Option(help="Replay the source forever.")] = False,
    source_rate: Annotated[float, typer.Option(help="Source items per second per skill.")] = 200.0,
    telemetry_window: Annotated[float, typer.Option(help="Seconds per telemetry window.")] = 2.0,
    ca: Annotated[
        Path | None, typer.Option(help="grpcs://: CA (PEM) the hub's certificate chains to.")
    ] = None,
    cert: Annotated[
        Path | None, typer.Option(help="grpcs://: this device's client certificate (PEM).")
    ] = None,
    key: Annotated[Path | None, typer.Option(help="grpcs://: the client key (PEM).")] = None,
    hub_ca: Annotated[
        Path | None, typer.Option(help="The hub's CA (PEM), to enrol and to check the hub.")
    ] = None,
    claim_token: Annotated[
        str | None, typer.Option(help="A claim token, to enrol on the first start.")
    ] = None,
    claim_token_file: Annotated[
        Path | None, typer.Option(help="A file holding the claim token (kept off the ps list).")
    ] = None,
    enroll_url: Annotated[
        str | None,
        typer.Option(help="grpcs://HOST:PORT where the hub enrols; default hub port + 1."),
    ] = None,
    director_key: Annotated[
        Path | None, typer.Option(help="The director's public key, for setups without enrolment.")
    ] = None,
    metrics_bind: MetricsBindOpt = None,
    insecure: Annotated[
        bool,
        typer.Option(
            "--insecure",
            help="DANGEROUS: no identity, plain transport, unsigned desired states accepted.",
        ),
    ] = False,
    verbose: Annotated[
        bool, typer.Option(help="Log debug lines, and the libraries' INFO lines too.")
    ] = False,
) -> None:
    """Connect this device to a hub and keep its skills in the desired state.

    The first start enrols with --claim-token and --hub-ca; later starts reuse the
    identity kept in the state folder and renew its certificate when due.

    Examples:
      edgeskill agent run --hub grpcs://hub:7443 --device-id cam-1 --claim-token TOKEN
        --hub-ca ca.crt --trusted-root root.json --state-dir cam-1
      edgeskill agent run --hub grpcs://hub:7443 --device-id cam-1 --state-dir cam-1
        --trusted-root root.json --source stream.npz --source-loop
    """
    from edge_agent.cli import run_command  # noqa: PLC0415
    from edge_agent.config import AgentConfig  # noqa: PLC0415

    labels = _labels(label)
    if insecure:
        _warn_insecure()
    token = claim_token
    if claim_token_file is not None:
        token = _read_token(claim_token_file)
    config = AgentConfig(
        hub_url=hub,
        device_id=device_id,
        state_dir=state_dir,
        labels=labels,
        board=board,
        trusted_root=trusted_root,
        source=source,
        source_loop=source_loop,
        source_rate_hz=source_rate,
        telemetry_window_s=telemetry_window,
        tls_ca=ca or hub_ca,
        tls_cert=cert,
        tls_key=key,
        metrics_bind=metrics_bind,
        insecure=insecure,
        director_key=director_key,
        claim_token=token,
        enroll_url=enroll_url,
    )
    status = run_command(config, verbose=verbose, on_error=print_error)
    if status:
        raise typer.Exit(status)


def _read_token(path: Path) -> str:
    from edge_agent.startup_checks import SettingsError, read_claim_token  # noqa: PLC0415

    try:
        return read_claim_token(path)
    except SettingsError as exc:
        print_error(str(exc))
        raise typer.Exit(2) from exc


# -- the fleet simulator -----------------------------------------------------

app.command("sim")(sim_cli.sim)


# -- the demo ----------------------------------------------------------------


@app.command("demo")
def demo(
    keep: Annotated[bool, typer.Option(help="Leave the hub and agents running.")] = False,
    transport: Annotated[str, typer.Option(help="grpc or mqtt")] = "grpc",
    workdir: Annotated[
        Path | None, typer.Option(help="Folder for demo state; default a fresh temp dir.")
    ] = None,
    split: Annotated[
        bool,
        typer.Option(
            "--split",
            help="Split inference instead: one agent behind an emulated link; the cut follows it.",
        ),
    ] = False,
    drift: Annotated[
        bool,
        typer.Option(
            "--drift",
            help="Drift instead: three of four cameras see shifted digits; the hub retrains.",
        ),
    ] = False,
) -> None:
    """Hub + three agents end to end: train, sign, deploy to cameras, classify, report.

    With --split: a hub and one agent (gRPC) whose link is emulated; the agent
    classifies photos with EfficientNet-Lite0 split between device and hub, the
    link changes, and a table shows the cut the agent chose in each phase.

    With --drift: four cameras (gRPC); three are restarted on shifted digits, the
    hub's drift loop opens an incident, retrains, canaries and promotes the next
    version; a table shows each phase and drift.png plots fleet accuracy.

    Examples:
      edgeskill demo
      edgeskill demo --transport mqtt
      edgeskill demo --keep --workdir demo-state
      edgeskill demo --split
      edgeskill demo --drift --workdir drift-demo
    """
    if drift:
        if keep or transport != "grpc" or split:
            print_error(
                "--drift runs over gRPC and stops when done (no --keep, --transport, --split)"
            )
            raise typer.Exit(2)
        from edgeskill.demo_drift import run_drift_demo  # noqa: PLC0415

        raise typer.Exit(run_drift_demo(console, workdir=workdir))
    if split:
        if keep or transport != "grpc":
            print_error("--split runs over gRPC and stops when done (no --keep, no --transport)")
            raise typer.Exit(2)
        from edgeskill.demo_split import run_split_demo  # noqa: PLC0415

        raise typer.Exit(run_split_demo(console, workdir=workdir))
    from edgeskill.demo import run_demo  # noqa: PLC0415

    raise typer.Exit(run_demo(console, keep=keep, transport=transport, workdir=workdir))


def build_command() -> Any:
    """The ``edgeskill`` click command, with plain metavars on every help page."""
    return set_metavars(typer.main.get_command(app))


def main() -> None:
    """Entry point of the ``edgeskill`` command."""
    quiet_native_logs(verbose="--verbose" in sys.argv[1:])
    build_command()()


if __name__ == "__main__":
    main()
