"""What the ``edgeskill`` command groups share: the console, common options and helpers.

The hub is imported lazily here too, so importing this module on a device with
only the ``edge`` extra installed loads nothing of the hub.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperArgument

from edge_agent.cli import INSECURE_BANNER

if TYPE_CHECKING:
    from cloud.models import ModelFactory
    from cloud.service import FleetService

# Tables stay readable when output goes to a file or a CI log.
console = Console(width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 120)
# Errors go to stderr, one line however long: scripts read them, terminals wrap them.
error_console = Console(stderr=True, soft_wrap=True)

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
    head, _, rest = INSECURE_BANNER.partition(". ")  # the agent's entry prints the same words
    console.print(f"[bold red]{head}.[/] {rest}")


def _labels(items: list[str] | None) -> dict[str, str]:
    labels = dict(item.split("=", 1) for item in (items or []) if "=" in item)
    if len(labels) != len(items or []):
        print_error("labels are k=v")
        raise typer.Exit(2)
    return labels


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


def audited(
    fleet: FleetService,
    action: str,
    target: str,
    *,
    before: object = None,
    after: object = None,
    project: str | None = None,
) -> None:
    """Write the audit entry of a change this command made, as the local CLI (``cli:<user>``).

    Call it once the change succeeded, with the action names the REST API uses.
    ``before`` and ``after`` are the record's fields: a service view (a dataclass)
    or a mapping, never a secret. The entry's project is ``project``, else the
    ``project`` of the record after (or before) the change, else ``default``.

    Raises:
        ValidationError: A field over the audit log's caps.
        StoreError: The store failed.
    """
    from cloud.service.access import Principal  # noqa: PLC0415

    old, new = _audit_fields(before), _audit_fields(after)
    found = new.get("project") or old.get("project")
    where = project or (found if isinstance(found, str) and found else None)
    fleet.audit.record(Principal.local(), action, target, old, new, where)


def _audit_fields(value: object) -> dict[str, Any]:
    if value is None:
        return {}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return dict(cast("Mapping[str, Any]", value))


@contextlib.contextmanager
def _audit_log(home: Path) -> Iterator[FleetService | None]:
    """The fleet whose audit log records a change to ``home`` made without the store.

    None where ``home`` holds no hub (a bare trust repository has no log). Open it
    before the change: a hub whose store cannot be opened refuses the command.
    """
    from cloud.hub_config import CONFIG_FILE  # noqa: PLC0415

    if not (home / CONFIG_FILE).is_file():
        yield None
        return
    with _fleet(home) as fleet:
        yield fleet


def write_holdout_stream(factory: ModelFactory, model: int | str, out: Path) -> int:
    """Write a model's held-out test images and labels as a stream an agent can replay.

    The images are the test split the model's accuracy was measured on (its data
    set version, image size and split seed), saved as ``.npz`` with ``x`` (float32)
    and ``y`` (int64): the format of ``agent run --source``.

    Returns:
        How many images the stream holds.

    Raises:
        NotFoundError: There is no such model.
        FactoryError: The model was imported without a data set, or its data no longer loads.
        OSError: ``out`` cannot be written.
    """
    import numpy as np  # noqa: PLC0415

    from cloud.models.datasets import load_split  # noqa: PLC0415 - torch
    from cloud.models.errors import FactoryError  # noqa: PLC0415

    record = factory.tables.get_model(model)
    if record.dataset_id is None:
        raise FactoryError(f"model {record.name} was imported without a data set to hold out")
    dataset = factory.tables.get_dataset(record.dataset_id)
    test = load_split(
        factory.home, dataset, image_size=record.image_size, seed=record.split_seed
    ).test
    with out.open("wb") as fh:
        np.savez(fh, x=test.x.astype(np.float32), y=test.y.astype(np.int64))
    return len(test.x)


def print_error(message: str) -> None:
    """Print ``error: MESSAGE`` in red; the message is text, never rich markup.

    Error texts quote what people typed (URLs, selectors, paths); a ``[`` in
    them must not be taken for markup.
    """
    error_console.print(f"[red]error:[/] {escape(message)}")


# -- help ----------------------------------------------------------------------

_DIR_NAMES = ("dir", "home", "workdir", "src", "dest")
_FILE_NAMES = ("file", "key", "cert", "ca", "root", "source", "bundle")
_SECONDS_NAMES = ("_s", "timeout", "interval", "window", "ttl")
_NAME_NAMES = ("name", "group", "skill", "arch", "target", "variant", "board", "transport")


class _ArgumentHelp(TyperArgument):
    """A positional argument whose help names its kind (PATH, ID) where typer prints ``<path>``."""

    kind: str | None = None

    def display_type_rich(self, ctx: Any) -> str | None:
        """The kind column of the help page: a plain word, or nothing."""
        return self.kind


def _kind(param: Any) -> str:
    """A metavar for a non-flag parameter, from its type and name: FILE, N, SECONDS, URL, ..."""
    name, desc = param.name or "", param.type_descriptor
    element = param.bare_type().removeprefix("list[").removesuffix("]")
    if desc.is_choice:
        return "|".join(str(getattr(c, "value", c)) for c in desc.choices or ())
    if desc.is_path or element == "Path":
        return _path_kind(name, str(desc.path_type))
    if element in ("int", "float"):
        return _number_kind(name, element)
    return _text_kind(name)


def _path_kind(name: str, path_type: str) -> str:
    if path_type != "path":
        return path_type.upper()
    if name.endswith(_DIR_NAMES):
        return "DIR"
    return "FILE" if name.endswith(_FILE_NAMES) else "PATH"


def _number_kind(name: str, element: str) -> str:
    if element == "float":
        return "SECONDS" if any(part in name for part in _SECONDS_NAMES) else "NUMBER"
    if name.endswith("port"):
        return "PORT"
    return "ID" if name.endswith("id") or name == "resume" else "N"


#: Text options named exactly so, then names containing a word, then name endings.
_TEXT_NAMES = {"hub": "URL", "mqtt": "URL", "bind": "HOST", "config": "K=V", "labels": "K=V"}
_TEXT_WORDS = {"url": "URL", "bind": "HOST:PORT", "token": "TOKEN", "ttl": "DURATION"}
_TEXT_ENDINGS = {"label": "K=V", "selector": "SELECTOR", "id": "ID", "version": "VERSION"}


def _text_kind(name: str) -> str:
    if name in _TEXT_NAMES:
        return _TEXT_NAMES[name]
    found = [metavar for word, metavar in _TEXT_WORDS.items() if word in name]
    found += [metavar for end, metavar in _TEXT_ENDINGS.items() if name.endswith(end)]
    if found:
        return found[0]
    return "NAME" if name.endswith(_NAME_NAMES) else "TEXT"


def set_metavars(command: Any) -> Any:
    """Give every parameter of a click command tree a plain metavar; returns ``command``.

    Typer's help prints a parameter's Python type (``<bool>``, ``<list[str]>``,
    ``<path>``) wherever no metavar is set. Here flags get none, options a word
    from their type and name (FILE, DIR, N, SECONDS, URL, K=V, ID, TEXT) and
    arguments their own name, with the word beside it. Metavars set by hand stay.
    """
    for param in command.params:
        if isinstance(param, TyperArgument):
            kind = None if param.bare_type() == "str" and param.nargs == 1 else _kind(param)
            if param.metavar is None:
                param.metavar = (param.name or "value").upper()
            if type(param) is TyperArgument:  # typer prints its type even beside a metavar
                param.__class__ = _ArgumentHelp
                cast("_ArgumentHelp", param).kind = f"{kind}..." if param.nargs != 1 else kind
        elif param.metavar is None:
            param.metavar = "" if getattr(param, "is_flag", False) else _kind(param)
    # --help is made on first use; make it now, as a flag with no metavar.
    names = (getattr(command, "context_settings", None) or {}).get("help_option_names")
    help_option = command.get_help_option(SimpleNamespace(help_option_names=names or ["--help"]))
    if help_option is not None and help_option.metavar is None:
        help_option.metavar = ""
    for sub in getattr(command, "commands", {}).values():
        set_metavars(sub)
    return command
