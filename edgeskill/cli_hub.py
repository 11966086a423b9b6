"""``edgeskill hub``: create, serve and secure a hub home, and hand out device identities.

Every command imports the hub only when it runs, so ``edgeskill agent run``
keeps working on a device where only the ``edge`` extra is installed.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from edge_agent.cli import run_until_signal, setup_logging
from edgeskill._common import (
    DEFAULT_HOME,
    HomeOpt,
    MetricsBindOpt,
    _audit_log,
    _fleet,
    _labels,
    _warn_insecure,
    audited,
    console,
    print_error,
)
from edgeskill.cli_project import ProjectOpt
from edgeskill.processes import settle_collector

app = typer.Typer(help="Run and set up the cloud hub.", no_args_is_help=True)
claim_app = typer.Typer(
    help="Claim tokens: how new devices enrol and get a certificate.", no_args_is_help=True
)
app.add_typer(claim_app, name="claim")

TlsCertOpt = Annotated[
    Path | None, typer.Option(help="The hub's TLS certificate (PEM); turns on mTLS for gRPC.")
]
TlsKeyOpt = Annotated[Path | None, typer.Option(help="The hub certificate's private key (PEM).")]
ClientCaOpt = Annotated[
    Path | None, typer.Option(help="CA (PEM) that signs device client certificates.")
]
InsecureOpt = Annotated[
    bool,
    typer.Option(
        "--insecure",
        help="DANGEROUS: plain gRPC with no device identities. Closed test networks only.",
    ),
]
_TTL_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
#: A serving hub's young collections: every this many container allocations (Python's: 700).
#: In a 2,000-device upgrade the hub made about 200 collections (7% of its CPU) by default;
#: with this, none.
HUB_YOUNG_GC_THRESHOLD = 50_000


def _ttl_seconds(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``12h`` or ``1d`` in seconds."""
    unit = text[-1:] if text[-1:] in _TTL_UNITS else "s"
    number = text[:-1] if text[-1:] in _TTL_UNITS else text
    try:
        return float(number) * _TTL_UNITS[unit]
    except ValueError as exc:
        raise typer.BadParameter(f"{text!r} is not a duration such as 1d, 12h, 30m") from exc


def _open_hub(home: Path) -> Any:
    """Open the hub home (for ``hub serve``); a missing hub ends with a hint and exit status 2."""
    from cloud.errors import HubError  # noqa: PLC0415
    from cloud.hub import Hub  # noqa: PLC0415

    try:
        return Hub.open(home)
    except HubError as exc:
        print_error(f"{exc}. Run `edgeskill hub init --home {home}` first.")
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
        print_error(str(exc))
        raise typer.Exit(2) from exc
    finally:
        hub.close()


@app.command("init")
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

    Examples:
      edgeskill hub init --home hub
      edgeskill hub init --home hub --grpc-bind 0.0.0.0:7443 --server-name hub.example.org
      edgeskill hub init --home hub --store-url postgresql://hub@db/edgeskill
    """
    from cloud.errors import HubError  # noqa: PLC0415
    from cloud.hub import Hub  # noqa: PLC0415

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
        _record_init(hub, mqtt=bool(mqtt), root_keys=len(root_key or ()), threshold=root_threshold)
    except HubError as exc:
        print_error(str(exc))
        raise typer.Exit(2) from exc
    if insecure:
        _warn_insecure()
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


def _record_init(hub: Any, *, mqtt: bool, root_keys: int, threshold: int) -> None:
    """Record the hub's creation as its audit log's first entry, then close the hub.

    Raises:
        HubError: The entry cannot be written.
    """
    from cloud.service import FleetService  # noqa: PLC0415

    settings = {
        "store": hub.store.dialect,
        "grpc_bind": hub.config.grpc_bind,
        "mqtt": mqtt,  # not the URL: it may hold credentials
        "insecure": hub.config.insecure,
        "offline_root_keys": root_keys,
        "root_threshold": threshold,
    }
    try:
        audited(FleetService(hub), "hub.init", "hub", after=settings)
    finally:
        hub.close()


@app.command("serve")
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
    heartbeat: Annotated[
        str,
        typer.Option(
            metavar="SECONDS",
            help="How often devices send a heartbeat (1 to 300); one silent for two is offline.",
        ),
    ] = "5",
    drift_interval: Annotated[
        float,
        typer.Option(
            min=0.1, max=3600.0, help="Seconds between passes of the drift loop (demos: ~1)."
        ),
    ] = 30.0,
    console_bind: Annotated[
        str | None,
        typer.Option(
            metavar="HOST:PORT",
            help="Also serve the console (REST API and pages) here, over HTTP on loopback.",
        ),
    ] = None,
    verbose: Annotated[
        bool, typer.Option(help="Log debug lines, and the libraries' INFO lines too.")
    ] = False,
) -> None:
    """Serve devices over gRPC (and MQTT when a broker is configured) until interrupted.

    gRPC speaks mutual TLS with the files `hub init` made, unless --insecure.

    Examples:
      edgeskill hub serve --home hub
      edgeskill hub serve --home hub --metrics-bind 127.0.0.1:9464
      edgeskill hub serve --home hub --console-bind 127.0.0.1:8080
      edgeskill hub serve --home hub --mqtt "mqtts://127.0.0.1:8883/edgeskill/v1?ca=..."
    """
    from cloud.errors import HubError, TransportError  # noqa: PLC0415
    from cloud.hub_config import CONFIG_FILE, plan_serve  # noqa: PLC0415
    from cloud.presence import heartbeat_seconds  # noqa: PLC0415

    setup_logging(verbose)
    try:  # before the home is opened, so a refused serve changes nothing
        heartbeat_s = heartbeat_seconds(heartbeat)
        tls = _tls_files(tls_cert, tls_key, client_ca)
        plan_serve(home, None, grpc_bind, mqtt, tls, metrics_bind, insecure or None)
    except (HubError, TransportError) as exc:
        missing = not (home / CONFIG_FILE).exists()
        hint = f". Run `edgeskill hub init --home {home}` first." if missing else ""
        print_error(f"{exc}{hint}")
        raise typer.Exit(2) from exc
    with _hub(home) as hub:
        if insecure or hub.config.insecure:
            _warn_insecure()
        settle_collector(HUB_YOUNG_GC_THRESHOLD)  # what is loaded so far lives as long as the hub
        run_until_signal(
            lambda stop: hub.serve(
                stop,
                grpc_bind,
                mqtt,
                tls,
                metrics_bind,
                insecure=insecure or None,
                heartbeat_s=heartbeat_s,
                drift_tick_s=drift_interval,
                console_bind=console_bind,
            )
        )


def _tls_files(cert: Path | None, key: Path | None, ca: Path | None) -> Any:
    """The three TLS options as one ``TlsFiles``, with paths taken from the working folder.

    Raises:
        ValidationError: only some of the three are given.
    """
    from cloud.hub_config import tls_files  # noqa: PLC0415

    return tls_files(*(p.resolve() if p is not None else None for p in (cert, key, ca)))


@app.command("issue-cert")
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

    with _audit_log(home) as fleet:
        try:
            creds = issue_device_credentials(home, device_id, out)
        except HubError as exc:
            print_error(str(exc))
            raise typer.Exit(2) from exc
        if fleet is not None:
            after = {"device_id": device_id, "cert": str(creds.client.cert)}
            audited(fleet, "identity.issue_cert", f"device/{device_id}", after=after)
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
    project: ProjectOpt = "default",
    home: HomeOpt = DEFAULT_HOME,
) -> None:
    """Make a claim token and print it; it is shown once (the hub keeps only its hash).

    Devices enrolled with it join --project (a device the hub knew keeps its own).
    """
    labels = _labels(label)
    with _fleet(home) as fleet:
        ttl_s = _ttl_seconds(ttl)
        token = fleet.identity.create_claim(labels, uses, ttl_s, reenroll=reenroll, project=project)
        claim = {"labels": labels, "uses": uses, "ttl_s": ttl_s, "reenroll": reenroll}
        # Named by a prefix of its hash (as the hub keeps it), never by the token itself.
        name = hashlib.sha256(token.encode()).hexdigest()[:12]
        audited(fleet, "identity.claim", f"claim/{name}", after=claim, project=project)
    console.print(token, soft_wrap=True)


@app.command("revoke")
def hub_revoke(
    device_id: Annotated[str, typer.Argument(help="The device whose certificate to revoke.")],
    home: HomeOpt = DEFAULT_HOME,
) -> None:
    """Revoke a device's certificate; the hub and the broker refuse it from now on."""
    with _fleet(home) as fleet:
        crl = fleet.identity.revoke(device_id)
        audited(
            fleet,
            "identity.revoke",
            f"device/{device_id}",
            before={"revoked": False},
            after={"revoked": True, "crl": str(crl)},
            project=_device_project(fleet, device_id),
        )
    console.print(f"revoked {device_id}; CRL written to {crl}")


def _device_project(fleet: Any, device_id: str) -> str | None:
    """The project of a device the store knows (None for one it does not)."""
    from cloud.errors import NotFoundError  # noqa: PLC0415

    try:
        return str(fleet.devices.get(device_id).project)
    except NotFoundError:
        return None


def _event_line(event: Any) -> str:
    from datetime import UTC, datetime  # noqa: PLC0415

    stamp = datetime.fromtimestamp(event.at_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")
    device = event.device_id or "-"
    return f"{event.id:>8} {stamp} {event.kind:<10} {device:<20} {event.message}"


@app.command("events")
def hub_events(
    device: Annotated[
        str | None, typer.Option(metavar="ID", help="Only this device's events.")
    ] = None,
    kind: Annotated[
        str | None,
        typer.Option(
            metavar="KIND", help="Only events of this kind: deployment, device, security or skill."
        ),
    ] = None,
    limit: Annotated[
        int, typer.Option(metavar="N", help="How many of the latest events to show (1..10000).")
    ] = 50,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new events until Ctrl-C.")
    ] = False,
    poll: Annotated[
        float, typer.Option(metavar="SECONDS", help="With --follow, how often to look.")
    ] = 1.0,
    home: HomeOpt = DEFAULT_HOME,
) -> None:
    """Show the hub's recent events (deployments, skill state changes, devices, refusals).

    Example: edgeskill hub events --device cam-1 --kind skill --follow
    """
    import time  # noqa: PLC0415

    from rich.markup import escape  # noqa: PLC0415

    if not 0.05 <= poll <= 60:
        print_error(f"--poll {poll} is not in 0.05..60 seconds")
        raise typer.Exit(2)
    with _fleet(home) as fleet:
        shown = fleet.events.recent(device_id=device, kind=kind, limit=limit)
        for event in shown:
            console.print(escape(_event_line(event)), soft_wrap=True)
        if not shown and not follow:
            console.print(
                "[dim]no events yet[/]"
                if device is None and kind is None
                else "[dim]no such events[/]"
            )
        last = shown[-1].id if shown else _newest_id(fleet)
        with contextlib.suppress(KeyboardInterrupt):
            while follow:
                time.sleep(poll)
                for event in fleet.events.after(last, device_id=device, kind=kind):
                    console.print(escape(_event_line(event)), soft_wrap=True)
                    last = event.id


def _newest_id(fleet: Any) -> int:
    """The id of the newest event of any kind (0 when there is none), to follow from."""
    newest = fleet.events.recent(limit=1)
    return newest[-1].id if newest else 0
