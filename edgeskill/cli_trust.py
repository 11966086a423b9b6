"""``edgeskill trust``: the key ceremony of a hub's TUF repository (see SECURITY.md).

Root keys live offline; these commands take them as files for the length of
one command, check the signatures before anything is written, and print
what changed. Only the ``skills`` package is needed; where the home holds a
hub, each change is also recorded in its audit log (so its store must open).
"""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from edgeskill._common import _audit_log, audited, print_error

if TYPE_CHECKING:
    from securesystemslib.signer import CryptoSigner

    from skills.trust import TrustRepository

console = Console(width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 120)
app = typer.Typer(
    help="Key ceremony: offline root keys, renewal and rotation of the TUF keys.",
    no_args_is_help=True,
)

HomeOpt = Annotated[
    Path,
    typer.Option(
        "--home", envvar="EDGESKILL_HOME", help="The hub's home folder (config, keys, store)."
    ),
]
DEFAULT_HOME = Path(".edgeskill/hub")
RootKeyOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--root-key",
        help="A current root key (PEM); repeat up to the threshold. "
        "Default: the hub's online root key, if it still has one.",
    ),
]
WARN_DAYS = 60


def _fail(message: str) -> typer.Exit:
    print_error(message)
    return typer.Exit(2)


def _repo(home: Path) -> TrustRepository:
    from skills.errors import TrustError  # noqa: PLC0415
    from skills.trust import TrustRepository  # noqa: PLC0415

    try:
        return TrustRepository.open(home / "trust")
    except TrustError as exc:
        raise _fail(f"{exc}. Run `edgeskill hub init --home {home}` first.") from exc


def _root_signers(repo: TrustRepository, keys: list[Path] | None) -> list[CryptoSigner]:
    from skills.trust.ceremony import load_signers  # noqa: PLC0415

    if keys:
        return load_signers(keys)
    online = repo.online_root_signer()
    if online is None:
        raise _fail("the root is offline: give its keys with --root-key (up to the threshold)")
    return [online]


@app.command("generate-root-keys")
def generate_root_keys(
    out: Annotated[Path, typer.Option(help="Folder for root-1.pem … (made 0700).")],
    count: Annotated[int, typer.Option(help="How many root keys.")] = 3,
) -> None:
    """Make new root keys; move each to its own offline medium afterwards."""
    from skills.errors import TrustError  # noqa: PLC0415
    from skills.trust.ceremony import generate_root_keys as generate  # noqa: PLC0415

    try:
        paths = generate(out, count)
    except (TrustError, OSError) as exc:
        raise _fail(str(exc)) from exc
    for path in paths:
        console.print(f"wrote {path} (mode 0600)")


@app.command("status")
def status(home: HomeOpt = DEFAULT_HOME) -> None:
    """Show each role's version, keys, threshold and expiry; warn when the root is online."""
    from skills.errors import TrustError  # noqa: PLC0415

    repo = _repo(home)
    table = Table("role", "version", "keys", "threshold", "expires", "days left")
    try:
        root = repo.metadata("root").signed
        for role in ("root", "targets", "snapshot", "timestamp"):
            signed = root if role == "root" else repo.metadata(role).signed
            left = (signed.expires - datetime.now(UTC)).days
            days = f"[red]{left}[/]" if left < WARN_DAYS and role == "root" else str(left)
            table.add_row(
                role,
                str(signed.version),
                str(len(root.roles[role].keyids)),
                str(root.roles[role].threshold),
                signed.expires.strftime("%Y-%m-%d"),
                days,
            )
        online_root = repo.online_root_signer() is not None
    except TrustError as exc:
        raise _fail(str(exc)) from exc
    console.print(table)
    if online_root:
        console.print(
            "[yellow]warning:[/] the root key is online (in the hub home); move the root "
            "offline with `edgeskill trust rotate-root` (see SECURITY.md)"
        )


@app.command("renew-root")
def renew_root(home: HomeOpt = DEFAULT_HOME, root_key: RootKeyOpt = None) -> None:
    """Publish the same root with a fresh expiry (yearly, before it runs out)."""
    from skills.errors import TrustError  # noqa: PLC0415
    from skills.trust.ceremony import renew_root as renew  # noqa: PLC0415

    repo = _repo(home)
    with _audit_log(home) as fleet:
        try:
            version = renew(repo, _root_signers(repo, root_key))
        except TrustError as exc:
            raise _fail(str(exc)) from exc
        if fleet is not None:
            after = {"version": version, "expires": f"{repo.expires('root'):%Y-%m-%d}"}
            audited(fleet, "trust.renew_root", "trust/root", after=after)
    console.print(f"published root v{version}, expires {repo.expires('root'):%Y-%m-%d}")


@app.command("rotate-root")
def rotate_root(
    new_root_key: Annotated[
        list[Path], typer.Option("--new-root-key", help="A new root key (PEM); repeat.")
    ],
    threshold: Annotated[int, typer.Option(help="New keys needed to sign a root.")],
    home: HomeOpt = DEFAULT_HOME,
    root_key: RootKeyOpt = None,
) -> None:
    """Replace the root keys; devices accept the new root because the old keys sign it too."""
    from skills.errors import TrustError  # noqa: PLC0415
    from skills.trust.ceremony import load_signers, rotate_root_keys  # noqa: PLC0415

    repo = _repo(home)
    with _audit_log(home) as fleet:
        try:
            new = load_signers(new_root_key)
            version = rotate_root_keys(repo, _root_signers(repo, root_key), new, threshold)
        except TrustError as exc:
            raise _fail(str(exc)) from exc
        if fleet is not None:
            after = {"version": version, "keys": len(new), "threshold": threshold}
            audited(fleet, "trust.rotate_root", "trust/root", after=after)
    console.print(f"published root v{version}: {len(new)} root keys, threshold {threshold}")


@app.command("rotate-key")
def rotate_key(
    role: Annotated[str, typer.Argument(help="targets, snapshot or timestamp")],
    home: HomeOpt = DEFAULT_HOME,
    root_key: RootKeyOpt = None,
) -> None:
    """Give an online role a new key and retire the old one (after a suspected leak)."""
    from skills.errors import TrustError  # noqa: PLC0415
    from skills.trust.ceremony import rotate_online_key  # noqa: PLC0415

    repo = _repo(home)
    with _audit_log(home) as fleet:
        try:
            version = rotate_online_key(repo, role, _root_signers(repo, root_key))
        except TrustError as exc:
            raise _fail(str(exc)) from exc
        if fleet is not None:
            after = {"root_version": version}
            audited(fleet, "trust.rotate_key", f"trust/{role}", after=after)
    console.print(f"published root v{version} with a new {role} key; {role} signed again")


@app.command("repair")
def repair(home: HomeOpt = DEFAULT_HOME) -> None:
    """Complete a publication a killed process left half done; remove its leftovers."""
    from skills.errors import TrustError  # noqa: PLC0415

    repo = _repo(home)
    with _audit_log(home) as fleet:
        try:
            done = repo.repair()
        except TrustError as exc:
            raise _fail(str(exc)) from exc
        if fleet is not None and done:
            audited(fleet, "trust.repair", "trust", after={"done": list(done)})
    for line in done or ["the repository is consistent; nothing to do"]:
        console.print(line)
