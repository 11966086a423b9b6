"""``edgeskill skill``, ``groups`` and ``devices``: the fleet's day-to-day commands.

Each command opens the hub's fleet service for its own run; the hub is
imported only then.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from edgeskill._common import (
    DEFAULT_HOME,
    HomeOpt,
    _fleet,
    _labels,
    audited,
    console,
    print_error,
)
from edgeskill.cli_project import ProjectFilterOpt, ProjectOpt

if TYPE_CHECKING:
    from cloud.service.views import (
        DeviceDetailView,
        SkillDetailView,
        SkillStateView,
    )

skill_app = typer.Typer(help="Build, publish and list skill bundles.", no_args_is_help=True)
groups_app = typer.Typer(help="Named label selectors over devices.", no_args_is_help=True)
devices_app = typer.Typer(help="The devices the hub knows.", no_args_is_help=True)

# -- skills ------------------------------------------------------------------


@skill_app.command("new")
def skill_new(
    dest: Annotated[Path, typer.Argument(help="Folder to create for the skill's source.")],
    template: Annotated[
        str, typer.Option("--from", metavar="SKILL", help="The built-in skill to start from.")
    ] = "digits",
) -> None:
    """Start a skill source folder from a built-in skill: its manifest and control code.

    Add models with `edgeskill model convert ... --out DEST/models`, list them in
    DEST/skill.toml, then `edgeskill skill build DEST`.

    Examples:
      edgeskill skill new my-digits --from digits
    """
    import shutil  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    source = _builtin_skill(template)
    if dest.exists() or dest.is_symlink():
        print_error(f"{dest} already exists; give a new folder for the skill")
        raise typer.Exit(2)
    if not dest.parent.is_dir():
        print_error(f"cannot create {dest}: {dest.parent} is not a folder")
        raise typer.Exit(2)
    try:  # copied next to DEST, then renamed: DEST appears whole or not at all
        with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{dest.name}-") as tmp:
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
            shutil.copytree(source, Path(tmp) / "skill", ignore=ignore).rename(dest)
    except OSError as exc:
        print_error(f"cannot create {dest}: {exc.strerror or exc}")
        raise typer.Exit(2) from exc
    console.print(f"created {escape(str(dest))} from the built-in skill {template}")


def _builtin_skill(name: str) -> Path:
    """The source folder of a built-in skill, from the installed package (not the cwd)."""
    import skills  # noqa: PLC0415

    library = Path(skills.__file__).resolve().parent / "library"
    known = sorted(p.name for p in library.iterdir() if (p / "skill.toml").is_file())
    if name not in known:
        print_error(f"no built-in skill {name!r}; the built-in skills are: {', '.join(known)}")
        raise typer.Exit(2)
    return library / name


@skill_app.command("build")
def skill_build(
    src: Annotated[
        Path, typer.Argument(help="Skill source folder with skill.toml, control/, models/.")
    ],
    out: Annotated[Path, typer.Option(help="Output folder.")] = Path("dist"),
    fix_hashes: Annotated[
        bool,
        typer.Option(
            "--fix-hashes",
            help="Use the model files' sha256 and size where skill.toml declares others "
            "(skill.toml itself is left as it is).",
        ),
    ] = False,
    unchecked_target: Annotated[
        list[str] | None,
        typer.Option(
            metavar="TARGET",
            help="Let this target's variants through unchecked when they cannot run here "
            "(om, TensorRT engines); repeat for more.",
        ),
    ] = None,
) -> None:
    """Build a deterministic .skill bundle from a source folder; every model must load and run.

    A library skill's folder (one with sources.toml, e.g. skills/library/ocr) takes
    its models from the installed packages and its drift reference from running
    the skill on its reference inputs.

    Examples:
      edgeskill skill build my-digits --out dist
      edgeskill skill build my-digits --out dist --fix-hashes
      edgeskill skill build skills/library/face-detect --out dist
    """
    from cloud.models.library import build_skill_source  # noqa: PLC0415
    from edgeskill.skill_runner import reference_runner  # noqa: PLC0415
    from skills.errors import SkillError  # noqa: PLC0415
    from skills.manifest import Manifest, ModelVariant  # noqa: PLC0415
    from skills.model_check import check_models, parse_unchecked_targets  # noqa: PLC0415

    skipped: list[ModelVariant] = []

    def check(root: Path, manifest: Manifest) -> None:
        skipped.extend(check_models(root, manifest, unchecked_targets=allowed))

    try:
        allowed = parse_unchecked_targets(unchecked_target or [])
        with console.status(f"building {escape(src.name)}"):
            path = build_skill_source(
                src, out, fix_hashes=fix_hashes, check=check, runner=reference_runner
            )
    except SkillError as exc:
        print_error(str(exc))
        raise typer.Exit(2) from exc
    for variant in skipped:
        console.print(
            f"[bold red]WARNING:[/] {escape(variant.path)} (target {variant.target}) was not "
            "run: nothing shows it works until a device loads it."
        )
    console.print(f"built {path}")


@skill_app.command("push")
def skill_push(
    bundle: Annotated[Path, typer.Argument(help="The .skill bundle to sign and publish.")],
    home: HomeOpt = DEFAULT_HOME,
    unchecked_target: Annotated[
        list[str] | None,
        typer.Option(
            metavar="TARGET",
            help="Sign this target's variants unchecked when they cannot run on the hub "
            "(om, TensorRT engines); repeat for more.",
        ),
    ] = None,
    project: ProjectOpt = "default",
) -> None:
    """Check every model runs, sign the bundle into the hub's TUF repository, register it.

    The skill belongs to --project; its name is then taken in every project.

    Examples:
      edgeskill skill push dist/digits-1.0.0.skill --home hub
      edgeskill skill push dist/digits-1.0.0.skill --project plant-3 --home hub
    """
    from skills.bundle import read_manifest  # noqa: PLC0415
    from skills.model_check import uncheckable_reason  # noqa: PLC0415

    allowed = unchecked_target or []
    with _fleet(home) as fleet:
        published = fleet.skills.publish(bundle, unchecked_targets=allowed, project=project)
        rec = published.version
        after = {**dataclasses.asdict(rec), "linked_artifacts": published.linked_artifacts}
        audited(fleet, "skills.publish", f"skill/{rec.name}/{rec.version}", after=after)
    if allowed:
        for variant in read_manifest(bundle).models:
            if variant.target in allowed and uncheckable_reason(variant):
                console.print(
                    f"[bold red]WARNING:[/] {escape(variant.path)} (target {variant.target}) "
                    "was signed without being run: nothing shows it works until a device loads it."
                )
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
def groups_create(
    name: Annotated[str, typer.Argument(help="The group's name, used by `deploy create`.")],
    selector: Annotated[
        str, typer.Argument(help="Labels such as kind=camera,site=plant-3; omit with --all.")
    ] = "",
    all_devices: Annotated[
        bool, typer.Option("--all", help="Select every device (no SELECTOR).")
    ] = False,
    project: ProjectOpt = "default",
    home: HomeOpt = DEFAULT_HOME,
) -> None:
    """Create a group NAME from a label SELECTOR such as kind=camera,site=plant-3.

    The group is in --project and selects only that project's devices.
    """
    with _fleet(home) as fleet:
        group = fleet.groups.create(name, selector, all_devices=all_devices, project=project)
        audited(fleet, "groups.create", f"group/{group.name}", after=group)
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
def devices_ls(project: ProjectFilterOpt = None, home: HomeOpt = DEFAULT_HOME) -> None:
    """List devices with their labels, state and skills.

    A project column shows when the devices listed are in more than one project.
    """
    with _fleet(home) as fleet:
        found = fleet.devices.list(project=project)
    several = len({d.project for d in found}) > 1
    table = Table("device", *(["project"] if several else []), "labels", "presence", "board")
    table.add_column("desired gen")
    table.add_column("skills")
    for d in found:
        skills = ", ".join(_skill_cell(s) for s in d.reported)
        labels = ",".join(f"{k}={v}" for k, v in sorted(d.labels.items()))
        cells = [d.device_id, *([d.project] if several else []), labels, d.presence, d.board]
        table.add_row(*cells, str(d.desired_generation), skills)
    console.print(table)


def _skill_cell(skill: SkillStateView) -> str:
    """``name version state``, and for a skill that is not running, the gist of why."""
    from cloud.service.status import short_reason  # noqa: PLC0415

    text = f"{skill.name} {skill.version or '-'} {skill.state}"
    if skill.state != "running":
        wanted = skill.desired_version if skill.desired_version != skill.version else ""
        why = short_reason(skill.error)
        text += f" ({', '.join(part for part in (wanted and f'wanted {wanted}', why) if part)})"
        text = text.removesuffix(" ()")
    return escape(text)


def _when(ms: int, now: int) -> str:
    """A time in UTC with how long ago it was."""
    stamp = datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"{stamp} ({max(now - ms, 0) / 1000:.0f} s ago)"


def _print_device(detail: DeviceDetailView, now: int) -> None:
    d, out = detail.device, console.print
    profile, targets = d.profile, d.profile.get("targets")
    hardware = (
        f"{d.board or '-'}, {profile.get('arch') or '-'}, "
        f"accelerator {profile.get('accelerator') or 'none'}, "
        f"targets {','.join(map(str, targets)) if isinstance(targets, list) else '-'}"
    )
    reported = "never" if d.reported_generation is None else str(d.reported_generation)
    out(f"[bold]device {escape(d.device_id)}[/]")
    out(f"  presence      {d.presence}")
    out(f"  last seen     {_when(d.last_seen_ms, now)}")
    out(f"  labels        {escape(','.join(f'{k}={v}' for k, v in sorted(d.labels.items())))}")
    out(f"  board         {escape(hardware)}")
    out(f"  agent         {escape(str(profile.get('agent_version') or '-'))}")
    out(f"  generation    desired {d.desired_generation}, reported {reported}")
    if detail.reported_ms is not None:
        out(f"  last report   {_when(detail.reported_ms, now)}")
    for skill in detail.skills:
        _print_skill(skill, now)
    if detail.events:
        out("[bold]recent events[/]")
        for e in detail.events:
            first = e.message.splitlines()[0] if e.message else ""
            out(f"  {_when(e.at_ms, now)}  {e.kind:<10} {escape(first)}", soft_wrap=True)


def _print_skill(s: SkillDetailView, now: int) -> None:
    out = console.print
    out(f"[bold]skill {escape(s.name)}[/]")
    out(f"  desired       {escape(s.desired_version or '(not wanted)')}")
    state = s.state or "not reported"
    out(f"  reported      {escape(s.reported_version or '-')} {escape(state)}")
    if s.variant:
        out(f"  variant       {escape(s.variant)}")
    if s.previous_version:
        out(f"  previous      {escape(s.previous_version)}")
    if s.error:
        out("  error")
        for line in s.error.splitlines():
            out(f"    {escape(line)}", soft_wrap=True)
    for e in s.transitions:
        first = e.message.splitlines()[0] if e.message else ""
        out(f"  {_when(e.at_ms, now)}  {escape(first)}", soft_wrap=True)


@devices_app.command("show")
def devices_show(
    device_id: Annotated[str, typer.Argument(help="The device.")],
    home: HomeOpt = DEFAULT_HOME,
) -> None:
    """Show one device's whole story: presence, desired against reported, each skill's errors."""
    from protos.envelope import now_ms  # noqa: PLC0415

    with _fleet(home) as fleet:
        detail = fleet.devices.show(device_id)
    _print_device(detail, now_ms())


@devices_app.command("telemetry")
def devices_telemetry(home: HomeOpt = DEFAULT_HOME) -> None:
    """Show what each device's skills did: inferences, accuracy on labelled input, p50 latency."""
    table = Table("device", "skill", "version", "inferences", "accuracy", "p50 latency")
    with _fleet(home) as fleet:
        for s in fleet.telemetry.summary():
            accuracy = f"{s.accuracy:.3f}" if s.accuracy is not None else "-"
            table.add_row(
                escape(s.device_id), escape(s.skill), escape(s.version), str(s.inferences),
                accuracy, f"{s.latency_p50_ms:.2f} ms",
            )  # fmt: skip
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
        before = fleet.devices.get(device_id)
        view = fleet.devices.label(device_id, wanted)
        audited(
            fleet,
            "devices.label",
            f"device/{device_id}",
            before={"labels": before.labels},
            after={"labels": view.labels},
            project=view.project,
        )
    shown = ",".join(f"{k}={v}" for k, v in sorted(view.labels.items()))
    console.print(f"{device_id}: {shown or '(no labels)'}")
