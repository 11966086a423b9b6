"""``edgeskill console``: serve the web console on its own, and manage its API tokens.

The hub process serves the console itself; ``console serve`` runs it alone over a
hub home (the store is shared, so it can run beside ``hub serve``). Tokens are
made by the local command line, an admin of every project.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from edge_agent.cli import run_until_signal, setup_logging
from edgeskill._common import (
    DEFAULT_HOME,
    HomeOpt,
    _fleet,
    _warn_insecure,
    audited,
    console,
    print_error,
)

__all__ = ["console_app"]

console_app = typer.Typer(help="The hub's web console and its API tokens.", no_args_is_help=True)
token_app = typer.Typer(help="API tokens of the console's REST API.", no_args_is_help=True)
console_app.add_typer(token_app, name="token")


@console_app.command("serve")
def console_serve(
    home: HomeOpt = DEFAULT_HOME,
    bind: Annotated[str, typer.Option(help="HOST:PORT to serve on.")] = "127.0.0.1:8080",
    tls_cert: Annotated[Path | None, typer.Option(help="TLS certificate (PEM).")] = None,
    tls_key: Annotated[Path | None, typer.Option(help="TLS key (PEM).")] = None,
    insecure: Annotated[
        bool, typer.Option("--insecure", help="DANGEROUS: plain HTTP on a non-loopback address.")
    ] = False,
    verbose: Annotated[bool, typer.Option(help="Log debug lines.")] = False,
) -> None:
    """Serve the console (REST API and pages) until interrupted.

    Examples:
      edgeskill console serve --home hub --bind 127.0.0.1:8080
      edgeskill console serve --home hub --bind 0.0.0.0:8443 --tls-cert c.pem --tls-key k.pem
    """
    from cloud.console.server import start_console  # noqa: PLC0415
    from cloud.errors import ValidationError  # noqa: PLC0415

    setup_logging(verbose)
    if insecure:
        _warn_insecure()
    with _fleet(home) as fleet:

        async def main(stop: asyncio.Event) -> None:
            server = await start_console(
                fleet, bind, tls_cert=tls_cert, tls_key=tls_key, insecure=insecure
            )
            console.print(f"console serving on {server.scheme}://{escape(bind)} (Ctrl-C stops)")
            try:
                await stop.wait()
            finally:
                await server.stop()

        try:
            run_until_signal(main)
        except (ValidationError, OSError) as exc:
            print_error(str(exc))
            raise typer.Exit(2) from exc


def _when(ms: int | None) -> str:
    if ms is None:
        return "never"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M")


@token_app.command("create")
def token_create(
    role: Annotated[str, typer.Option(help="viewer, operator or admin.")],
    home: HomeOpt = DEFAULT_HOME,
    project: Annotated[
        str | None, typer.Option(help="The project it is bound to (none: a hub admin's token).")
    ] = None,
    group: Annotated[
        str | None, typer.Option(help="Limit it to the devices of this group.")
    ] = None,
    name: Annotated[str, typer.Option(help="What the token is for.")] = "console",
    ttl: Annotated[
        float | None, typer.Option(help="Lifetime in seconds (default: until revoked).")
    ] = None,
) -> None:
    """Create an API token; its secret is printed once and never stored.

    Examples:
      edgeskill console token create --role viewer --project plant-3 --name dashboard
      edgeskill console token create --role operator --project plant-3 --group cameras
    """
    with _fleet(home) as fleet:
        view, secret = fleet.tokens.create(name, role, project, group, ttl)
        audited(fleet, "tokens.create", f"token/{view.token_id}", after=view)
    console.print(
        f"token {view.token_id} ({escape(view.role)}, project "
        f"{escape(view.project or 'every project')}"
        + (f", group {escape(view.group)}" if view.group else "")
        + "); the secret is shown once:"
    )
    console.print(secret, soft_wrap=True, highlight=False)


@token_app.command("list")
def token_list(
    home: HomeOpt = DEFAULT_HOME,
    project: Annotated[str | None, typer.Option(help="Only this project's tokens.")] = None,
) -> None:
    """List API tokens (never their secrets).

    Examples:
      edgeskill console token list --home hub --project plant-3
    """
    with _fleet(home) as fleet:
        tokens = fleet.tokens.list(project)
    table = Table("id", "name", "role", "project", "group", "created", "expires", "state")
    for t in tokens:
        table.add_row(
            t.token_id,
            escape(t.name),
            t.role,
            escape(t.project or "*"),
            escape(t.group or ""),
            _when(t.created_ms),
            _when(t.expires_ms),
            "revoked" if t.revoked else "active",
        )
    console.print(table)


@token_app.command("revoke")
def token_revoke(
    token_id: Annotated[str, typer.Argument(help="The token's id (`token list` shows it).")],
    home: HomeOpt = DEFAULT_HOME,
) -> None:
    """Revoke an API token; it stops working at once.

    Examples:
      edgeskill console token revoke 3f2a9c01d4e5 --home hub
    """
    with _fleet(home) as fleet:
        before = next((t for t in fleet.tokens.list(None) if t.token_id == token_id), None)
        view = fleet.tokens.revoke(token_id, None)
        audited(fleet, "tokens.revoke", f"token/{token_id}", before=before, after=view)
    console.print(f"revoked token {view.token_id} ({escape(view.name)})")
