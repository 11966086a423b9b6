"""Say why: the real ``edgeskill`` command shows why installs failed, per device and deployment.

A hub home is made with the project's helper, devices register and report
through the store as the hub's servers do, then each command runs as its
own process, the way an operator runs it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloud.hub import Hub
from cloud.store import SkillStatusRecord
from cloud.store.events import NewEvent
from protos.envelope import now_ms
from tests.support import wait_until
from tests.support.hubs import hub_with_digits

SETUP_FAILED = (
    "digits 2.0.0 setup failed:\n"
    "Traceback (most recent call last):\n"
    '  File "control/main.py", line 9, in setup\n'
    "RuntimeError: no camera at /dev/video0 [busy]"
)
ROLLED_BACK = "health check failed: no answer within 10 s"
REFUSED = "bad metadata: root signed by 0/1 keys"


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A hub where digits 2.0.0 went to three cameras: one runs it, one failed, one rolled back."""
    home = tmp_path_factory.mktemp("say-why") / "hub"
    hub = hub_with_digits(home, deployed=True)
    try:
        store = hub.store
        store.add_skill_version(
            "digits", "2.0.0", target_name="digits/e.skill", sha256="b" * 64, size=1, manifest="",
            now_ms=1,
        )  # fmt: skip
        for name in ("cam-1", "cam-2", "cam-3"):
            store.register_device(name, {"kind": "camera"}, {"board": "arm-cpu"}, now_ms=now_ms())
            running = SkillStatusRecord("digits", "1.0.0", "running", "", "1.0.0")
            store.save_report(name, 1, [running], now_ms=now_ms())
        store.create_deployment("digits", "2.0.0", "cameras", now_ms=now_ms())
        reports = {
            "cam-1": SkillStatusRecord("digits", "2.0.0", "running", "", "2.0.0", "1.0.0"),
            "cam-2": SkillStatusRecord("digits", "", "failed", SETUP_FAILED, "2.0.0"),
            "cam-3": SkillStatusRecord(
                "digits", "1.0.0", "rolled_back", ROLLED_BACK, "2.0.0", "2.0.0"
            ),
        }
        for name, status in reports.items():
            store.save_report(name, 2, [status], now_ms=now_ms())
    finally:
        hub.close()
    yield home


def edgeskill(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "250"}
    return subprocess.run(
        [sys.executable, "-m", "edgeskill.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )


def test_devices_ls_gives_a_short_reason_for_every_skill_not_running(home: Path) -> None:
    out = edgeskill("devices", "ls", "--home", str(home))
    assert out.returncode == 0, out.stderr
    rows = {line.split()[1]: line for line in out.stdout.splitlines() if "cam-" in line}
    assert "digits 2.0.0 running" in rows["cam-1"] and "(" not in rows["cam-1"].split("running")[1]
    assert (
        "failed (wanted 2.0.0, digits 2.0.0 setup failed: RuntimeError: no camera" in rows["cam-2"]
    )
    assert "video0 [busy]" not in rows["cam-2"]  # cut to about 60 characters
    assert "rolled_back (wanted 2.0.0, health check failed: no answer within 10 s)" in rows["cam-3"]


def test_devices_show_tells_the_whole_story(home: Path) -> None:
    out = edgeskill("devices", "show", "cam-2", "--home", str(home))
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for expected in (
        "device cam-2",
        "labels        kind=camera",
        "board         arm-cpu",
        "generation    desired 2, reported 2",
        "desired       2.0.0",
        "reported      - failed",
        "RuntimeError: no camera at /dev/video0 [busy]",  # the whole error, brackets as text
        "digits none -> 1.0.0: running",
        "digits 1.0.0 -> 2.0.0: failed: digits 2.0.0 setup failed:",
    ):
        assert expected in text, f"{expected!r} not in:\n{text}"
    # Presence is derived from the last message; these devices went quiet at set-up.
    assert re.search(r"^  presence      (online|offline)$", text, re.MULTILINE)
    assert re.search(r"^  last seen     20\d\d-\d\d-\d\d .* UTC \(\d+ s ago\)$", text, re.MULTILINE)


def test_devices_show_of_an_unknown_device_is_one_line_and_status_2(home: Path) -> None:
    out = edgeskill("devices", "show", "nobody", "--home", str(home))
    said = (out.stdout + out.stderr).strip().splitlines()
    assert out.returncode == 2
    assert said == ["error: no device 'nobody'"]


def test_deploy_status_computes_the_state_and_shows_the_first_failure(home: Path) -> None:
    out = edgeskill("deploy", "status", "--home", str(home))
    assert out.returncode == 0, out.stderr
    [first] = [line for line in out.stdout.splitlines() if " 1.0.0 " in line]
    [second] = [line for line in out.stdout.splitlines() if " 2.0.0 " in line]
    assert "superseded" in first
    assert "partially failed" in second and "1/2/0 of 3" in second
    assert "cam-2: digits 2.0.0 setup failed: RuntimeError: no camera" in second


def test_hub_events_lists_and_follows_new_events(home: Path) -> None:
    out = edgeskill("hub", "events", "--kind", "skill", "--device", "cam-3", "--home", str(home))
    assert out.returncode == 0, out.stderr
    assert "digits 1.0.0 -> 2.0.0: rolled_back to 1.0.0: health check failed" in out.stdout
    assert "cam-2" not in out.stdout
    bad = edgeskill("hub", "events", "--kind", "nope", "--home", str(home))
    assert bad.returncode == 2 and "unknown event kind 'nope'" in bad.stdout + bad.stderr

    args = ["hub", "events", "--follow", "--poll", "0.1", "--limit", "1", "--home", str(home)]
    lines: list[str] = []
    with subprocess.Popen(
        [sys.executable, "-m", "edgeskill.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "250"},
    ) as follow:
        reader = threading.Thread(target=lambda: lines.extend(follow.stdout or ()), daemon=True)
        reader.start()
        try:
            wait_until(lambda: len(lines) >= 1, 60, "the latest event")
            hub = Hub.open(home)
            try:
                note = NewEvent("device", "cam-9 registered (x86)")
                hub.store.record_event(note, now_ms=now_ms())
            finally:
                hub.close()
            wait_until(lambda: any("cam-9 registered" in x for x in lines), 60, "the new event")
        finally:
            follow.send_signal(signal.SIGINT)
            follow.wait(timeout=30)
            reader.join(timeout=30)
    assert follow.returncode == 0
    assert sum("cam-9 registered" in x for x in lines) == 1
    assert len(lines) == 2  # the latest one, then only the new one
