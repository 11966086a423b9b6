"""``edgeskill sim``: options in, :class:`SimSettings` out, errors as exit statuses."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from edgeskill._common import console, print_error
from edgeskill.sim.params import (
    SimSettings,
    SimSettingsError,
    parse_board_mix,
    parse_version_values,
    version_specs,
)

__all__ = ["sim"]

_PER_VERSION = "VERSION=NUMBER"


def sim(
    devices: Annotated[int, typer.Option(help="How many simulated devices (real agents).")],
    transport: Annotated[str, typer.Option(metavar="grpc|mqtt", help="grpc or mqtt")] = "grpc",
    hubs: Annotated[int, typer.Option(help="Hub processes; more than 1 needs --store-url.")] = 1,
    procs: Annotated[int, typer.Option(help="Worker processes the agents are shared over.")] = 1,
    store_url: Annotated[
        str, typer.Option(help="The hub's store (PostgreSQL for several hubs); default SQLite.")
    ] = "",
    mqtt_url: Annotated[
        str, typer.Option(help="A plain broker mqtt://HOST:PORT/PREFIX (with --insecure).")
    ] = "",
    insecure: Annotated[
        bool, typer.Option("--insecure", help="No enrolment and no TLS (faster to start).")
    ] = False,
    home: Annotated[
        Path | None, typer.Option(help="An existing hub home to use instead of a new one.")
    ] = None,
    workdir: Annotated[
        Path | None, typer.Option(help="Folder for state and logs; default a temporary one.")
    ] = None,
    deploy: Annotated[
        list[str] | None,
        typer.Option(
            metavar="VERSION",
            help="Deploy this version (1.0.0 to 6.0.0) and wait; repeat for more. The first "
            "goes all at once, the others by --strategy/--plan.",
        ),
    ] = None,
    strategy: Annotated[str, typer.Option(help="The deployments' rollout strategy.")] = (
        "all-at-once"
    ),
    plan: Annotated[
        str, typer.Option(metavar="PLAN", help="The deployments' rollout plan (TOML text).")
    ] = "",
    fail_installs: Annotated[
        list[str] | None,
        typer.Option(metavar="VERSION=RATE", help="Share of devices whose install fails."),
    ] = None,
    accuracy: Annotated[
        list[str] | None, typer.Option(metavar=_PER_VERSION, help="A version's accuracy (0..1).")
    ] = None,
    latency_ms: Annotated[
        list[str] | None,
        typer.Option(metavar=_PER_VERSION, help="A version's median latency on x86-cpu, in ms."),
    ] = None,
    errors: Annotated[
        list[str] | None,
        typer.Option(metavar="VERSION=RATE", help="Share of inputs a version raises on (0..1)."),
    ] = None,
    boards: Annotated[
        str,
        typer.Option(metavar="BOARD=WEIGHT,...", help="The hardware mix from the profile table."),
    ] = "x86-cpu=0.4,arm-cpu=0.3,jetson=0.2,rpi=0.1",
    disconnect_rate: Annotated[
        float, typer.Option(metavar="NUMBER", help="Dropped connections per device per minute.")
    ] = 0.0,
    crash_rate: Annotated[
        float, typer.Option(metavar="NUMBER", help="Skill crashes per device per minute.")
    ] = 0.0,
    slow_link_ms: Annotated[
        float, typer.Option(metavar="MS", help="Delay added to every message each way.")
    ] = 0.0,
    rate: Annotated[float, typer.Option(help="Inputs per second per device.")] = 2.0,
    telemetry_window: Annotated[float, typer.Option(help="Seconds per telemetry window.")] = 2.0,
    metadata_refresh: Annotated[
        float,
        typer.Option(
            metavar="SECONDS",
            help="How often each agent refreshes its TUF metadata, from its last verification.",
        ),
    ] = 300.0,
    heartbeat: Annotated[
        int,
        typer.Option(
            metavar="SECONDS",
            help="The hub's heartbeat interval for devices (hub serve --heartbeat).",
        ),
    ] = 5,
    seed: Annotated[int, typer.Option(help="Seed of every random draw.")] = 0,
    connect_timeout: Annotated[
        float, typer.Option(help="Seconds for every device to connect.")
    ] = 120.0,
    converge_timeout: Annotated[
        float, typer.Option(help="Seconds for each deployment to converge.")
    ] = 120.0,
    soak: Annotated[
        float, typer.Option(metavar="SECONDS", help="Keep running this long after deploying.")
    ] = 0.0,
    json_out: Annotated[
        Path | None, typer.Option("--json", metavar="FILE", help="Write the summary as JSON.")
    ] = None,
) -> None:
    """Simulate a fleet: N real agents over worker processes against real hub processes.

    Only the skill's control process is simulated: per-version install failures,
    accuracy and latency (scaled by each device's board), with faults injected on
    request. Exits 1 when the fleet does not connect or a deployment does not settle
    (all its devices moved, or its staged rollout ended and rolled back).

    Examples:
      edgeskill sim --devices 200 --procs 2 --deploy 1.0.0 --deploy 2.0.0
      edgeskill sim --devices 60 --deploy 1.0.0 --deploy 2.0.0 --fail-installs 2.0.0=0.2
      edgeskill sim --devices 1000 --procs 4 --insecure --transport mqtt
        --mqtt-url mqtt://127.0.0.1:1883/sim --accuracy 2.0.0=0.85 --deploy 2.0.0
      edgeskill sim --devices 200 --insecure --deploy 1.0.0 --deploy 2.0.0
        --accuracy 2.0.0=0.85 --strategy canary
    """
    from cloud.errors import HubError  # noqa: PLC0415 - the hub only when used
    from edgeskill.sim.run import SimFailedError, run_sim  # noqa: PLC0415

    logging.basicConfig(level=logging.WARNING)
    try:
        settings = SimSettings(
            devices=devices,
            transport=transport,
            hubs=hubs,
            procs=procs,
            store_url=store_url,
            mqtt_url=mqtt_url,
            insecure=insecure,
            home=home,
            workdir=workdir,
            deploy=tuple(deploy or ()),
            strategy=strategy,
            plan=plan,
            versions=version_specs(
                parse_version_values(fail_installs or (), "--fail-installs", low=0, high=1),
                parse_version_values(accuracy or (), "--accuracy", low=0, high=1),
                parse_version_values(latency_ms or (), "--latency-ms", low=0),
                parse_version_values(errors or (), "--errors", low=0, high=1),
            ),
            boards=parse_board_mix(boards),
            disconnect_rate=disconnect_rate,
            crash_rate=crash_rate,
            slow_link_ms=slow_link_ms,
            rate_hz=rate,
            telemetry_window_s=telemetry_window,
            metadata_refresh_s=metadata_refresh,
            heartbeat_s=heartbeat,
            seed=seed,
            connect_timeout_s=connect_timeout,
            converge_timeout_s=converge_timeout,
            soak_s=soak,
            json_out=json_out,
        )
        status = run_sim(settings, console)
    except (SimSettingsError, HubError) as exc:
        print_error(str(exc))
        raise typer.Exit(2) from exc
    except (SimFailedError, TimeoutError, OSError) as exc:
        print_error(f"the simulation failed: {exc}")
        raise typer.Exit(1) from exc
    raise typer.Exit(status)
