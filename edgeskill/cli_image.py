"""``edgeskill image build``: firmware images and agent bundles per device target."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from edgeskill.firmware_build import ImageBuildError, Settings, build_image
from edgeskill.firmware_recipes import TARGETS

image_app = typer.Typer(
    help="Device images: root file systems and agent bundles.", no_args_is_help=True
)
_console = Console()


@image_app.command("build")
def image_build(
    target: Annotated[str, typer.Option(help=f"One of: {', '.join(TARGETS)}.")],
    out: Annotated[Path, typer.Option(help="Folder for the artefacts.")],
    hub_url: Annotated[str, typer.Option(help="The hub the agent connects to.")] = (
        "grpcs://hub.example.net:7443"
    ),
    enroll_url: Annotated[str, typer.Option(help="grpcs://HOST:PORT of the enrolment port.")] = "",
    labels: Annotated[str, typer.Option(help="Labels, space separated (kind=camera).")] = (
        "kind=camera"
    ),
    hub_ca: Annotated[Path | None, typer.Option(help="The hub's CA (PEM).")] = None,
    trusted_root: Annotated[Path | None, typer.Option(help="The hub's TUF root.json.")] = None,
    claim_token_file: Annotated[
        Path | None, typer.Option(help="A claim token baked in for first-boot enrolment.")
    ] = None,
    rootfs: Annotated[bool, typer.Option(help="Also build the root file system / overlay.")] = True,
    wheels: Annotated[bool, typer.Option(help="Download the wheelhouse (needs the index).")] = True,
) -> None:
    """Build TARGET's agent bundle and its root file system (or vendor overlay) into OUT."""
    settings = Settings(hub_url, enroll_url, labels, hub_ca, trusted_root, claim_token_file)
    try:
        result = build_image(
            target, out, settings, rootfs=rootfs, wheels=wheels, say=_console.print
        )
    except ImageBuildError as exc:
        _console.print(f"[red]image build failed:[/red] {exc}")
        raise typer.Exit(1) from None
    for note in result.notes:
        _console.print(f"[yellow]note:[/yellow] {note}")
    _console.print(f"bundle: {result.bundle_tar}")
    if result.rootfs_tar is not None:
        _console.print(f"image: {result.rootfs_tar}")
