"""``edgeskill drift``: the drift incidents the hub opened, what it did about them, and settings.

Each command opens the hub's fleet service for its own run; the hub is
imported only then.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from edgeskill._common import DEFAULT_HOME, HomeOpt, _fleet, audited, console, print_error

if TYPE_CHECKING:
    from cloud.service.drift import IncidentView

drift_app = typer.Typer(
    help="Accuracy drift on devices: incidents, retraining, canaries.", no_args_is_help=True
)


def _stamp(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _chain(incident: IncidentView) -> str:
    s = incident.state
    links = [
        f"job {s.job_id}" if s.job_id is not None else "",
        f"model {s.model_id}" if s.model_id is not None else "",
        f"{s.skill} {s.skill_version}" if s.skill_version else "",
        f"deployment {s.deployment_id}" if s.deployment_id is not None else "",
    ]
    return " -> ".join(link for link in links if link) or "-"


@drift_app.command("incidents")
def drift_incidents(
    everything: Annotated[
        bool, typer.Option("--all", help="Also the incidents that have ended.")
    ] = False,
    home: HomeOpt = DEFAULT_HOME,
) -> None:
    """List drift incidents: open ones (or --all), their stage and what they link to.

    Examples:
      edgeskill drift incidents --home hub
      edgeskill drift incidents --all --home hub
    """
    table = Table("id", "skill", "version", "group", "stage", "opened", "links")
    table.add_column("reason / outcome", overflow="fold")
    with _fleet(home) as fleet:
        found = fleet.drift.incidents(everything=everything)
    for incident in found:
        s = incident.state
        why = s.outcome or s.reason
        row = (str(s.id), s.skill, s.version, s.group, s.stage.value, _stamp(s.opened_ms))
        table.add_row(*(escape(cell) for cell in (*row, _chain(incident), why)))
    console.print(table)
    if not found:
        console.print("no drift incidents" + ("" if everything else " open (see --all)"))


@drift_app.command("show")
def drift_show(
    incident_id: Annotated[int, typer.Argument(metavar="ID", help="As `drift incidents` lists.")],
    home: HomeOpt = DEFAULT_HOME,
) -> None:
    """Show one incident: its stages, the chain job -> model -> version -> deployment, numbers.

    Examples:
      edgeskill drift show 3 --home hub
    """
    with _fleet(home) as fleet:
        incident = fleet.drift.show(incident_id)
    s = incident.state
    console.print(
        f"drift incident {s.id}: {escape(s.skill)} {escape(s.version)} on group "
        f"{escape(s.group)}, [bold]{s.stage.value}[/]"
    )
    console.print(f"opened {_stamp(s.opened_ms)}: {escape(s.reason)}")
    console.print(f"chain: {escape(_chain(incident))}")
    if s.outcome:
        console.print(f"outcome ({_stamp(s.closed_ms)}): {escape(s.outcome)}")
    stages = Table("stage", "at", title="stages")
    stages.add_column("note", overflow="fold")
    for change in s.history:
        stages.add_row(change.stage.value, _stamp(change.at_ms), escape(change.note))
    console.print(stages)
    facts = Table("what", title="numbers and detail")
    facts.add_column("value", overflow="fold")
    for key, value in sorted({**incident.numbers, **incident.detail}.items()):
        facts.add_row(escape(key), escape(json.dumps(value)))
    console.print(facts)


@drift_app.command("settings")
def drift_settings(
    group: Annotated[str, typer.Argument(help="The group.")],
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", metavar="KEY=VALUE", help="Change a setting; repeat for more."),
    ] = None,
    home: HomeOpt = DEFAULT_HOME,
) -> None:
    """Show a group's drift settings, or change some with --set (values are JSON or text).

    Examples:
      edgeskill drift settings cameras --home hub
      edgeskill drift settings cameras --set min_devices=2 --set teacher=digits-big --home hub
    """
    changes = {}
    for item in set_ or []:
        key, sep, text = item.partition("=")
        if not sep:
            print_error(f"--set {item!r}: use KEY=VALUE")
            raise typer.Exit(2)
        try:
            changes[key.strip()] = json.loads(text)
        except ValueError:
            changes[key.strip()] = text
    with _fleet(home) as fleet:
        chosen = fleet.drift.settings(group)
        if changes:
            before, chosen = chosen, fleet.drift.set_settings(group, **changes)
            audited(
                fleet,
                "drift.settings",
                f"group/{group}",
                before=before.to_dict(),
                after=chosen.to_dict(),
                project=fleet.groups.get(group).project,
            )
    table = Table("setting", "value", title=f"drift settings of group {escape(group)}")
    for key, value in sorted(chosen.to_dict().items()):
        table.add_row(escape(key), escape(json.dumps(value)))
    console.print(table)
