"""``edgeskill project``: the hub's projects (tenants), and the ``--project`` option.

Every device, group, skill and deployment belongs to one project; a device's
is fixed at enrolment by its claim token. The local command line is a hub
admin: it sees every project, and makes things in ``default`` unless told
otherwise with ``--project``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from edgeskill._common import DEFAULT_HOME, HomeOpt, _fleet, audited, console

__all__ = ["ProjectFilterOpt", "ProjectOpt", "project_app"]

project_app = typer.Typer(
    help="Projects (tenants): devices, groups, skills and deployments seen only inside one.",
    no_args_is_help=True,
)

#: The project a new record goes in.
ProjectOpt = Annotated[
    str,
    typer.Option(
        metavar="NAME", help="The project it belongs to (`edgeskill project ls` lists them)."
    ),
]
#: The project a listing keeps (none: every project).
ProjectFilterOpt = Annotated[
    str | None, typer.Option(metavar="NAME", help="Only this project's (default: every project).")
]


@project_app.command("create")
def project_create(
    name: Annotated[str, typer.Argument(help="The project's name, like a group's.")],
    home: HomeOpt = DEFAULT_HOME,
) -> None:
    """Create a project NAME; give it to `hub claim create --project` and the other commands.

    Examples:
      edgeskill project create plant-3 --home hub
      edgeskill hub claim create --project plant-3 --label kind=camera --home hub
    """
    with _fleet(home) as fleet:
        made = fleet.projects.create(name)
        audited(fleet, "projects.create", f"project/{made.name}", after=made, project=made.name)
    console.print(f"project {escape(name)} created")


@project_app.command("ls")
def project_ls(home: HomeOpt = DEFAULT_HOME) -> None:
    """List the hub's projects and when each was made."""
    table = Table("project", "created")
    with _fleet(home) as fleet:
        for p in fleet.projects.list():
            when = datetime.fromtimestamp(p.created_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M UTC")
            table.add_row(escape(p.name), when if p.created_ms else "-")
    console.print(table)


# `list` as well as `ls`, the other command groups' word, for whoever types it.
project_app.command("list", hidden=True)(project_ls)
