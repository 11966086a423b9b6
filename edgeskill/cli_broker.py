"""``edgeskill broker``: a Mosquitto config with TLS, client certificates and a per-device ACL.

The config trusts only the hub's CA, names every client by its certificate,
honours the hub's revocation list and confines each device to its own topics
(see :mod:`cloud.broker`). The commands only write files and signal the broker
this config started; running Mosquitto stays the operator's job.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from edgeskill._common import print_error

console = Console(width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 120)
app = typer.Typer(
    help="The MQTT broker: a generated Mosquitto config (TLS, client certificates, ACL).",
    no_args_is_help=True,
)

HomeOpt = Annotated[
    Path,
    typer.Option(
        "--home", envvar="EDGESKILL_HOME", help="The hub's home folder (its CA is in pki/)."
    ),
]
OutOpt = Annotated[Path, typer.Option("--out", help="The folder the broker's files go to.")]
DEFAULT_HOME = Path(".edgeskill/hub")
_ANY_ADDRESS = ("0.0.0.0", "::")  # noqa: S104 - compared with, never bound


@app.command("config")
def config(
    out: OutOpt,
    home: HomeOpt = DEFAULT_HOME,
    port: Annotated[int, typer.Option(help="The TLS listener's port.")] = 8883,
    prefix: Annotated[str, typer.Option(help="The topic prefix of the hub's URL.")] = (
        "edgeskill/v1"
    ),
    bind: Annotated[str, typer.Option(help="The address the listener binds.")] = "127.0.0.1",
    name: Annotated[
        list[str] | None,
        typer.Option("--name", help="Another DNS name or address devices reach the broker by."),
    ] = None,
    user: Annotated[
        str | None,
        typer.Option(help="The user Mosquitto runs as when started as root (default: you)."),
    ] = None,
) -> None:
    """Write mosquitto.conf, its ACL and the broker's certificate into --out."""
    from cloud.broker import hub_mqtt_url, write_broker_config  # noqa: PLC0415
    from cloud.errors import HubError  # noqa: PLC0415

    try:
        conf = write_broker_config(
            home, out, port=port, prefix=prefix, bind=bind, server_names=name or (), run_as=user
        )
        url = hub_mqtt_url(home, "127.0.0.1" if bind in _ANY_ADDRESS else bind, port, prefix)
    except HubError as exc:
        print_error(str(exc))
        raise typer.Exit(2) from exc
    console.print(f"wrote {conf} (+ acl, broker.crt, broker.key)")
    console.print(f"run the broker:   mosquitto -c {conf}")
    console.print(f"serve the hub:    edgeskill hub serve --home {home} --mqtt '{url}'")
    console.print(
        "devices connect with mqtts://HOST:PORT/PREFIX and their enrolled certificate; "
        f"after revoking one, run: edgeskill broker reload --out {out}"
    )


@app.command("reload")
def reload(out: OutOpt) -> None:
    """Make the running broker reread its revocation list, ACL and certificates (SIGHUP)."""
    from cloud.broker import reload_broker  # noqa: PLC0415
    from cloud.errors import HubError  # noqa: PLC0415

    try:
        pid = reload_broker(out)
    except HubError as exc:
        print_error(str(exc))
        raise typer.Exit(2) from exc
    console.print(f"signalled the broker (pid {pid}) to reload")
