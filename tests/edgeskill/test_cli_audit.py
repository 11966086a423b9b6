"""Every CLI command that changes the hub writes one audit entry, as ``cli:<user>``.

The table below names each state-changing command with the entry it must
write; a walk over the typer app checks that every command is in it or in
the list of commands that change nothing, so a new command must be sorted.
The cases share one hub home per test process; each makes the records it
acts on itself, so they run in any order (and on any xdist worker).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from cloud.enrolment import Enroller
from cloud.hub import Hub
from cloud.service import FleetService
from cloud.service.access import AuditView, Principal
from edgeskill.cli import app
from skills.bundle import build_bundle
from skills.trust._files import TMP_PREFIX
from skills.trust.ceremony import generate_root_keys
from tests.cloud.test_enrolment import make_csr

LIBRARY = Path(__file__).resolve().parents[2] / "skills" / "library"
ACTOR = Principal.local().actor
runner = CliRunner()

#: Commands that change nothing on a hub: they read it, write files elsewhere,
#: serve it (the hub's own loops make those changes), or run a throwaway hub.
UNCHANGING = {
    "agent run", "broker config", "broker reload", "console serve", "console token list",
    "agent try", "demo", "deploy status", "devices ls", "image build", "devices show",
    "devices telemetry",
    "drift incidents", "drift show", "groups ls", "hub events", "hub serve", "model jobs",
    "model ls", "model sample-stream", "model show", "model split", "project list",
    "project ls", "sim", "skill build", "skill ls", "skill new", "trust generate-root-keys",
    "trust status",
}  # fmt: skip


@dataclass(frozen=True)
class World:
    """The shared hub home and what the cases need beside it."""

    home: Path
    bundle: Path
    root_key: Path
    tmp: Path


#: Makes what a case acts on (through the services, which write no entries) and
#: returns the arguments after the command's words.
Setup = Callable[[FleetService, Hub, World], list[str]]


@dataclass(frozen=True)
class Case:
    """A state-changing command and the one entry it must write."""

    command: str
    setup: Setup
    action: str
    project: str = "default"


def _args(*args: str) -> Setup:
    return lambda _fleet, _hub, _world: list(args)


@contextmanager
def _opened(home: Path) -> Iterator[tuple[FleetService, Hub]]:
    hub = Hub.open(home)
    fleet = FleetService(hub)
    try:
        yield fleet, hub
    finally:
        fleet.close()


def _entries(fleet: FleetService, after_id: int = 0) -> list[AuditView]:
    return [e for e in fleet.audit.search(None, limit=1000) if e.id > after_id]


def _newest(fleet: FleetService) -> int:
    found = fleet.audit.search(None, limit=1)
    return found[0].id if found else 0


def _invoke(world: World, command: str, args: list[str]) -> tuple[int, str]:
    result = runner.invoke(app, [*command.split(), *args, "--home", str(world.home)])
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    """A hub with a project, camera devices, a group and a published skill."""
    tmp = tmp_path_factory.mktemp("audit")
    home = tmp / "hub"
    assert runner.invoke(app, ["hub", "init", "--home", str(home)]).exit_code == 0
    source = shutil.copytree(LIBRARY / "digits", tmp / "digits-next")
    manifest = source / "skill.toml"
    manifest.write_text(manifest.read_text().replace('version = "1.0.0"', 'version = "1.0.1"'))
    with _opened(home) as (fleet, hub):
        fleet.projects.create("plant-3")
        for i in range(4):
            hub.store.register_device(f"cam-{i}", {"kind": "camera"}, {}, now_ms=1)
        fleet.groups.create("cams", "kind=camera")
        fleet.skills.publish(build_bundle(LIBRARY / "digits", tmp / "dist"))
    (key,) = generate_root_keys(tmp / "root-keys", 1)
    return World(home, build_bundle(source, tmp / "dist-next"), key, tmp)


# -- what the cases act on -------------------------------------------------------------


def _deployment(fleet: FleetService, *, staged: bool = False) -> str:
    strategy, canary = ("canary", "25%") if staged else (None, None)
    made = fleet.deployments.create("digits", "1.0.0", "cams", strategy=strategy, canary=canary)
    return str(made.id)


def _staged(fleet: FleetService, _hub: Hub, _world: World) -> list[str]:
    return [_deployment(fleet, staged=True)]


def _all_at_once(fleet: FleetService, _hub: Hub, _world: World) -> list[str]:
    return [_deployment(fleet)]


def _paused(fleet: FleetService, _hub: Hub, _world: World) -> list[str]:
    deployment = _deployment(fleet, staged=True)
    fleet.deployments.pause(int(deployment))
    return [deployment]


def _switch(on: bool) -> Setup:
    def setup(fleet: FleetService, _hub: Hub, _world: World) -> list[str]:
        fleet.deployments.fleet_stop(on)
        return []

    return setup


def _enrolled(fleet: FleetService, hub: Hub, _world: World) -> list[str]:
    token = fleet.identity.create_claim({"kind": "camera"}, project="plant-3")
    Enroller(hub.home, hub.store).enroll(token, make_csr("cam-enrolled"))
    return ["cam-enrolled"]


def _token(fleet: FleetService, _hub: Hub, _world: World) -> list[str]:
    view, _ = fleet.tokens.create("old", "viewer", "plant-3")
    return [view.token_id]


def _root_keys(world: World) -> list[str]:
    """The current root's keys: none while the root is online, else the one made offline."""
    online = (world.home / "trust" / "keys" / "root.pem").exists()
    return [] if online else ["--root-key", str(world.root_key)]


def _trust(*args: str) -> Setup:
    return lambda _fleet, _hub, world: [*args, *_root_keys(world)]


def _rotate_root(_fleet: FleetService, _hub: Hub, world: World) -> list[str]:
    return ["--new-root-key", str(world.root_key), "--threshold", "1", *_root_keys(world)]


def _leftover(_fleet: FleetService, _hub: Hub, world: World) -> list[str]:
    (world.home / "trust" / "metadata" / f"{TMP_PREFIX}root.json").write_text("{")
    return []


def _push(_fleet: FleetService, _hub: Hub, world: World) -> list[str]:
    return [str(world.bundle)]


def _cert(_fleet: FleetService, _hub: Hub, world: World) -> list[str]:
    return ["cam-cert", "--out", str(world.tmp / "certs")]


VIEWER = ("--role", "viewer", "--project", "plant-3")
CASES = [
    Case("project create", _args("plant-9"), "projects.create", "plant-9"),
    Case("hub claim create", _args("--project", "plant-3"), "identity.claim", "plant-3"),
    Case("hub revoke", _enrolled, "identity.revoke", "plant-3"),
    Case("hub issue-cert", _cert, "identity.issue_cert"),
    Case("console token create", _args(*VIEWER), "tokens.create", "plant-3"),
    Case("console token revoke", _token, "tokens.revoke", "plant-3"),
    Case("skill push", _push, "skills.publish"),
    Case("groups create", _args("gateways", "kind=gateway"), "groups.create"),
    Case("devices label", _args("cam-0", "kind=camera", "site=9"), "devices.label"),
    Case("deploy create", _args("digits", "1.0.0", "--group", "cams"), "deployments.create"),
    Case("deploy abort", _all_at_once, "deployments.abort"),
    Case("deploy pause", _staged, "deployments.pause"),
    Case("deploy resume", _paused, "deployments.resume"),
    Case("deploy rollback", _all_at_once, "deployments.rollback"),
    Case("deploy stop-all", _switch(False), "fleet.stop"),
    Case("deploy resume-all", _switch(True), "fleet.stop"),
    Case("drift settings", _args("cams", "--set", "retrain_samples=50"), "drift.settings"),
    Case("trust renew-root", _trust(), "trust.renew_root"),
    Case("trust rotate-key", _trust("snapshot"), "trust.rotate_key"),
    Case("trust rotate-root", _rotate_root, "trust.rotate_root"),
    Case("trust repair", _leftover, "trust.repair"),
]
#: State-changing commands tested on their own below, not in the table.
ELSEWHERE = {"hub init", "model train", "model compress", "model convert", "model import",
             "model link"}  # fmt: skip


def _commands(command: object, path: tuple[str, ...] = ()) -> Iterator[str]:
    subs = getattr(command, "commands", None)
    if subs is None:
        yield " ".join(path)
        return
    for name, sub in subs.items():
        yield from _commands(sub, (*path, name))


def test_every_command_is_sorted_into_changing_or_not() -> None:
    commands = set(_commands(typer.main.get_command(app)))
    changing = {c.command for c in CASES} | ELSEWHERE
    assert not changing & UNCHANGING
    assert commands - changing - UNCHANGING == set(), "sort the new command into a list here"
    assert (changing | UNCHANGING) - commands == set(), "a command listed here is gone"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.command)
def test_a_changing_command_writes_one_entry(world: World, case: Case) -> None:
    with _opened(world.home) as (fleet, hub):
        args = case.setup(fleet, hub, world)
        last = _newest(fleet)
    code, output = _invoke(world, case.command, args)
    assert code == 0, output
    with _opened(world.home) as (fleet, _):
        new = _entries(fleet, last)
    assert [(e.action, e.actor, e.project) for e in new] == [(case.action, ACTOR, case.project)]
    entry = new[0]
    assert entry.target and (entry.before or entry.after)
    secrets = [word for word in output.split() if word.startswith("est_") or len(word) == 43]
    text = json.dumps([entry.target, entry.before, entry.after])
    assert not [s for s in secrets if s in text], "a secret the command printed is in the log"


def test_hub_init_is_the_first_entry(world: World) -> None:
    with _opened(world.home) as (fleet, _):
        first = min(_entries(fleet), key=lambda e: e.id)
    assert (first.action, first.actor, first.target) == ("hub.init", ACTOR, "hub")
    assert first.after["store"] == "sqlite" and first.after["insecure"] is False


REFUSED = [
    ("devices label", ["nobody", "kind=camera"]),
    ("devices label", ["cam-1", "kind"]),
    ("groups create", ["cams", "kind=camera"]),
    ("groups create", ["everything", ""]),
    ("deploy create", ["digits", "9.9.9", "--group", "cams"]),
    ("deploy abort", ["999"]),
    ("deploy pause", ["999"]),
    ("project create", ["not a name!"]),
    ("console token create", ["--role", "king"]),
    ("console token revoke", ["ffffffffffff"]),
    ("hub claim create", ["--project", "ghost"]),
    ("hub revoke", ["nobody"]),
    ("drift settings", ["cams", "--set", "no_such_setting=1"]),
    ("drift settings", ["no-such-group", "--set", "retrain_samples=5"]),
    ("skill push", ["missing.skill"]),
    ("trust rotate-key", ["root"]),
    ("model import", ["missing.onnx", "--name", "nothing"]),
    ("model link", ["digits", "9.9.9"]),
]


@pytest.mark.parametrize(("command", "args"), REFUSED, ids=str)
def test_a_refused_command_writes_no_entry(world: World, command: str, args: list[str]) -> None:
    with _opened(world.home) as (fleet, _):
        last = _newest(fleet)
    code, output = _invoke(world, command, args)
    assert code == 2, output
    with _opened(world.home) as (fleet, _):
        assert _entries(fleet, last) == []


def test_model_commands_write_one_entry_each(world: World, tmp_path: Path) -> None:
    onnx = tmp_path / "model.onnx"
    steps = [
        (["model", "train", "--epochs", "1", "--threads", "1", "--name", "audited",
          "--out", str(onnx)], "models.train"),
        (["model", "compress", "audited", "--variants", "int8", "--no-tflite", "--no-latency",
          "--calibration", "50"], "models.compress"),
        (["model", "convert", "audited", "--target", "onnx-cpu"], "models.convert"),
        (["model", "import", str(onnx), "--name", "imported"], "models.import"),
        (["model", "link", "digits", "1.0.0"], "models.link"),
    ]  # fmt: skip
    for args, action in steps:
        with _opened(world.home) as (fleet, _):
            last = _newest(fleet)
        result = runner.invoke(app, [*args, "--home", str(world.home)])
        assert result.exit_code == 0, result.output
        with _opened(world.home) as (fleet, _):
            new = _entries(fleet, last)
        assert [(e.action, e.actor, e.project) for e in new] == [(action, ACTOR, "default")]
