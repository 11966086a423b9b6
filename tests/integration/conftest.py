"""A real hub process and real agent processes on loopback, for end-to-end tests.

The ``cluster`` fixture runs every test twice: agents talking gRPC to the hub,
authenticated (mutual TLS; each agent enrols with a claim token on its first
start), and agents talking MQTT 5 through the system broker (127.0.0.1:1883)
under a topic prefix of their own, which is wiped of retained messages
afterwards. The system broker has no TLS, so MQTT agents run with an explicit
``--insecure`` until the suite's own TLS broker is used here.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cloud.hub import Hub
from cloud.mqtt_client import clear_retained
from cloud.service import FleetService
from protos.envelope import now_ms
from tests.support import Fleet, agent_args, free_port, wait_for_port, wait_until
from tests.support.skillkit import LIBRARY, VariantFile, build_skill, train_digits_onnx

BROKEN_SETUP = """
from skills.sdk import Skill


class DigitsSkill(Skill):
    def setup(self, ctx):
        raise RuntimeError("camera not found: /dev/video0")

    def process(self, item):
        return {}
"""


@dataclass(frozen=True)
class Bundles:
    """Bundles of the digits skill built once per test session."""

    v1: Path
    v2: Path
    v3: Path
    broken: Path  # 4.0.0: control code raises in setup
    onnx: Path


@pytest.fixture(scope="session")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> Bundles:
    work = tmp_path_factory.mktemp("bundles")
    trained = train_digits_onnx(work / "digits.onnx", epochs=3)
    models = [VariantFile("onnx-cpu", "fp32", trained.onnx_path)]
    broken_src = work / "broken-src"
    shutil.copytree(LIBRARY / "digits", broken_src, ignore=shutil.ignore_patterns("__pycache__"))
    entry = next((broken_src / "control").glob("*.py"))
    for path in (broken_src / "control").glob("*.py"):
        if "class DigitsSkill" in path.read_text():
            entry = path
    entry.write_text(BROKEN_SETUP)
    return Bundles(
        v1=build_skill(LIBRARY / "digits", "1.0.0", models, work / "dist"),
        v2=build_skill(LIBRARY / "digits", "2.0.0", models, work / "dist"),
        v3=build_skill(LIBRARY / "digits", "3.0.0", models, work / "dist"),
        broken=build_skill(broken_src, "4.0.0", models, work / "dist"),
        onnx=trained.onnx_path,
    )


@dataclass
class Cluster:
    """A hub process, its home opened in the test, and agent processes."""

    hub: Hub
    home: Path
    work: Path
    fleet: Fleet
    hub_url: str

    def start_agent(self, device_id: str, labels: list[str], source: Path | None = None) -> None:
        """Start an agent; over gRPC it enrols with a claim for ``labels`` on its first start."""
        root = self.home / "trust" / "metadata" / "root.json"
        state = self.work / "agents" / device_id
        args = agent_args(self.hub_url, device_id, labels, state, root, source)
        self.fleet.start(device_id, args + self.identity_args(device_id, labels))

    def identity_args(self, device_id: str, labels: list[str]) -> list[str]:
        """Agent arguments for the device's identity: a claim token, or ``--insecure``."""
        if not self.hub_url.startswith("grpcs://"):
            return ["--insecure"]
        if (self.work / "agents" / device_id / "identity" / "device.crt").exists():
            return []  # enrolled on an earlier start
        wanted = dict(label.split("=", 1) for label in labels)
        token = self.hub.enroller().create_claim(wanted)
        return ["--claim-token", token, "--hub-ca", str(self.home / "pki" / "ca.crt")]

    def deploy(self, version: str, group: str = "cameras") -> None:
        self.hub.store.create_deployment("digits", version, group, now_ms=now_ms())

    def skill_state(self, device_id: str) -> tuple[str, str, str] | None:
        """(version, state, error) the device last reported for ``digits``."""
        rep = self.hub.store.reported_for(device_id)
        for s in rep.skills if rep else ():
            if s.name == "digits":
                return s.version, s.state, s.error
        return None

    def wait_state(self, device_id: str, version: str, state: str, timeout_s: float = 60.0) -> str:
        """Wait until the device reports ``version`` in ``state``; returns the error text."""

        def check() -> bool:
            got = self.skill_state(device_id)
            return got is not None and got[:2] == (version, state)

        try:
            wait_until(check, timeout_s, f"{device_id} to report digits {version} {state}")
        except TimeoutError as exc:
            raise AssertionError(
                f"{exc}; last report: {self.skill_state(device_id)}; {self.agent_log(device_id)}"
            ) from exc
        got = self.skill_state(device_id)
        assert got is not None
        return got[2]

    def agent_log(self, device_id: str) -> str:
        path = self.work / "logs" / f"{device_id}.log"
        return path.read_text()[-3000:] if path.exists() else ""

    def active_version(self, device_id: str) -> str | None:
        """The version the device's ``current`` pointer names on disk."""
        current = self.work / "agents" / device_id / "installs" / "skills" / "digits" / "current"
        return current.resolve().name if current.exists() else None


SYSTEM_BROKER = "127.0.0.1:1883"


def mqtt_test_url(broker: str = SYSTEM_BROKER, keepalive: int = 5) -> str:
    """A broker URL under a fresh topic prefix, with sessions that expire soon after the test."""
    return (
        f"mqtt://{broker}/es-test/{uuid.uuid4().hex[:12]}?session_expiry=60&keepalive={keepalive}"
    )


@pytest.fixture(params=["grpc", "mqtt"])
def cluster(request: pytest.FixtureRequest, tmp_path: Path, bundles: Bundles) -> Iterator[Cluster]:
    port = free_port()
    mqtt_url = mqtt_test_url() if request.param == "mqtt" else ""
    hub = Hub.init(tmp_path / "hub", grpc_bind=f"127.0.0.1:{port}", mqtt_url=mqtt_url)
    for bundle in (bundles.v1, bundles.v2, bundles.v3, bundles.broken):
        FleetService(hub).skills.publish(bundle)
    hub.store.create_group("cameras", "kind=camera")
    fleet = Fleet(tmp_path / "logs")
    fleet.start("hub", ["hub", "serve", "--home", str(tmp_path / "hub")])
    try:
        wait_for_port(port)  # the hub subscribes on the broker before it opens this port
        yield Cluster(
            hub, tmp_path / "hub", tmp_path, fleet, mqtt_url or f"grpcs://127.0.0.1:{port}"
        )
    finally:
        fleet.stop_all()
        hub.close()
        if mqtt_url:
            clear_retained(mqtt_url)
