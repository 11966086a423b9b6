"""``edgeskill deploy``: roll skill versions out to groups, watch them, and stop or undo them.

Each command opens the hub's fleet service for its own run; the hub is
imported only then.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from edgeskill._common import DEFAULT_HOME, HomeOpt, _fleet, audited, console, print_error
from edgeskill.cli_project import ProjectOpt

if TYPE_CHECKING:
    from cloud.service.views import DeploymentView, RolloutView

deploy_app = typer.Typer(help="Roll skill versions out to device groups.", no_args_is_help=True)


@deploy_app.command("create")
def deploy_create(
    skill: Annotated[str, typer.Argument(help="A pushed skill's name.")],
    version: Annotated[str, typer.Argument(help="The version to roll out.")],
    group: Annotated[str, typer.Option(metavar="GROUP", help="Target group.")],
    config: Annotated[
        list[str] | None,
        typer.Option(metavar="K=V[,K=V]", help="Skill config k=v[,k=v]; repeat for more."),
    ] = None,
    strategy: Annotated[
        str | None,
        typer.Option(
            metavar="STRATEGY",
            help="all-at-once (default), canary, waves, rolling or ab; over the plan's.",
        ),
    ] = None,
    canary: Annotated[
        str | None,
        typer.Option(metavar="N|N%", help="Canary size: a device count or a share like 10%."),
    ] = None,
    plan: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE", help="Rollout plan (TOML): waves, gates, soak, windows, A/B control."
        ),
    ] = None,
    priority: Annotated[
        int | None,
        typer.Option(metavar="N", help="Higher overrides lower where two deployments overlap."),
    ] = None,
    window: Annotated[
        list[str] | None,
        typer.Option(
            metavar="DAYS HH:MM-HH:MM",
            help="Maintenance window in UTC, e.g. 'mon-fri 01:00-05:00'; repeat for more.",
        ),
    ] = None,
    project: ProjectOpt = "default",
    home: HomeOpt = DEFAULT_HOME,
) -> None:
    """Deploy SKILL VERSION to a group: all at once, or staged with gates between waves.

    A staged rollout (canary, waves, ab, or any --window) is moved by the hub's
    leader: a wave opens only while its gates (install failures, health, and
    KPIs against the running version) pass, and a failing gate rolls the moved
    devices back. Devices not yet moved keep the older deployment until the
    rollout completes. Follow it with `deploy status`. The deployment is in
    --project, as its group and skill must be, and reaches only its devices.

    Examples:
      edgeskill deploy create digits 1.0.0 --group cameras --home hub
      edgeskill deploy create digits 1.0.0 --group cameras --config min_confidence=0.8 --home hub
      edgeskill deploy create digits 2.0.0 --group cameras --strategy canary --canary 10% --home hub
      edgeskill deploy create digits 2.0.0 --group cameras --plan rollout.toml --home hub
      edgeskill deploy create digits 2.0.0 --group night --strategy waves --priority 10 \\
        --window "mon-fri 01:00-05:00" --home hub
    """
    text = None
    if plan is not None:
        try:
            text = plan.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            print_error(f"cannot read the rollout plan {plan}: {getattr(exc, 'strerror', exc)}")
            raise typer.Exit(2) from exc
    with _fleet(home) as fleet:
        dep = fleet.deployments.create(
            skill, version, group, strategy=strategy, config=config or [], plan=text,
            canary=canary, priority=priority, windows=window or [], project=project,
        )  # fmt: skip
        audited(fleet, "deployments.create", f"deployment/{dep.id}", after=dep)
    console.print(f"deployment {dep.id}: {skill} {version} -> {group} ({dep.strategy})")


@deploy_app.command("status")
def deploy_status(home: HomeOpt = DEFAULT_HOME) -> None:
    """List deployments with their state computed from their devices, and why they failed.

    A staged deployment also shows its rollout's phase (canary, soaking, wave,
    paused, completed, aborted, rolled_back), how many devices it moved, and
    why it paused or stopped, or else what its gates wait for.
    """
    from cloud.service.status import short_reason  # noqa: PLC0415

    table = Table("id", "skill", "version", "group", "strategy", "state", "ok/failed/pending")
    table.add_column("rollout", overflow="fold")
    table.add_column("first failure", overflow="fold")
    with _fleet(home) as fleet:
        for st in fleet.deployments.status():
            d, failed = st.deployment, st.first_failure
            waiting = st.total - st.count("succeeded") - st.count("failed")
            counts = f"{st.count('succeeded')}/{st.count('failed')}/{waiting} of {st.total}"
            why = f"{failed.device_id}: {short_reason(failed.reason, 80)}" if failed else ""
            row = (str(d.id), d.skill, d.version, d.group, d.strategy, st.state, counts)
            table.add_row(*(escape(cell) for cell in (*row, _rollout_cell(st.rollout), why)))
    console.print(table)


def _rollout_cell(rollout: RolloutView | None) -> str:
    if rollout is None:
        return ""
    text = f"{rollout.phase}, {rollout.admitted}/{rollout.targets} moved"
    if rollout.reason:
        return f"{text}: {rollout.reason}"
    waiting = [reason for _, verdict, reason in rollout.gates if verdict != "pass"]
    return f"{text}; {waiting[0]}" if waiting else text


DeploymentId = Annotated[
    int, typer.Argument(metavar="ID", help="The deployment, as `deploy status` lists.")
]


@deploy_app.command("abort")
def deploy_abort(deployment_id: DeploymentId, home: HomeOpt = DEFAULT_HOME) -> None:
    """Abort a deployment.

    All at once: its devices fall back to the previous deployment's version.
    Staged: the rollout stops where it is (use `deploy rollback` to undo it).
    """
    dep = _steer(home, deployment_id, "abort")
    console.print(f"deployment {dep.id} {_asked(dep.state, dep.strategy, 'abort')}")


def _steer(home: Path, deployment_id: int, command: str) -> DeploymentView:
    """Abort, pause, resume or roll back a deployment, and record it in the audit log."""
    with _fleet(home) as fleet:
        before = fleet.deployments.get(deployment_id)
        after: DeploymentView = getattr(fleet.deployments, command)(deployment_id)
        audited(
            fleet,
            f"deployments.{command}",
            f"deployment/{deployment_id}",
            before=before,
            after={**dataclasses.asdict(after), "requested": command},
        )
    return after


def _asked(state: str, strategy: str, kind: str) -> str:
    staged = strategy != "all-at-once"
    return f"{kind} asked; the hub's leader carries it out" if staged else state


@deploy_app.command("pause")
def deploy_pause(deployment_id: DeploymentId, home: HomeOpt = DEFAULT_HOME) -> None:
    """Hold a staged rollout: no new wave opens until `deploy resume`."""
    dep = _steer(home, deployment_id, "pause")
    console.print(f"deployment {dep.id}: pause asked; the hub's leader carries it out")


@deploy_app.command("resume")
def deploy_resume(deployment_id: DeploymentId, home: HomeOpt = DEFAULT_HOME) -> None:
    """Let a paused staged rollout carry on."""
    dep = _steer(home, deployment_id, "resume")
    console.print(f"deployment {dep.id}: resume asked; the hub's leader carries it out")


@deploy_app.command("rollback")
def deploy_rollback(deployment_id: DeploymentId, home: HomeOpt = DEFAULT_HOME) -> None:
    """Return every device the deployment moved to the version it ran before."""
    dep = _steer(home, deployment_id, "rollback")
    console.print(f"deployment {dep.id} {_asked(dep.state, dep.strategy, 'rollback')}")


@deploy_app.command("stop-all")
def deploy_stop_all(home: HomeOpt = DEFAULT_HOME) -> None:
    """Fleet-wide stop switch: no staged rollout moves a device until `deploy resume-all`."""
    changed = _stop_switch(home, on=True)
    console.print("fleet stop switch on" + ("" if changed else " (it already was)"))


@deploy_app.command("resume-all")
def deploy_resume_all(home: HomeOpt = DEFAULT_HOME) -> None:
    """Turn the fleet-wide stop switch off; staged rollouts carry on."""
    changed = _stop_switch(home, on=False)
    console.print("fleet stop switch off" + ("" if changed else " (it already was)"))


def _stop_switch(home: Path, *, on: bool) -> bool:
    """Turn the fleet-wide stop switch on or off; whether it changed (then it is audited)."""
    with _fleet(home) as fleet:
        before = fleet.deployments.fleet_stopped()
        changed = fleet.deployments.fleet_stop(on)
        if changed:
            audited(fleet, "fleet.stop", "fleet/stop", before={"on": before}, after={"on": on})
    return changed
