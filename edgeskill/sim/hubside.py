"""The hub side of a simulation: the home, the skill, the claim token, hub and broker processes.

Everything goes through the fleet service and ``edgeskill hub serve``
children, as an operator's own scripts would.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from cloud.service import FleetService
from edgeskill.processes import Fleet, find_program, free_port, wait_for_port
from edgeskill.sim.params import SKILL_VERSIONS, SimSettings, SimSettingsError
from skills.bundle import build_bundle
from skills.manifest import Manifest

__all__ = [
    "GROUP",
    "LABELS",
    "SKILL",
    "HubEndpoints",
    "open_home",
    "publish_versions",
    "start_hubs",
    "write_claim",
]

LIBRARY = Path(__file__).resolve().parents[2] / "skills" / "library"
#: The simulated skill: the library's digits skill, without model files (none are loaded).
SKILL = "digits"
#: The labels simulated devices get, and the group that selects them.
LABELS = {"kind": "camera", "sim": "fleet"}
GROUP = "sim-fleet"
MQTT_PREFIX = "edgeskill-sim/v1"
MQTT_OPTIONS = "session_expiry=600"


@dataclass
class HubEndpoints:
    """The hub's TUF root and CA, and where agents connect and enrol (one per hub process)."""

    trusted_root: Path
    ca: Path
    hub_urls: list[str] = field(default_factory=list)
    enroll_urls: list[str] = field(default_factory=list)


def open_home(settings: SimSettings, work: Path) -> FleetService:
    """The hub home: ``settings.home`` opened, or a new one in ``work/hub``.

    Raises:
        SimSettingsError: the given home's security or store cannot run these settings.
        HubError: the home cannot be opened or made.
    """
    if settings.home is None:
        return FleetService.init(
            work / "hub",
            settings.store_url or None,
            grpc_bind=f"127.0.0.1:{free_port()}",
            insecure=settings.insecure,
        )
    service = FleetService.open(settings.home)
    problem = ""
    if service.config.insecure != settings.insecure:
        kind = "an insecure" if service.config.insecure else "a secure"
        problem = f"--home {settings.home} is {kind} hub; match it with --insecure or not"
    elif settings.hubs > 1 and not service.config.store_url.startswith("postgresql"):
        problem = f"--hubs {settings.hubs} needs a hub on PostgreSQL; {settings.home} is not"
    if problem:
        service.close()
        raise SimSettingsError(problem)
    return service


def publish_versions(service: FleetService, work: Path) -> list[str]:
    """Publish the versions of the simulated skill the hub lacks; returns those published.

    Raises:
        HubError: publishing failed.
        SkillError: the bundle cannot be built.
    """
    have = {v.version for v in service.skills.list(SKILL)}
    published = []
    for version in SKILL_VERSIONS:
        if version in have:
            continue
        service.skills.publish(_bundle(version, work / "dist"))
        published.append(version)
    if GROUP not in {g.name for g in service.groups.list()}:
        service.groups.create(GROUP, ",".join(f"{k}={v}" for k, v in LABELS.items()))
    return published


def _bundle(version: str, out: Path) -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / SKILL
        shutil.copytree(LIBRARY / SKILL, src, ignore=shutil.ignore_patterns("__pycache__"))
        manifest = Manifest.from_toml((src / "skill.toml").read_text(encoding="utf-8"))
        text = dataclasses.replace(manifest, version=version).to_toml()
        (src / "skill.toml").write_text(text, encoding="utf-8")
        return build_bundle(src, out)


def write_claim(service: FleetService, devices: int, work: Path) -> Path:
    """One claim token for every simulated device, in a file only this user reads."""
    token = service.identity.create_claim(LABELS, uses=devices, ttl_s=6 * 3600)
    path = work / "claim.token"
    path.touch(mode=0o600)
    path.write_text(token, encoding="utf-8")
    return path


def start_hubs(
    settings: SimSettings, service: FleetService, fleet: Fleet, broker: Fleet, work: Path
) -> HubEndpoints:
    """Start the broker (secure MQTT) and ``settings.hubs`` hub processes; wait until they serve.

    Raises:
        HubError: Mosquitto is missing, or the broker's files cannot be written.
        TimeoutError: a hub or the broker did not listen in time.
        OSError: a process could not be started.
    """
    found = HubEndpoints(service.trusted_root, service.home / "pki" / "ca.crt")
    hub_mqtt = agent_mqtt = ""
    if settings.transport == "mqtt":
        hub_mqtt, agent_mqtt = (
            (settings.mqtt_url, settings.mqtt_url)
            if settings.mqtt_url
            else _start_broker(service, broker, work)
        )
    for i in range(settings.hubs):
        port = free_port()  # and port + 1, for enrolment
        args = ["hub", "serve", "--home", str(service.home), "--grpc-bind", f"127.0.0.1:{port}"]
        args += ["--heartbeat", str(settings.heartbeat_s)]
        if hub_mqtt:
            args += ["--mqtt", hub_mqtt]
        proc = fleet.start(f"hub-{i}", args)
        try:
            wait_for_port(port, 60, proc)  # a hub that exits is said at once, not in 60 s
        except (ChildProcessError, TimeoutError) as exc:
            log = fleet.logs / f"hub-{i}.log"
            said = _last_lines(log)  # the work folder, and the log, may be gone soon
            raise type(exc)(f"hub-{i}: {exc} (its log: {log}){said}") from exc
        scheme = "grpc" if settings.insecure else "grpcs"
        found.hub_urls.append(agent_mqtt or f"{scheme}://127.0.0.1:{port}")
        found.enroll_urls.append(f"grpcs://127.0.0.1:{port + 1}")
    return found


def _start_broker(service: FleetService, broker: Fleet, work: Path) -> tuple[str, str]:
    """A Mosquitto of the run's own with TLS and the hub's ACL; returns the hub's and agents' URLs.

    Raises:
        HubError: Mosquitto is not installed, or its files cannot be written.
        TimeoutError: it did not listen in time.
    """
    from cloud.broker import hub_mqtt_url, write_broker_config  # noqa: PLC0415 - MQTT only
    from cloud.errors import HubError  # noqa: PLC0415

    program = find_program("mosquitto")
    if program is None:
        raise HubError("secure MQTT needs Mosquitto (the `mosquitto` program) installed")
    port = free_port()
    config = write_broker_config(service.home, work / "broker", port=port, prefix=MQTT_PREFIX)
    broker.spawn("broker", [program, "-c", str(config)])
    wait_for_port(port, 10)
    hub = f"{hub_mqtt_url(service.home, '127.0.0.1', port, MQTT_PREFIX)}&{MQTT_OPTIONS}"
    return hub, f"mqtts://127.0.0.1:{port}/{MQTT_PREFIX}?{MQTT_OPTIONS}"


def _last_lines(log: Path, lines: int = 6, max_chars: int = 1500) -> str:
    """The end of a log, to quote in an error; empty when there is nothing to read."""
    try:
        with log.open("rb") as handle:
            handle.seek(max(0, log.stat().st_size - 16 * max_chars))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
    kept = [line for line in text.splitlines() if line.strip()][-lines:]
    tail = "\n".join(kept)[-max_chars:]
    return f"; it ended with:\n{tail}" if tail else ""
