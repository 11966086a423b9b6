"""``edgeskill project`` and the ``--project`` options, on a real hub home."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from cloud.enrolment import Enroller
from cloud.hub import Hub
from edgeskill.cli import app
from skills.bundle import build_bundle
from tests.cloud.test_enrolment import make_csr

LIBRARY = Path(__file__).resolve().parents[2] / "skills" / "library"
runner = CliRunner()


def run(home: Path, *args: str) -> tuple[int, str]:
    result = runner.invoke(app, [*args, "--home", str(home)])
    return result.exit_code, result.output


def test_projects_are_made_listed_and_given_to_claims_groups_and_deployments(
    tmp_path: Path,
) -> None:
    home = tmp_path / "hub"
    assert run(home, "hub", "init")[0] == 0
    assert run(home, "project", "create", "plant-3") == (0, "project plant-3 created\n")
    code, out = run(home, "project", "create", "plant-3")
    assert code == 2 and "exists" in out
    for listing in ("ls", "list"):
        code, out = run(home, "project", listing)
        assert code == 0 and "default" in out and "plant-3" in out

    code, out = run(home, "hub", "claim", "create", "--project", "ghost")
    assert code == 2 and "no project 'ghost'" in out
    code, token = run(home, "hub", "claim", "create", "--project", "plant-3", "--label", "k=cam")
    assert code == 0
    hub = Hub.open(home)
    try:
        Enroller(home, hub.store).enroll(token.strip(), make_csr("cam-1"))
        hub.store.register_device("gw-1", {"k": "cam"}, {}, now_ms=1)  # insecure: default
    finally:
        hub.close()

    code, out = run(home, "devices", "ls", "--project", "plant-3")
    assert code == 0 and "cam-1" in out and "gw-1" not in out and "project" not in out
    code, out = run(home, "devices", "ls")
    assert code == 0 and "cam-1" in out and "gw-1" in out and "project" in out

    assert run(home, "groups", "create", "cams", "k=cam", "--project", "plant-3")[0] == 0
    code, out = run(home, "groups", "ls")
    assert code == 0 and "cams" in out
    code, out = run(home, "deploy", "create", "digits", "1.0.0", "--group", "cams")
    assert code == 2 and "no skill digits version 1.0.0" in out
    code, out = run(
        home, "deploy", "create", "digits", "1.0.0", "--group", "cams", "--project", "ghost"
    )
    assert code == 2 and "no project 'ghost'" in out

    bundle = build_bundle(LIBRARY / "digits", tmp_path / "dist")
    code, out = run(home, "skill", "push", str(bundle), "--project", "ghost")
    assert code == 2 and "no project 'ghost'" in out
    assert run(home, "skill", "push", str(bundle), "--project", "plant-3")[0] == 0
    code, out = run(home, "deploy", "create", "digits", "1.0.0", "--group", "cams")
    assert code == 2 and "no skill digits version 1.0.0" in out  # not in project default
    code, out = run(
        home, "deploy", "create", "digits", "1.0.0", "--group", "cams", "--project", "plant-3"
    )
    assert code == 0 and "deployment 1" in out
