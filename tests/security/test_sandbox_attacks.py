"""Hostile control code against the sandbox: each attack is refused or contained.

The agent here is this test process: it launches skills with the real
launcher (their own user, a hidden filesystem view, no network unless
declared, the owner's caps) next to a good skill that must keep answering,
and survives every attack. Containments that end a skill are reported
through the reconciler's ``on_event``.
"""

from __future__ import annotations

import asyncio
import os
import socket
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edge_agent.errors import SandboxError
from edge_agent.installs import InstallStore
from edge_agent.reconciler import Reconciler
from edge_agent.sandbox import SkillProcess
from edge_agent.sandbox.launcher import make_launcher
from edge_agent.sandbox.policy import OwnerLimits
from edge_agent.sandbox.reaper import processes_of
from skills.manifest import Manifest, Resources
from tests.support import wait_until

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="confinement needs root")

HOSTILE = """
import os, socket, sys, threading, time
from skills.sdk import Skill


def _try(fn):
    try:
        return {"ok": True, "value": fn()}
    except BaseException as exc:  # noqa: BLE001 - the outcome is the answer
        return {"ok": False, "error": type(exc).__name__}


def _spin():
    while True:
        pass


class Hostile(Skill):
    def setup(self, ctx):
        self.ctx = ctx

    def process(self, item):
        op = item["op"]
        if op == "ping":
            return {"uid": os.getuid(), "pid": os.getpid()}
        if op == "read":
            return _try(lambda: open(item["path"], "rb").read(64).hex())
        if op == "write":
            return _try(lambda: open(item["path"], "ab").write(b"pwned"))
        if op == "connect":
            return _try(lambda: socket.create_connection(("127.0.0.1", item["port"]), 2).close())
        if op == "kill":
            return _try(lambda: os.kill(item["pid"], 9))
        if op == "forkbomb":
            children = []
            for _ in range(item["n"]):
                try:
                    pid = os.fork()
                except OSError as exc:
                    return {"forked": len(children), "error": type(exc).__name__}
                if pid == 0:
                    os.execv("/bin/sleep", ["sleep", "600"])
                children.append(pid)
            return {"forked": len(children), "error": ""}
        if op == "escape":
            pid = os.fork()
            if pid == 0:
                os.setsid()
                if os.fork() == 0:
                    time.sleep(600)
                os._exit(0)
            os.waitpid(pid, 0)
            return {}
        if op == "hog":
            blocks = []
            for _ in range(item["gb"] * 16):  # 64 MiB at a time, every page touched
                blocks.append(bytearray(b"x" * (64 * 1024 * 1024)))
            return {"held": len(blocks)}
        if op == "spin":
            threading.Thread(target=_spin, daemon=True).start()
            return {}
        raise KeyError(op)
"""

GOOD = """
from skills.sdk import Skill


class Good(Skill):
    def setup(self, ctx):
        pass

    def process(self, item):
        return {"answer": 42}
"""


def _install(state: Path, name: str, code: str, entry: str, **resources: Any) -> Path:
    skill_dir = state / "installs" / "skills" / name / "1.0.0"
    (skill_dir / "control").mkdir(parents=True)
    (skill_dir / "control" / f"{name.replace('-', '_')}.py").write_text(textwrap.dedent(code))
    manifest = Manifest(
        name=name,
        version="1.0.0",
        entrypoint=f"{name.replace('-', '_')}:{entry}",
        resources=Resources(**resources),
    )
    (skill_dir / "skill.toml").write_text(manifest.to_toml())
    return skill_dir


class Device:
    """An agent state folder with secrets, a hub home beside it, and a good skill running."""

    def __init__(self, root: Path) -> None:
        self.state = root / "agent"
        (self.state / "identity").mkdir(parents=True, mode=0o700)
        self.secrets = {
            "outbox": _secret(self.state / "outbox.db"),
            "device key": _secret(self.state / "identity" / "device.key"),
            "trust metadata": _secret(self.state / "trust" / "root.json"),
            "hub targets key": _secret(root / "hub" / "keys" / "targets.pem"),
        }
        self.good_dir = _install(self.state, "good", GOOD, "Good")
        self.launch = make_launcher(
            ["onnx-cpu"],
            (),
            self.state / "logs",
            owner=OwnerLimits(
                max_processes=48, busy_window_s=1.5, busy_cpu_fraction=0.5, memory_mb=4096
            ),
        )
        self.good = self.launch(self.good_dir, {})

    def hostile(self, **resources: Any) -> SkillProcess:
        skill_dir = self.state / "installs" / "skills" / "hostile" / "1.0.0"
        if not skill_dir.exists():
            _install(self.state, "hostile", HOSTILE, "Hostile", **resources)
        return self.launch(skill_dir, {})

    def good_still_answers(self) -> bool:
        return self.good.alive and self.good.process({})[0] == {"answer": 42}


def _secret(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"SECRET")
    path.chmod(0o600)
    return path


@pytest.fixture
def device(tmp_path: Path) -> Iterator[Device]:
    dev = Device(tmp_path)
    yield dev
    dev.good.stop()


def call(proc: SkillProcess, **item: Any) -> dict[str, Any]:
    return proc.process(item, timeout=30.0)[0]


def test_a_socket_fails_without_network_and_works_when_declared(device: Device) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        proc = device.hostile()
        assert call(proc, op="connect", port=port) == {"ok": False, "error": "OSError"}
        proc.stop()
        netted = device.launch(
            _install(device.state, "netted", HOSTILE, "Hostile", network=True), {}
        )
        assert call(netted, op="connect", port=port) == {"ok": True, "value": None}
        netted.stop()
    assert device.good_still_answers()


def test_the_agents_state_keys_and_other_skills_cannot_be_read(device: Device) -> None:
    proc = device.hostile()
    assert call(proc, op="ping")["uid"] != 0
    targets = {
        **{k: str(v) for k, v in device.secrets.items()},
        "shadow": "/etc/shadow",
        "other skill": str(device.good_dir / "skill.toml"),
    }
    outcomes = {what: call(proc, op="read", path=path) for what, path in targets.items()}
    assert {what: o["ok"] for what, o in outcomes.items()} == dict.fromkeys(targets, False)
    own = call(proc, op="read", path=str(proc._skill_dir / "skill.toml"))
    assert own["ok"] is True
    proc.stop()
    assert device.good_still_answers()


def test_writing_outside_its_folder_fails(device: Device) -> None:
    proc = device.hostile()
    code = proc._skill_dir / "control" / "hostile.py"
    targets = {
        "own code": code,
        "trust metadata": device.secrets["trust metadata"],
        "other skill": device.good_dir / "control" / "good.py",
        "agent state": device.state / "planted",
    }
    outcomes = {w: call(proc, op="write", path=str(p))["ok"] for w, p in targets.items()}
    assert outcomes == dict.fromkeys(targets, False)
    assert code.read_text() == textwrap.dedent(HOSTILE)
    work = device.state / "sandbox" / "hostile" / "notes"
    assert call(proc, op="write", path=str(work)) == {"ok": True, "value": 5}
    proc.stop()
    assert device.good_still_answers()


def test_killing_the_agent_fails(device: Device) -> None:
    proc = device.hostile()
    for pid in (os.getpid(), device.good.pid):
        assert call(proc, op="kill", pid=pid) == {"ok": False, "error": "PermissionError"}
    proc.stop()
    assert device.good_still_answers()


def test_a_fork_bomb_hits_the_process_cap_and_all_of_it_dies_on_stop(device: Device) -> None:
    proc = device.hostile()
    uid = call(proc, op="ping")["uid"]
    result = call(proc, op="forkbomb", n=10_000)
    assert result["error"] == "BlockingIOError" and result["forked"] < 48
    proc.stop()
    assert processes_of(uid) == []
    assert device.good_still_answers()


def test_processes_that_left_the_session_die_on_stop(device: Device) -> None:
    proc = device.hostile()
    uid = call(proc, op="ping")["uid"]
    call(proc, op="escape")
    wait_until(lambda: len(processes_of(uid)) == 2, 10, "the control process and the escapee")
    proc.stop()
    assert processes_of(uid) == []
    assert device.good_still_answers()


def test_ten_gigabytes_are_killed_by_the_memory_watchdog(device: Device) -> None:
    proc = device.hostile(memory_mb=256)
    with pytest.raises(SandboxError):
        call(proc, op="hog", gb=10)
    assert proc.kill_reason is not None and "over the 256 MB limit" in proc.kill_reason
    assert device.good_still_answers()


def test_a_busy_loop_is_killed_by_the_watchdog(device: Device) -> None:
    proc = device.hostile()
    uid = call(proc, op="ping")["uid"]
    call(proc, op="spin")
    wait_until(lambda: not proc.alive, 30, "the busy skill to be killed")
    assert proc.kill_reason is not None and "busy loop" in proc.kill_reason
    assert processes_of(uid) == []
    assert device.good_still_answers()


def test_a_manifest_cannot_raise_the_owners_caps(device: Device) -> None:
    proc = device.hostile(memory_mb=1 << 20, max_processes=100_000)
    assert proc.limit_notes == (
        "memory_mb 1048576 clamped to the device's cap 4096",
        "max_processes 100000 clamped to the device's cap 48",
    )
    proc.stop()


def test_containments_are_reported_and_the_last_good_version_keeps_running(
    device: Device,
) -> None:
    events: list[tuple[str, str, str, str]] = []
    rec = Reconciler(
        InstallStore(device.state / "installs"),
        Path,  # nothing is fetched here
        device.launch,
        lambda: None,
        on_event=lambda *event: events.append(event),
    )
    hostile = device.hostile(memory_mb=256)
    rec.processes.update({"hostile": hostile, "good": device.good})
    rec._process_versions.update({"hostile": "1.0.0", "good": "1.0.0"})
    with pytest.raises(SandboxError):
        call(hostile, op="hog", gb=10)
    asyncio.run(rec.reconcile(None))  # a pass notices the death and reports it
    kinds = [(kind, reason, subject) for kind, reason, _detail, subject in events]
    assert kinds == [("sandbox", "memory", "hostile 1.0.0")]
    assert rec.running() == {"good": device.good} and device.good_still_answers()
