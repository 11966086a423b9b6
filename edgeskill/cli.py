"""The ``edgeskill`` command.

Hub and model commands import the hub lazily, so ``edgeskill agent run``
works on a device where only the ``edge`` extra is installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from edgeskill import cli_broker as broker_cli
from edgeskill import cli_model as model_cli
from edgeskill import cli_trust as trust_cli

if TYPE_CHECKING:
    from cloud.service import FleetService

# Tables stay readable when output goes to a file or a CI log.
console = Console(width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 120)
app = typer.Typer(
    help="EdgeSkill: train, sign and roll out AI skills to edge device fleets.",
    no_args_is_help=True,
)
hub_app = typer.Typer(help="Run and set up the cloud hub.", no_args_is_help=True)
agent_app = typer.Typer(help="Run the edge agent on a device.", no_args_is_help=True)
skill_app = typer.Typer(help="Build, publish and list skill bundles.", no_args_is_help=True)
deploy_app = typer.Typer(help="Roll skill versions out to device groups.", no_args_is_help=True)
groups_app = typer.Typer(help="Named label selectors over devices.", no_args_is_help=True)
devices_app = typer.Typer(help="The devices the hub knows.", no_args_is_help=True)
claim_app = typer.Typer(
    help="Claim tokens: how new devices enrol and get a certificate.", no_args_is_help=True
)
hub_app.add_typer(claim_app, name="claim")
app.add_typer(model_cli.app, name="model")
app.add_typer(trust_cli.app, name="trust")
app.add_typer(broker_cli.app, name="broker")
for sub, name in [
    (hub_app, "hub"),
    (agent_app, "agent"),
    (skill_app, "skill"),
    (deploy_app, "deploy"),
    (groups_app, "groups"),
    (devices_app, "devices"),
]:
    app.add_typer(sub, name=name)

HomeOpt = Annotated[
    Path,
    typer.Option(
        "--home", envvar="EDGESKILL_HOME", help="The hub's home folder (config, keys, store)."
    ),
]
DEFAULT_HOME = Path(".edgeskill/hub")
TlsCertOpt = Annotated[
    Path | None, typer.Option(help="The hub's TLS certificate (PEM); turns on mTLS for gRPC.")
]
TlsKeyOpt = Annotated[Path | None, typer.Option(help="The hub certificate's private key (PEM).")]
ClientCaOpt = Annotated[
    Path | None, typer.Option(help="CA (PEM) that signs device client certificates.")
]
MetricsBindOpt = Annotated[
    str | None, typer.Option(help="Serve Prometheus metrics on HOST:PORT (default: off).")
]
InsecureOpt = Annotated[
    bool,
    typer.Option(
        "--insecure",
        help="DANGEROUS: plain gRPC with no device identities. Closed test networks only.",
    ),
]
_TTL_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _warn_insecure() -> None:
    console.print(
        "[bold red]WARNING: INSECURE MODE.[/] No TLS and no device identities: anyone who "
        "reaches this port can act as any device. Use it only on a closed test network."
    )


def _ttl_seconds(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``12h`` or ``1d`` in seconds."""
    unit = text[-1:] if text[-1:] in _TTL_UNITS else "s"
    number = text[:-1] if text[-1:] in _TTL_UNITS else text
    try:
        return float(number) * _TTL_UNITS[unit]
    except ValueError as exc:
        raise typer.BadParameter(f"{text!r} is not a duration such as 1d, 12h, 30m") from exc


def _labels(items: list[str] | None) -> dict[str, str]:
    labels = dict(item.split("=", 1) for item in (items or []) if "=" in item)
    if len(labels) != len(items or []):
        console.print("[red]error:[/] labels are k=v")
        raise typer.Exit(2)
    return labels


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def _run_until_signal(main: object) -> None:
    """Run an ``async def main(stop)`` until SIGINT or SIGTERM."""

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await main(stop)  # type: ignore[operator]

    asyncio.run(runner())


def _open_hub(home: Path) -> Any:
    """Open the hub home (for ``hub serve``); a missing hub ends with a hint and exit status 2."""
    from cloud.errors import HubError  # noqa: PLC0415
    from cloud.hub import Hub  # noqa: PLC0415

    try:
        return Hub.open(home)
    except HubError as exc:
        console.print(f"[red]error:[/] {exc}. Run `edgeskill hub init --home {home}` first.")
        raise typer.Exit(2) from exc


@contextlib.contextmanager
def _hub(home: Path) -> Iterator[Any]:
    """Open the hub home to serve it; its errors become a message and exit status 2."""
    from cloud.errors import HubError, TransportError  # noqa: PLC0415
    from skills.errors import SkillError  # noqa: PLC0415

    hub = _open_hub(home)
    try:
        yield hub
    except (HubError, SkillError, TransportError) as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    finally:
        hub.close()


@contextlib.contextmanager
def _fleet(home: Path) -> Iterator[FleetService]:
    """Open the fleet service for one command; hub errors become a message and exit status 2."""
    from cloud.errors import HubError  # noqa: PLC0415
    from cloud.service import FleetService  # noqa: PLC0415

    try:
        fleet = FleetService.open(home)
    except HubError as exc:
        console.print(f"[red]error:[/] {exc}. Run `edgeskill hub init --home {home}` first.")
        raise typer.Exit(2) from exc
    try:
        yield fleet
    except HubError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    finally:
        fleet.close()


# -- hub ---------------------------------------------------------------------


@hub_app.command("init")
def hub_init(
    home: HomeOpt = DEFAULT_HOME,
    store_url: Annotated[
        str | None, typer.Option(help="SQLAlchemy URL; default SQLite in the home.")
    ] = None,
    grpc_bind: Annotated[
        str, typer.Option(help="Address the gRPC server listens on.")
    ] = "127.0.0.1:7443",
    mqtt: Annotated[
        str,
        typer.Option(help="Also serve devices through this broker: mqtt://HOST:1883/PREFIX."),
    ] = "",
    tls_cert: TlsCertOpt = None,
    tls_key: TlsKeyOpt = None,
    client_ca: ClientCaOpt = None,
    enroll_bind: Annotated[
        str, typer.Option(help="Where devices enrol (server TLS); default the gRPC port + 1.")
    ] = "",
    server_name: Annotated[
        list[str] | None,
        typer.Option(help="Another DNS name or address for the hub's certificate; repeat."),
    ] = None,
    root_key: Annotated[
        list[Path] | None,
        typer.Option(
            help="An offline TUF root key (from `trust generate-root-keys`); repeat. "
            "Without: the root key is kept online (move it offline, see SECURITY.md)."
        ),
    ] = None,
    root_threshold: Annotated[int, typer.Option(help="Root keys needed to sign a root.")] = 1,
    insecure: InsecureOpt = False,
) -> None:
    """Create a hub home: signing keys (mode 0600), TUF metadata, the store and its CA.

    The CA, the hub's certificate, its MQTT client certificate and an empty CRL
    go in HOME/pki; gRPC then serves mutual TLS and devices enrol with claim tokens.
    """
    from cloud.errors import HubError  # noqa: PLC0415
    from cloud.hub import Hub  # noqa: PLC0415

    if insecure:
        _warn_insecure()
    try:
        tls = _tls_files(tls_cert, tls_key, client_ca)
        hub = Hub.init(
            home,
            store_url,
            grpc_bind,
            mqtt,
            tls,
            insecure=insecure,
            enroll_bind=enroll_bind,
            server_names=tuple(server_name or ()),
            root_keys=tuple(root_key or ()),
            root_threshold=root_threshold,
        )
    except HubError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    hub.close()
    console.print(f"hub initialised in {home}; devices trust {home / 'trust/metadata/root.json'}")
    if not root_key:
        console.print(
            "[yellow]note:[/] the TUF root key is online in the hub home; move it offline "
            "with `edgeskill trust rotate-root` (SECURITY.md, key ceremony)"
        )
    if not insecure:
        console.print(
            f"devices enrol at grpcs://{hub.config.enroll_bind} and trust the CA "
            f"{home / 'pki' / 'ca.crt'}; make a token with `edgeskill hub claim create`"
        )


@hub_app.command("serve")
def hub_serve(
    home: HomeOpt = DEFAULT_HOME,
    grpc_bind: Annotated[
        str | None, typer.Option(help="Override the configured gRPC address.")
    ] = None,
    mqtt: Annotated[
        str | None,
        typer.Option(help="Override the configured broker: mqtt://HOST:1883/PREFIX ('' for none)."),
    ] = None,
    tls_cert: TlsCertOpt = None,
    tls_key: TlsKeyOpt = None,
    client_ca: ClientCaOpt = None,
    metrics_bind: MetricsBindOpt = None,
    insecure: InsecureOpt = False,
    verbose: bool = False,
) -> None:
    """Serve devices over gRPC (and MQTT when a broker is configured) until interrupted.

    gRPC speaks mutual TLS with the files `hub init` made, unless --insecure.
    """
    _setup_logging(verbose)
    with _hub(home) as hub:
        if insecure or hub.config.insecure:
            _warn_insecure()
        tls = _tls_files(tls_cert, tls_key, client_ca)
        _run_until_signal(
            lambda stop: hub.serve(
                stop, grpc_bind, mqtt, tls, metrics_bind, insecure=insecure or None
            )
        )


def _tls_files(cert: Path | None, key: Path | None, ca: Path | None) -> Any:
    """The three TLS options as one ``TlsFiles``, with paths taken from the working folder.

    Raises:
        ValidationError: only some of the three are given.
    """
    from cloud.hub import tls_files  # noqa: PLC0415

    return tls_files(*(p.resolve() if p is not None else None for p in (cert, key, ca)))


@hub_app.command("issue-cert")
def hub_issue_cert(
    device_id: Annotated[str, typer.Argument(help="The device the certificate names (its CN).")],
    out: Annotated[Path, typer.Option(help="Folder for DEVICE_ID.crt/.key and ca.crt.")] = Path(
        "certs"
    ),
    home: HomeOpt = DEFAULT_HOME,
) -> None:
    """Issue a device's mTLS client certificate from the hub's CA (made in HOME/pki once)."""
    from cloud.errors import HubError  # noqa: PLC0415
    from cloud.pki import issue_device_credentials  # noqa: PLC0415

    try:
        creds = issue_device_credentials(home, device_id, out)
    except HubError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    console.print(f"issued {creds.client.cert} and {creds.client.key} (CN={device_id})")
    console.print(
        f"hub: edgeskill hub serve --tls-cert {creds.server.cert} --tls-key {creds.server.key} "
        f"--client-ca {home / 'pki' / 'ca.crt'}"
    )
    console.print(
        f"device: edgeskill agent run --hub grpcs://HOST:PORT --ca {creds.ca} "
        f"--cert {creds.client.cert} --key {creds.client.key} ..."
    )


@claim_app.command("create")
def claim_create(
    label: Annotated[
        list[str] | None, typer.Option(help="A label k=v the enrolled device gets; repeat.")
    ] = None,
    uses: Annotated[int, typer.Option(help="How many devices may enrol with it.")] = 1,
    ttl: Annotated[str, typer.Option(help="How long it is valid: 90s, 30m, 12h, 1d.")] = "1d",
    reenroll: Annotated[
        bool, typer.Option(help="It may give an enrolled device a new key (a replaced board).")
    ] = False,
    home: HomeOpt = DEFAULT_HOME,
) -> None:
    """Make a claim token and print it; it is shown once (the hub keeps only its hash)."""
    labels = _labels(label)
    with _fleet(home) as fleet:
        token = fleet.identity.create_claim(labels, uses, _ttl_seconds(ttl), reenroll=reenroll)
    console.print(token, soft_wrap=True)


@hub_app.command("revoke")
def hub_revoke(
    device_id: Annotated[str, typer.Argument(help="The device whose certificate to revoke.")],
    home: HomeOpt = DEFAULT_HOME,
) -> None:
    """Revoke a device's certificate; the hub and the broker refuse it from now on."""
    with _fleet(home) as fleet:
        crl = fleet.identity.revoke(device_id)
    console.print(f"revoked {device_id}; CRL written to {crl}")


# -- agent -------------------------------------------------------------------


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
    verbose: bool = False,
) -> None:
    """Connect this device to a hub and keep its skills in the desired state.

    The first start enrols with --claim-token and --hub-ca; later starts reuse the
    identity kept in the state folder and renew its certificate when due.
    """
    from edge_agent.config import AgentConfig  # noqa: PLC0415
    from edge_agent.errors import AgentError, TransportError  # noqa: PLC0415
    from edge_agent.wiring import run_agent  # noqa: PLC0415
    from skills.errors import SkillError  # noqa: PLC0415

    _setup_logging(verbose)
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
    try:
        _run_until_signal(lambda stop: run_agent(config, stop))
    except (AgentError, SkillError, TransportError) as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc


def _read_token(path: Path) -> str:
    try:
        with path.open("r", encoding="utf-8") as fh:
            return fh.read(1024).strip()
    except OSError as exc:
        console.print(f"[red]error:[/] cannot read {path}: {exc}")
        raise typer.Exit(2) from exc


# -- skills ------------------------------------------------------------------


@skill_app.command("build")
def skill_build(
    src: Annotated[
        Path, typer.Argument(help="Skill source folder with skill.toml, control/, models/.")
    ],
    out: Annotated[Path, typer.Option(help="Output folder.")] = Path("dist"),
) -> None:
    """Build a deterministic .skill bundle from a source folder."""
    from skills.bundle import build_bundle  # noqa: PLC0415
    from skills.errors import SkillError  # noqa: PLC0415

    try:
        path = build_bundle(src, out)
    except SkillError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    console.print(f"built {path}")


@skill_app.command("push")
def skill_push(bundle: Path, home: HomeOpt = DEFAULT_HOME) -> None:
    """Sign a bundle into the hub's TUF repository, register the version, link its models."""
    with _fleet(home) as fleet:
        published = fleet.skills.publish(bundle)
    rec = published.version
    console.print(f"pushed {rec.name} {rec.version} ({rec.size} bytes, sha256 {rec.sha256[:12]})")
    if published.linked_artifacts:
        console.print(
            f"linked {published.linked_artifacts} registered model artefact(s) to this version"
        )


@skill_app.command("ls")
def skill_ls(home: HomeOpt = DEFAULT_HOME) -> None:
    """List published skill versions."""
    table = Table("skill", "version", "size", "sha256", "target")
    with _fleet(home) as fleet:
        for rec in fleet.skills.list():
            table.add_row(rec.name, rec.version, str(rec.size), rec.sha256[:12], rec.target_name)
    console.print(table)


# -- groups, devices, deployments -------------------------------------------


@groups_app.command("create")
def groups_create(name: str, selector: str, home: HomeOpt = DEFAULT_HOME) -> None:
    """Create a group NAME from a label SELECTOR such as kind=camera,site=plant-3."""
    with _fleet(home) as fleet:
        fleet.groups.create(name, selector)
    console.print(f"group {name} = {selector or '(all devices)'}")


@groups_app.command("ls")
def groups_ls(home: HomeOpt = DEFAULT_HOME) -> None:
    """List groups and how many devices each selects."""
    table = Table("group", "selector", "devices")
    with _fleet(home) as fleet:
        for g in fleet.groups.list():
            table.add_row(g.name, g.selector, str(g.devices))
    console.print(table)


@devices_app.command("ls")
def devices_ls(home: HomeOpt = DEFAULT_HOME) -> None:
    """List devices with their labels, state and skills."""
    table = Table("device", "labels", "online", "board", "desired gen", "skills")
    with _fleet(home) as fleet:
        for d in fleet.devices.list():
            skills = ", ".join(f"{s.name} {s.version} {s.state}" for s in d.reported)
            labels = ",".join(f"{k}={v}" for k, v in sorted(d.labels.items()))
            online = "yes" if d.online else "no"
            table.add_row(d.device_id, labels, online, d.board, str(d.desired_generation), skills)
    console.print(table)


@devices_app.command("label")
def devices_label(
    device_id: Annotated[str, typer.Argument(help="The device.")],
    labels: Annotated[list[str], typer.Argument(help="Its new labels, k=v ... (all of them).")],
    home: HomeOpt = DEFAULT_HOME,
) -> None:
    """Replace a device's labels; its desired state follows. Devices cannot change them."""
    wanted = _labels(labels)
    with _fleet(home) as fleet:
        view = fleet.devices.label(device_id, wanted)
    shown = ",".join(f"{k}={v}" for k, v in sorted(view.labels.items()))
    console.print(f"{device_id}: {shown or '(no labels)'}")


@deploy_app.command("create")
def deploy_create(
    skill: str,
    version: str,
    group: Annotated[str, typer.Option(help="Target group.")],
    config: Annotated[
        list[str] | None, typer.Option(help="Skill config k=v; repeat for more.")
    ] = None,
    strategy: Annotated[
        str, typer.Option(help="Rollout strategy; all-at-once is the only one so far.")
    ] = "all-at-once",
    home: HomeOpt = DEFAULT_HOME,
) -> None:
    """Deploy SKILL VERSION to every device of a group (all at once)."""
    cfg = dict(item.split("=", 1) for item in (config or []) if "=" in item)
    with _fleet(home) as fleet:
        dep = fleet.deployments.create(skill, version, group, strategy=strategy, config=cfg)
    console.print(f"deployment {dep.id}: {skill} {version} -> {group}")


@deploy_app.command("status")
def deploy_status(home: HomeOpt = DEFAULT_HOME) -> None:
    """List deployments and their state."""
    table = Table("id", "skill", "version", "group", "strategy", "state")
    with _fleet(home) as fleet:
        for d in fleet.deployments.list():
            table.add_row(str(d.id), d.skill, d.version, d.group, d.strategy, d.state)
    console.print(table)


@deploy_app.command("abort")
def deploy_abort(deployment_id: int, home: HomeOpt = DEFAULT_HOME) -> None:
    """Abort a deployment; its devices fall back to the previous deployment's version."""
    with _fleet(home) as fleet:
        dep = fleet.deployments.abort(deployment_id)
    console.print(f"deployment {dep.id} {dep.state}")


# -- models and the demo --------------------------------------------------------


@app.command("demo")
def demo(
    keep: Annotated[bool, typer.Option(help="Leave the hub and agents running.")] = False,
    transport: Annotated[str, typer.Option(help="grpc or mqtt")] = "grpc",
    workdir: Annotated[
        Path | None, typer.Option(help="Folder for demo state; default a fresh temp dir.")
    ] = None,
) -> None:
    """Hub + three agents end to end: train, sign, deploy to cameras, classify, report."""
    from edgeskill.demo import run_demo  # noqa: PLC0415

    raise typer.Exit(run_demo(console, keep=keep, transport=transport, workdir=workdir))


def main() -> None:
    """Entry point of the ``edgeskill`` command."""
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    app()


if __name__ == "__main__":
    main()
