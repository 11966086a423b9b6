"""A real hub process and real agent processes on loopback, for end-to-end tests.

The ``cluster`` fixture runs every test twice, authenticated both times: each
agent enrols on its first start with a claim token for its labels, over the
hub's gRPC enrolment port (server TLS, the token authenticates), and then

- ``grpc``: talks gRPC to the hub with mutual TLS;
- ``mqtt``: talks MQTT 5 over TLS with its certificate, through a Mosquitto of
  the test's own that runs the config the project generates (its CA, the
  hub's revocation list, the per-device ACL; :mod:`tests.support.broker`). The
  hub serves that broker with its own ``hub`` client certificate.

The broker keeps its data in the test's folder and is stopped (by its pid) when
the test ends, so nothing retained outlives a test.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cloud.hub import Hub
from cloud.service import FleetService
from protos.envelope import now_ms
from tests.support import Fleet, agent_args, free_port, wait_for_port, wait_until
from tests.support.broker import TlsBroker, tls_broker
from tests.support.skillkit import LIBRARY, VariantFile, build_skill, train_digits_onnx

BROKEN_SETUP = """
from skills.sdk import Skill


class DigitsSkill(Skill):
    def setup(self, ctx):
        raise RuntimeError("camera not found: /dev/video0")

    def process(self, item):
        return {}
"""

#: Options of every agent's MQTT URL: a short keepalive, so a killed agent's Last Will
#: comes within seconds, and sessions that expire soon after the test.
MQTT_OPTIONS = "session_expiry=60&keepalive=5"


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
    """A hub process, its home opened in the test, agent processes and, over MQTT, the broker."""

    hub: Hub
    home: Path
    work: Path
    fleet: Fleet
    hub_url: str
    enroll_url: str
    broker: TlsBroker | None = None

    def start_agent(self, device_id: str, labels: list[str], source: Path | None = None) -> None:
        """Start an agent; it enrols with a claim for ``labels`` on its first start."""
        root = self.home / "trust" / "metadata" / "root.json"
        args = agent_args(self.hub_url, device_id, labels, self.state(device_id), root, source)
        self.fleet.start(device_id, args + self.identity_args(device_id, labels))

    def state(self, device_id: str) -> Path:
        """The agent's state folder."""
        return self.work / "agents" / device_id

    def identity_args(self, device_id: str, labels: list[str]) -> list[str]:
        """Agent arguments for the device's identity: none once enrolled, else a claim token."""
        if (self.state(device_id) / "identity" / "device.crt").exists():
            return []  # enrolled on an earlier start
        wanted = dict(label.split("=", 1) for label in labels)
        token = self.hub.enroller().create_claim(wanted)
        ca = str(self.home / "pki" / "ca.crt")
        return ["--claim-token", token, "--hub-ca", ca, "--enroll-url", self.enroll_url]

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
        current = self.state(device_id) / "installs" / "skills" / "digits" / "current"
        return current.resolve().name if current.exists() else None


def free_port_pair() -> int:
    """A loopback port that is free together with the next one (gRPC and enrolment).

    Raises:
        OSError: no such pair was found.
    """
    for _ in range(50):
        port = free_port()
        with contextlib.suppress(OSError), socket.socket() as sock:
            sock.bind(("127.0.0.1", port + 1))
            return port
    raise OSError("no two adjacent free ports on the loopback interface")


@pytest.fixture(params=["grpc", "mqtt"])
def cluster(request: pytest.FixtureRequest, tmp_path: Path, bundles: Bundles) -> Iterator[Cluster]:
    port = free_port_pair()  # the hub enrols on the gRPC port plus one
    home = tmp_path / "hub"
    hub = Hub.init(home, grpc_bind=f"127.0.0.1:{port}")
    for bundle in (bundles.v1, bundles.v2, bundles.v3, bundles.broken):
        FleetService(hub).skills.publish(bundle)
    hub.store.create_group("cameras", "kind=camera")
    fleet = Fleet(tmp_path / "logs")
    serve = ["hub", "serve", "--home", str(home)]
    enroll_url = f"grpcs://{hub.config.enroll_bind}"
    with contextlib.ExitStack() as stack:
        stack.callback(hub.close)
        broker = None
        hub_url = f"grpcs://127.0.0.1:{port}"
        if request.param == "mqtt":
            broker = stack.enter_context(tls_broker(home, tmp_path / "broker"))
            serve += ["--mqtt", broker.hub_url(MQTT_OPTIONS)]
            hub_url = f"mqtts://127.0.0.1:{broker.port}/{broker.prefix}?{MQTT_OPTIONS}"
        stack.callback(fleet.stop_all)  # before the broker stops: clients go first
        fleet.start("hub", serve)
        wait_for_port(port)  # the hub subscribes on the broker before it opens this port
        yield Cluster(hub, home, tmp_path, fleet, hub_url, enroll_url, broker)
