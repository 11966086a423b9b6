"""Drift incidents and settings in the store, through the service layer and the CLI.

Real stores (SQLite and PostgreSQL); every change is one transaction with its event.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cloud.drift import FleetDrift, OpenIncident, Stage, fail, start_retraining
from cloud.drift.settings import DriftSettings
from cloud.errors import NotFoundError, StoreError, ValidationError
from cloud.service import FleetService
from cloud.service.drift import DriftService
from cloud.store import Store, open_store
from edgeskill.cli import app

NUMBERS = FleetDrift(1000, 5, 5, 3, 0.6, 0.4, None, 0)


def opened(group: str = "cams") -> OpenIncident:
    return OpenIncident("digits", "1.0.0", group, "3 of 5 drifting", ("a", "b", "c"), NUMBERS)


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    s = open_store(store_url)
    s.create_group("cams", "kind=camera")
    yield s
    s.close()


def service(store: Store, now: list[int]) -> DriftService:
    return DriftService(store, lambda: now[0])


def test_an_incident_opens_once_per_skill_version_and_group(store: Store) -> None:
    now = [1000]
    drift = service(store, now)
    first = drift.open(opened())
    assert first is not None and first.state.stage is Stage.OPEN
    assert drift.open(opened()) is None  # one is open: nothing new
    assert drift.open(opened("night")) is not None  # another group is another incident
    assert [i.state.group for i in drift.incidents()] == ["cams", "night"]
    shown = drift.show(first.id)
    assert shown.numbers["devices"] == ["a", "b", "c"] and shown.numbers["share"] == 0.6
    events = [e.message for e in store.events(kind="drift")]
    assert events[0] == (
        f"drift incident {first.id} (digits 1.0.0 on cams): opened: 3 of 5 drifting"
    )


def test_a_move_is_written_only_from_the_stage_it_was_read_at(store: Store) -> None:
    now = [1000]
    drift = service(store, now)
    incident = drift.open(opened())
    assert incident is not None
    old = incident.state
    now[0] = 2000
    moved = start_retraining(old, 7, 2000)
    assert drift.move(old, moved, {"training": "labelled"})
    assert not drift.move(old, start_retraining(old, 8, 2000))  # a second pass lost the race
    ended = fail(moved, 3000, "did not beat 1.0.0")
    assert drift.move(moved, ended, {"accuracy_after": 0.5})
    got = drift.show(incident.id)
    assert got.state == ended
    assert [c.stage for c in got.state.history] == [Stage.OPEN, Stage.RETRAINING, Stage.FAILED]
    assert got.detail == {"training": "labelled", "accuracy_after": 0.5}
    assert drift.incidents() == [] and [i.id for i in drift.incidents(everything=True)] == [
        incident.id
    ]
    assert drift.recent(2999)[0].id == incident.id and drift.recent(3001) == []
    assert drift.open(opened()) is not None  # the store no longer holds one open
    notes = [e.message.split(": ", 1)[1] for e in store.events(kind="drift")]
    assert notes[1:3] == ["retraining: job 7", "failed: did not beat 1.0.0"]


def test_bad_detail_changes_nothing(store: Store) -> None:
    drift = service(store, [1000])
    incident = drift.open(opened())
    assert incident is not None
    with pytest.raises(ValidationError):
        drift.move(incident.state, start_retraining(incident.state, 1, 1000), {"x": float("nan")})
    assert drift.show(incident.id).state.stage is Stage.OPEN
    with pytest.raises(NotFoundError):
        drift.show(999)


def test_settings_default_to_the_policy_and_change_per_group(store: Store) -> None:
    drift = service(store, [1000])
    assert drift.settings("cams") == DriftSettings()
    changed = drift.set_settings("cams", min_devices=2, teacher="big")
    assert (changed.policy.min_devices, changed.teacher) == (2, "big")
    assert drift.settings("cams") == changed
    assert drift.set_settings("cams", min_share=0.5).policy.min_devices == 2  # kept
    with pytest.raises(ValidationError, match="unknown drift settings colour"):
        drift.set_settings("cams", colour="red")
    with pytest.raises(ValidationError, match="min_devices"):
        drift.set_settings("cams", min_devices=0)
    with pytest.raises(NotFoundError):
        drift.set_settings("nowhere", min_devices=2)
    assert drift.settings("cams").policy.min_share == 0.5


def test_corrupt_settings_are_a_store_error(store: Store) -> None:
    store.set_drift_settings("cams", {"min_devices": -1}, now_ms=1)
    with pytest.raises(StoreError, match="corrupt"):
        service(store, [1]).settings("cams")


def test_the_cli_lists_and_shows_incidents(tmp_path: Path) -> None:
    home = tmp_path / "hub"
    runner = CliRunner()
    assert runner.invoke(app, ["hub", "init", "--insecure", "--home", str(home)]).exit_code == 0
    with FleetService.open(home) as fleet:
        fleet.groups.create("cams", "kind=camera")
        incident = fleet.drift.open(opened())
        assert incident is not None
        fleet.drift.move(incident.state, start_retraining(incident.state, 4, 2_000_000_000_000))
    listed = runner.invoke(app, ["drift", "incidents", "--home", str(home)], terminal_width=200)
    assert listed.exit_code == 0, listed.output
    assert "retraining" in listed.output and "job 4" in listed.output
    shown = runner.invoke(app, ["drift", "show", str(incident.id), "--home", str(home)])
    assert shown.exit_code == 0, shown.output
    assert "3 of 5 drifting" in shown.output and "retraining" in shown.output
    missing = runner.invoke(app, ["drift", "show", "99", "--home", str(home)])
    assert missing.exit_code == 2 and "no drift incident 99" in missing.output
    settings = runner.invoke(
        app, ["drift", "settings", "cams", "--set", "min_devices=2", "--home", str(home)]
    )
    assert settings.exit_code == 0 and "min_devices" in settings.output
