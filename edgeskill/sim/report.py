"""What a simulation shows: counts from the hub's device views, KPIs from the devices.

Pure functions and records, plus the two rich tables: the live progress and
the summary at the end. Which version each device runs, and which installs
failed, is what the hub was told (its device views); accuracy and latency are
what the simulated skills measured (the workers' counters), so the two can be
compared.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table

from cloud.service.views import DeviceView

__all__ = [
    "FAILED_STATES",
    "Progress",
    "RunSummary",
    "VersionCount",
    "VersionSummary",
    "WaveSummary",
    "merge_versions",
    "outcome_lines",
    "percentile",
    "progress_table",
    "summary_table",
    "tally",
    "write_json",
]

#: A device whose skill is in one of these states, wanting version V, failed V's install.
FAILED_STATES = ("failed", "rolled_back")


@dataclass
class VersionCount:
    """Devices running a version, and devices whose install of it failed."""

    running: int = 0
    failed: int = 0


def tally(views: Iterable[DeviceView], skill: str) -> dict[str, VersionCount]:
    """Per version of ``skill``: how many devices run it, how many failed to install it.

    A device that rolled back after a failed install counts twice: as a failure of
    the version it wanted, and as running the version it went back to.
    """
    counts: dict[str, VersionCount] = {}
    for view in views:
        state = view.skill(skill)
        if state is None:
            continue
        runs = state.state == "running" or (state.state == "rolled_back" and state.version)
        if runs:
            counts.setdefault(state.version, VersionCount()).running += 1
        wanted = state.desired_version
        if state.state in FAILED_STATES and wanted and wanted != state.version:
            counts.setdefault(wanted, VersionCount()).failed += 1
    return counts


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100, nearest rank) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


@dataclass
class VersionKpis:
    """The devices' own measure of one version: answers, right answers, latency sample."""

    inferences: int = 0
    correct: int = 0
    errors: int = 0
    latencies_ms: list[float] = field(default_factory=list)


def merge_versions(statuses: Iterable[Mapping[str, Any]]) -> dict[str, VersionKpis]:
    """Sum the per-version counters of every worker's status."""
    merged: dict[str, VersionKpis] = {}
    for status in statuses:
        for version, data in status.get("versions", {}).items():
            kpis = merged.setdefault(version, VersionKpis())
            kpis.inferences += int(data["inferences"])
            kpis.correct += int(data["correct"])
            kpis.errors += int(data.get("errors", 0))
            kpis.latencies_ms.extend(float(x) for x in data["latencies_ms"])
    return merged


@dataclass(frozen=True)
class WaveSummary:
    """One wave of a staged deployment: the devices seen admitted at the same look."""

    #: Seconds from the deployment to the look that saw the wave open.
    opened_s: float
    devices: int
    #: Of the wave's devices seen active, from the wave's opening.
    active_p50_s: float | None
    active_p99_s: float | None


def waves_of(opened: Mapping[str, float], active: Mapping[str, float]) -> list[WaveSummary]:
    """Group devices by the look that saw their wave open; each wave's time to active."""
    members: dict[float, list[str]] = {}
    for device, at in opened.items():
        members.setdefault(at, []).append(device)
    waves = []
    for at, devices in sorted(members.items()):
        waited = sorted(active[d] - at for d in devices if d in active)
        waves.append(WaveSummary(at, len(devices), percentile(waited, 50), percentile(waited, 99)))
    return waves


@dataclass
class VersionSummary:
    """One row of the summary: a deployed (or running) version."""

    version: str
    devices_running: int
    #: Devices seen with a failed install of it: the most at any one look while it
    #: was deployed (so one that failed and later succeeded on a retry counts, and a
    #: rolled-back version keeps the failures that stopped it), or at the end.
    failed_installs: int
    inferences: int
    #: Inputs the version raised on (the devices' own count).
    errors: int
    accuracy: float | None
    latency_p50_ms: float | None
    latency_p99_ms: float | None
    deployed: bool = False
    converged: bool = False
    converge_s: float | None = None
    active_p50_s: float | None = None
    active_p99_s: float | None = None
    #: How the deployment ended: ``completed``, or a staged rollout's ``rolled_back``
    #: or ``aborted`` (with the gate's reason); empty when it did not settle.
    outcome: str = ""
    outcome_reason: str = ""
    #: Devices a staged rollout admitted (moved, or tried to); None all at once.
    moved: int | None = None
    #: A staged rollout's waves, in the order they opened.
    waves: list[WaveSummary] = field(default_factory=list)
    #: CPU seconds from the deployment until it settled: the hub processes', and the
    #: simulator's worker processes' (the agents', sharing the same cores).
    hub_cpu_s: float | None = None
    agents_cpu_s: float | None = None


@dataclass
class RunSummary:
    """The whole run: the fleet, its connection, faults, and one row per version."""

    transport: str
    devices: int
    started: int
    hubs: int
    procs: int
    secure: bool
    connect_s: float | None
    enrol_p50_s: float | None
    enrol_p99_s: float | None
    disconnects: int
    crashes: int
    device_inferences: int
    hub_inferences: int
    versions: list[VersionSummary]
    ok: bool
    #: CPU seconds of every hub process together, and the largest one's peak resident MiB.
    hub_cpu_s: float | None = None
    hub_peak_rss_mb: float | None = None
    #: CPU seconds of the worker processes: what the simulated agents cost this machine.
    agents_cpu_s: float | None = None
    #: Objects the workers froze out of garbage collection once their fleet was up.
    agents_heap_frozen: int = 0
    #: Fetch requests the agents sent, and how many of them the hub answered "busy".
    fetches: int = 0
    fetch_busy: int = 0
    #: Cores the hub processes and the workers used during ``--soak`` (None: no soak).
    soak_hub_cores: float | None = None
    soak_agents_cores: float | None = None

    def to_json(self) -> dict[str, Any]:
        """The summary as plain data."""
        return asdict(self)


@dataclass
class Progress:
    """One look at the run, for the live table."""

    phase: str
    devices: int
    started: int
    connected: int
    registered: int
    online: int
    counts: Mapping[str, VersionCount]
    inferences_per_s: float
    disconnects: int
    crashes: int


def progress_table(p: Progress) -> Table:
    """The live view: connection, per-version installs, telemetry rate, faults."""
    table = Table(title=f"edgeskill sim: {p.phase}", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("agents started", f"{p.started}/{p.devices}")
    table.add_row("agents connected", str(p.connected))
    table.add_row("hub: registered / online", f"{p.registered} / {p.online}")
    for version, count in sorted(p.counts.items()):
        table.add_row(f"digits {version}", f"{count.running} running, {count.failed} failed")
    table.add_row("telemetry", f"{p.inferences_per_s:.0f} inferences/s")
    table.add_row("faults", f"{p.disconnects} disconnects, {p.crashes} crashes")
    return table


def _num(value: float | None, fmt: str, unit: str = "") -> str:
    return "-" if value is None else f"{value:{fmt}}{unit}"


def summary_table(s: RunSummary) -> Table:
    """The table printed at the end: one row per version."""
    security = "secure (enrolled, TLS)" if s.secure else "insecure"
    title = (
        f"{s.started}/{s.devices} devices over {s.transport}, {s.hubs} hub(s), "
        f"{s.procs} process(es), {security}; connected in {_num(s.connect_s, '.1f', ' s')}; "
        f"hub CPU {_num(s.hub_cpu_s, '.1f', ' s')}, peak {_num(s.hub_peak_rss_mb, '.0f', ' MiB')}; "
        f"agents' CPU {_num(s.agents_cpu_s, '.1f', ' s')}; "
        f"fetches {s.fetches} ({s.fetch_busy} answered busy)"
    )
    table = Table(
        "version",
        "running",
        "failed installs",
        "inferences",
        "errors",
        "accuracy",
        "p50 latency",
        "p99 latency",
        "settled in",
        "p50/p99 to active",
        "rollout",
        title=title,
    )
    for v in s.versions:
        if not v.deployed:
            converged = "(not deployed)"
        elif v.converged:
            converged = _num(v.converge_s, ".1f", " s")
        else:
            converged = "NOT SETTLED"
        table.add_row(
            v.version,
            str(v.devices_running),
            str(v.failed_installs),
            str(v.inferences),
            str(v.errors),
            _num(v.accuracy, ".3f"),
            _num(v.latency_p50_ms, ".1f", " ms"),
            _num(v.latency_p99_ms, ".1f", " ms"),
            converged,
            f"{_num(v.active_p50_s, '.1f')}/{_num(v.active_p99_s, '.1f')} s",
            v.outcome or "-",
        )
    return table


def outcome_lines(s: RunSummary) -> list[str]:
    """The lines under the table: each rollout that ended on a failed gate, the soak's cost."""
    lines = [
        f"{v.version}: {v.outcome} after moving {v.moved} device(s): {v.outcome_reason}"
        for v in s.versions
        if v.outcome_reason
    ]
    if s.soak_hub_cores is not None and s.soak_agents_cores is not None:
        lines.append(
            f"idle fleet (soak): hub {s.soak_hub_cores:.2f} cores, "
            f"agents {s.soak_agents_cores:.2f} cores"
        )
    return lines


def write_json(summary: RunSummary, path: Path) -> None:
    """Write the summary as JSON (parent folders made).

    Raises:
        OSError: the file cannot be written.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary.to_json(), indent=2) + "\n", encoding="utf-8")
