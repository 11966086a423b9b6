"""``edgeskill skill``, ``deploy``, ``groups`` and ``devices``: the fleet's day-to-day commands.

Each command opens the hub's fleet service for its own run; the hub is
imported only then.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from edgeskill._common import DEFAULT_HOME, HomeOpt, _fleet, _labels, console, print_error

skill_app = typer.Typer(help="Build, publish and list skill bundles.", no_args_is_help=True)
deploy_app = typer.Typer(help="Roll skill versions out to device groups.", no_args_is_help=True)
groups_app = typer.Typer(help="Named label selectors over devices.", no_args_is_help=True)
devices_app = typer.Typer(help="The devices the hub knows.", no_args_is_help=True)

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
        print_error(str(exc))
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
