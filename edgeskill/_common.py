"""What the ``edgeskill`` command groups share: the console, common options and helpers.

The hub is imported lazily here too, so importing this module on a device with
only the ``edge`` extra installed loads nothing of the hub.
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
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape

if TYPE_CHECKING:
    from cloud.service import FleetService

# Tables stay readable when output goes to a file or a CI log.
console = Console(width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 120)

HomeOpt = Annotated[
    Path,
    typer.Option(
        "--home", envvar="EDGESKILL_HOME", help="The hub's home folder (config, keys, store)."
    ),
]
DEFAULT_HOME = Path(".edgeskill/hub")
MetricsBindOpt = Annotated[
    str | None, typer.Option(help="Serve Prometheus metrics on HOST:PORT (default: off).")
]


def _warn_insecure() -> None:
    console.print(
        "[bold red]WARNING: INSECURE MODE.[/] No TLS and no device identities: anyone who "
        "reaches this port can act as any device. Use it only on a closed test network."
    )


def _labels(items: list[str] | None) -> dict[str, str]:
    labels = dict(item.split("=", 1) for item in (items or []) if "=" in item)
    if len(labels) != len(items or []):
        print_error("labels are k=v")
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


@contextlib.contextmanager
def _fleet(home: Path) -> Iterator[FleetService]:
    """Open the fleet service for one command; hub errors become a message and exit status 2."""
    from cloud.errors import HubError  # noqa: PLC0415
    from cloud.service import FleetService  # noqa: PLC0415

    try:
        fleet = FleetService.open(home)
    except HubError as exc:
        print_error(f"{exc}. Run `edgeskill hub init --home {home}` first.")
        raise typer.Exit(2) from exc
    try:
        yield fleet
    except HubError as exc:
        print_error(str(exc))
        raise typer.Exit(2) from exc
    finally:
        fleet.close()


def print_error(message: str) -> None:
    """Print ``error: MESSAGE`` in red; the message is text, never rich markup.

    Error texts quote what people typed (URLs, selectors, paths); a ``[`` in
    them must not be taken for markup.
    """
    console.print(f"[red]error:[/] {escape(message)}")
