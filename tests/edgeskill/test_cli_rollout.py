"""Staged rollouts from the command line: create, pause, resume, roll back, the stop switch.

Each mistake exits with status 2 and one line naming the bad value, and
leaves the hub's deployments as they were.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import Result
from typer.testing import CliRunner

from cloud.service import FleetService
from edgeskill.cli import app
from skills.bundle import build_bundle
from tests.support.tiny_models import digits_like_onnx, skill_source

runner = CliRunner()


def _cli(*args: str, home: Path) -> Result:
    return runner.invoke(app, [*args, "--home", str(home)])


def _refused(result: Result, message: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert " ".join(result.output.split()) == f"error: {message}"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A hub home with skill ``tiny`` 1.0.0 and group ``cams``."""
    path = tmp_path / "hub"
    assert _cli("hub", "init", "--insecure", home=path).exit_code == 0
    model = digits_like_onnx(tmp_path / "m.onnx").read_bytes()
    bundle = build_bundle(skill_source(tmp_path / "src", {"m.onnx": model}), tmp_path / "d")
    assert _cli("skill", "push", str(bundle), home=path).exit_code == 0
    assert _cli("groups", "create", "cams", "kind=camera", home=path).exit_code == 0
    return path


def _deployments(home: Path) -> list[tuple[int, str, str]]:
    with FleetService.open(home) as fleet:
        return [(d.id, d.strategy, d.state) for d in fleet.deployments.list()]


def test_bad_rollout_options_are_refused_and_nothing_is_deployed(
    home: Path, tmp_path: Path
) -> None:
    deploy = ("deploy", "create", "tiny", "1.0.0", "--group", "cams")
    _refused(
        _cli(*deploy, "--strategy", "canary", "--canary", "0%", home=home),
        "canary '0%' must be more than 0% and less than 100%",
    )
    _refused(
        _cli(*deploy, "--strategy", "waves", "--window", "weekdays 1-5", home=home),
        "bad window 'weekdays 1-5'; expected e.g. 'mon-fri 01:00-05:00' (UTC)",
    )
    _refused(
        _cli(*deploy, "--canary", "5", home=home),
        "canary does not apply to strategy 'all-at-once'",
    )
    missing = tmp_path / "nope.toml"
    result = _cli(*deploy, "--plan", str(missing), home=home)
    assert result.exit_code == 2 and "cannot read the rollout plan" in result.output
    plan = tmp_path / "plan.toml"
    plan.write_text('strategy = "canary"\ncanary = "10%"\nsoak = 60\n', encoding="utf-8")
    _refused(
        _cli(*deploy, "--plan", str(plan), home=home),
        "unknown rollout plan key 'soak'; known: ab, baseline_since_ms, canary, gates, "
        "install_timeout_s, min_samples, priority, rolling, soak_s, strategy, then, "
        "wave_interval_s, waves, windows",
    )
    plan.write_text('strategy = "ab"\n[ab]\ncontrol = "0.9.0"\n', encoding="utf-8")
    _refused(_cli(*deploy, "--plan", str(plan), home=home), "no skill tiny version 0.9.0")
    assert _deployments(home) == []


def test_a_staged_rollout_is_created_paused_resumed_and_rolled_back(
    home: Path, tmp_path: Path
) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_text(
        'strategy = "canary"\ncanary = "10%"\nthen = "waves"\n'
        "[waves]\nbase_rate_per_min = 20\n[gates]\ninstall_failure = 0.05\n",
        encoding="utf-8",
    )
    made = _cli(
        "deploy", "create", "tiny", "1.0.0", "--group", "cams", "--plan", str(plan),
        "--priority", "5", "--window", "daily 00:00-24:00", home=home,
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    assert "deployment 1: tiny 1.0.0 -> cams (canary)" in made.output
    status = _cli("deploy", "status", home=home)
    assert status.exit_code == 0 and "pending, 0/0 moved" in status.output

    assert "pause asked" in _cli("deploy", "pause", "1", home=home).output
    assert "resume asked" in _cli("deploy", "resume", "1", home=home).output
    with FleetService.open(home) as fleet:
        (view,) = fleet.deployments.status(1)
        assert view.deployment.priority == 5
        assert view.rollout is not None and view.rollout.plan["windows"] == ["daily 00:00-24:00"]
    assert "rollback asked" in _cli("deploy", "rollback", "1", home=home).output

    plain = _cli("deploy", "create", "tiny", "1.0.0", "--group", "cams", home=home)
    assert plain.exit_code == 0
    _refused(
        _cli("deploy", "pause", "2", home=home),
        "deployment 2 rolls out all at once; only a staged rollout takes pause",
    )
    _refused(_cli("deploy", "resume", "9", home=home), "no deployment 9")
    # a newer all-at-once deployment takes the group from the staged one at once
    assert _deployments(home) == [(1, "canary", "superseded"), (2, "all-at-once", "active")]


def test_the_fleet_stop_switch(home: Path) -> None:
    assert "fleet stop switch on" in _cli("deploy", "stop-all", home=home).output
    assert "(it already was)" in _cli("deploy", "stop-all", home=home).output
    with FleetService.open(home) as fleet:
        assert fleet.deployments.fleet_stopped()
    assert "fleet stop switch off" in _cli("deploy", "resume-all", home=home).output
    with FleetService.open(home) as fleet:
        assert not fleet.deployments.fleet_stopped()
        log = [e.message for e in fleet.events.recent(kind="deployment")]
    assert log == [
        "fleet stop switch on: no rollout moves a device",
        "fleet stop switch off: rollouts carry on",
    ]
