"""The simulator's settings, checked once, and the per-device plan drawn from them.

Pure: text and numbers in, frozen records or a :class:`SimSettingsError` out.
Which devices fail which installs, and which board each device is, are drawn
here from the seed, so a run's counts are exact and repeatable: with
``--fail-installs 2.0.0=0.2`` on 60 devices, exactly 12 fail.
"""

from __future__ import annotations

import math
import random
import re
import resource
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from edge_agent.profile import PROFILES

__all__ = [
    "DEFAULT_BOARDS",
    "SKILL_VERSIONS",
    "DevicePlan",
    "SimSettings",
    "SimSettingsError",
    "VersionSpec",
    "parse_board_mix",
    "parse_version_values",
    "plan_devices",
]

#: The versions of the simulated skill the hub publishes (several, so one run can try a
#: bad build, a less accurate model, a slower one and a good one against one baseline).
SKILL_VERSIONS = ("1.0.0", "2.0.0", "3.0.0", "4.0.0", "5.0.0", "6.0.0")
#: The default hardware mix: x86 gateways, ARM cameras, Jetsons and Raspberry Pis.
DEFAULT_BOARDS: Mapping[str, float] = {"x86-cpu": 0.4, "arm-cpu": 0.3, "jetson": 0.2, "rpi": 0.1}
TRANSPORTS = ("grpc", "mqtt")
#: A simulator process drives at most this many agents (descriptors, threads, memory).
MAX_AGENTS_PER_PROC = 5000
#: File descriptors one simulated agent holds: its connection, its outbox database with
#: its write-ahead log and shared memory, and one for the file an install or a metadata
#: update has open (4,907 agents filled a worker's 20,000).
FDS_PER_AGENT = 5
#: Descriptors a worker process holds besides its agents' (Python, its logs, its pipes).
FDS_PER_WORKER = 256
_VERSION = re.compile(r"^[0-9A-Za-z][0-9A-Za-z.+-]{0,63}$")


class SimSettingsError(ValueError):
    """A simulator setting cannot be used; the message is one line naming it."""


@dataclass(frozen=True)
class VersionSpec:
    """How one skill version behaves on the simulated devices.

    Attributes:
        fail_rate: Share of devices whose install of this version fails its health check.
        accuracy: Chance that an answer on a labelled input is right.
        latency_ms: Median latency on an ``x86-cpu`` board; other boards scale it.
        error_rate: Chance that the skill raises on an input (an item error).
    """

    fail_rate: float = 0.0
    accuracy: float = 0.9
    latency_ms: float = 10.0
    error_rate: float = 0.0


@dataclass(frozen=True)
class DevicePlan:
    """One simulated device: its id, board and the versions whose install fails on it."""

    device_id: str
    board: str
    fail_versions: tuple[str, ...] = ()


@dataclass(frozen=True)
class SimSettings:
    """Everything one simulator run needs; checks itself when made.

    Raises:
        SimSettingsError: a value is out of range or the combination cannot run.
    """

    devices: int
    transport: str = "grpc"
    hubs: int = 1
    procs: int = 1
    store_url: str = ""
    mqtt_url: str = ""
    insecure: bool = False
    home: Path | None = None
    workdir: Path | None = None
    deploy: tuple[str, ...] = ()
    strategy: str = "all-at-once"
    plan: str = ""
    versions: Mapping[str, VersionSpec] = field(default_factory=dict)
    boards: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_BOARDS))
    disconnect_rate: float = 0.0
    crash_rate: float = 0.0
    slow_link_ms: float = 0.0
    rate_hz: float = 2.0
    telemetry_window_s: float = 2.0
    heartbeat_s: int = 5
    #: How often each agent refreshes its TUF metadata (its ``metadata_refresh_s``).
    metadata_refresh_s: float = 300.0
    seed: int = 0
    connect_timeout_s: float = 120.0
    converge_timeout_s: float = 120.0
    soak_s: float = 0.0
    json_out: Path | None = None

    def __post_init__(self) -> None:
        """Check every value and the combination."""
        _check_counts(self)
        if self.transport not in TRANSPORTS:
            raise SimSettingsError(f"--transport {self.transport!r}: use grpc or mqtt")
        if self.hubs > 1 and self.home is None and not self.store_url.startswith("postgresql"):
            raise SimSettingsError(
                f"--hubs {self.hubs} needs a shared PostgreSQL store: pass "
                "--store-url postgresql+psycopg2://... (SQLite serves one hub process)"
            )
        if self.mqtt_url and self.transport != "mqtt":
            raise SimSettingsError("--mqtt-url is for --transport mqtt")
        if self.mqtt_url and not self.mqtt_url.startswith("mqtt://"):
            raise SimSettingsError(
                f"--mqtt-url {self.mqtt_url!r}: expected mqtt://HOST:PORT/PREFIX"
            )
        if self.mqtt_url and not self.insecure:
            raise SimSettingsError(
                "--mqtt-url is a plain broker: add --insecure, or leave it out and the "
                "simulator starts its own TLS broker"
            )
        if self.transport == "mqtt" and self.insecure and not self.mqtt_url:
            raise SimSettingsError(
                "--insecure over MQTT needs a plain broker: pass --mqtt-url mqtt://HOST:PORT/PREFIX"
            )
        for version in (*self.deploy, *self.versions):
            if version not in SKILL_VERSIONS:
                raise SimSettingsError(
                    f"version {version!r}: the simulated skill has {', '.join(SKILL_VERSIONS)}"
                )
        _check_rates(self)

    def spec(self, version: str) -> VersionSpec:
        """The behaviour of ``version`` (the defaults where nothing was set)."""
        return self.versions.get(version, VersionSpec())


def _check_counts(s: SimSettings) -> None:
    if s.devices < 1:
        raise SimSettingsError(f"--devices {s.devices}: at least 1")
    if s.hubs < 1:
        raise SimSettingsError(f"--hubs {s.hubs}: at least 1")
    if not 1 <= s.procs <= s.devices:
        raise SimSettingsError(f"--procs {s.procs}: between 1 and --devices ({s.devices})")
    if math.ceil(s.devices / s.procs) > MAX_AGENTS_PER_PROC:
        raise SimSettingsError(
            f"--devices {s.devices} over --procs {s.procs} is more than "
            f"{MAX_AGENTS_PER_PROC} agents per process; raise --procs"
        )
    _check_descriptors(s)


def worker_descriptor_limit() -> int:
    """The most file descriptors a worker process may open here (the hard ``ulimit -n``).

    A worker raises its own soft limit to this when it starts.
    """
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return hard if hard != resource.RLIM_INFINITY else 1 << 20


def _check_descriptors(s: SimSettings) -> None:
    """Refuse a share of agents per worker that would run out of file descriptors.

    Past the limit, agents fail to start one by one and the run waits for devices
    that never come: say so before anything starts.
    """
    limit = worker_descriptor_limit()
    per_worker = math.ceil(s.devices / s.procs)
    if per_worker * FDS_PER_AGENT + FDS_PER_WORKER <= limit:
        return
    fit = max(1, (limit - FDS_PER_WORKER) // FDS_PER_AGENT)
    raise SimSettingsError(
        f"--devices {s.devices} over --procs {s.procs} is {per_worker} agents per process, "
        f"about {per_worker * FDS_PER_AGENT + FDS_PER_WORKER} file descriptors; this host "
        f"allows {limit} a process (ulimit -Hn): raise --procs to {math.ceil(s.devices / fit)}"
    )


def _check_rates(s: SimSettings) -> None:
    for name, value, low in (
        ("--disconnect-rate", s.disconnect_rate, 0.0),
        ("--crash-rate", s.crash_rate, 0.0),
        ("--slow-link-ms", s.slow_link_ms, 0.0),
        ("--soak", s.soak_s, 0.0),
    ):
        if not math.isfinite(value) or value < low:
            raise SimSettingsError(f"{name} {value}: a number of at least {low:g}")
    for name, value in (
        ("--rate", s.rate_hz),
        ("--telemetry-window", s.telemetry_window_s),
        ("--connect-timeout", s.connect_timeout_s),
        ("--converge-timeout", s.converge_timeout_s),
        ("--metadata-refresh", s.metadata_refresh_s),
    ):
        if not math.isfinite(value) or value <= 0:
            raise SimSettingsError(f"{name} {value}: a number above 0")


def parse_version_values(
    items: Iterable[str], option: str, *, low: float, high: float | None = None
) -> dict[str, float]:
    """``VERSION=NUMBER`` pairs (one per item, or comma-separated) as a mapping.

    Args:
        items: The option's values as typed.
        option: The option's name, for messages (``--accuracy``).
        low: The smallest number allowed.
        high: The largest number allowed, or None for no bound.

    Raises:
        SimSettingsError: a pair is malformed, repeated, or its number out of range.
    """
    found: dict[str, float] = {}
    for item in items:
        for pair in filter(None, (p.strip() for p in item.split(","))):
            version, sep, text = pair.partition("=")
            if not sep or not _VERSION.match(version.strip()):
                raise SimSettingsError(f"{option} {pair!r}: expected VERSION=NUMBER")
            try:
                value = float(text)
            except ValueError:
                raise SimSettingsError(f"{option} {pair!r}: {text!r} is not a number") from None
            bound = f"between {low:g} and {high:g}" if high is not None else f"at least {low:g}"
            if not math.isfinite(value) or value < low or (high is not None and value > high):
                raise SimSettingsError(f"{option} {pair!r}: the number must be {bound}")
            if version.strip() in found:
                raise SimSettingsError(f"{option}: version {version.strip()} given twice")
            found[version.strip()] = value
    return found


def parse_board_mix(text: str) -> dict[str, float]:
    """``BOARD=WEIGHT[,BOARD=WEIGHT]`` (a bare ``BOARD`` weighs 1) as a mapping.

    Raises:
        SimSettingsError: an unknown board, a malformed pair, or no positive weight.
    """
    mix: dict[str, float] = {}
    for pair in filter(None, (p.strip() for p in text.split(","))):
        board, sep, weight = pair.partition("=")
        if board not in PROFILES:
            raise SimSettingsError(
                f"--boards: unknown board {board!r}; known: {', '.join(PROFILES)}"
            )
        try:
            value = float(weight) if sep else 1.0
        except ValueError:
            raise SimSettingsError(f"--boards {pair!r}: {weight!r} is not a number") from None
        if not math.isfinite(value) or value < 0:
            raise SimSettingsError(f"--boards {pair!r}: the weight must be 0 or more")
        mix[board] = value
    if not mix or sum(mix.values()) <= 0:
        raise SimSettingsError(f"--boards {text!r}: name at least one board with a weight above 0")
    return mix


def version_specs(
    fail: Mapping[str, float],
    accuracy: Mapping[str, float],
    latency: Mapping[str, float],
    errors: Mapping[str, float] | None = None,
) -> dict[str, VersionSpec]:
    """The per-version behaviour from the per-version options."""
    defaults = VersionSpec()
    errors = errors or {}
    return {
        v: VersionSpec(
            fail.get(v, defaults.fail_rate),
            accuracy.get(v, defaults.accuracy),
            latency.get(v, defaults.latency_ms),
            errors.get(v, defaults.error_rate),
        )
        for v in sorted({*fail, *accuracy, *latency, *errors})
    }


def plan_devices(settings: SimSettings) -> list[DevicePlan]:
    """Every simulated device: ids ``sim-00000``..., boards in the mix, failing installs.

    Boards are shared out by weight (largest remainder) and shuffled; for each
    version, ``round(devices * fail_rate)`` devices are drawn to fail its install.
    Both draws use ``settings.seed``.
    """
    n = settings.devices
    rng = random.Random(settings.seed)
    boards = _apportion(settings.boards, n)
    rng.shuffle(boards)
    failing: dict[int, list[str]] = {}
    for version in SKILL_VERSIONS:
        count = round(n * settings.spec(version).fail_rate)
        for index in rng.sample(range(n), count):
            failing.setdefault(index, []).append(version)
    width = max(5, len(str(n - 1)))
    return [
        DevicePlan(f"sim-{i:0{width}d}", boards[i], tuple(failing.get(i, ()))) for i in range(n)
    ]


def _apportion(weights: Mapping[str, float], n: int) -> list[str]:
    total = sum(weights.values())
    exact = {board: n * w / total for board, w in weights.items()}
    counts = {board: math.floor(x) for board, x in exact.items()}
    by_remainder = sorted(exact, key=lambda b: counts[b] - exact[b])
    for board in by_remainder[: n - sum(counts.values())]:
        counts[board] += 1
    return [board for board, count in counts.items() for _ in range(count)]
