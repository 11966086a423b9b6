"""Running a simulation: hub home, hub processes, worker processes, deployments, the report.

:func:`run_sim` is the whole run; the CLI (``edgeskill sim``) only turns
options into :class:`~edgeskill.sim.params.SimSettings` and errors into exit
statuses.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.live import Live

from cloud.errors import HubError, TransportError
from cloud.presence import heartbeat_seconds
from cloud.rollout import parse_strategy
from cloud.service import FleetService
from cloud.service.deployments import build_plan
from cloud.service.views import DeviceView
from edgeskill.processes import Fleet, stop_strays, usage
from edgeskill.sim.hubside import (
    GROUP,
    LABELS,
    SKILL,
    HubEndpoints,
    open_home,
    publish_versions,
    start_hubs,
    write_claim,
)
from edgeskill.sim.params import SKILL_VERSIONS, DevicePlan, SimSettings, SimSettingsError
from edgeskill.sim.params import plan_devices as _plan_devices
from edgeskill.sim.report import (
    Progress,
    RunSummary,
    VersionCount,
    VersionSummary,
    WaveSummary,
    merge_versions,
    outcome_lines,
    percentile,
    progress_table,
    summary_table,
    tally,
    waves_of,
    write_json,
)
from edgeskill.sim.runtime import synthetic_source
from edgeskill.sim.worker import WorkerSpec

__all__ = ["SimFailedError", "check_deploy_options", "run_sim"]

POLL_S = 0.5
#: How many times its own cost the simulator waits between two looks at the fleet:
#: a look takes at most a tenth of one core from the hub and the agents it measures.
POLL_SHARE = 9.0
_RAM = Path("/dev/shm")  # noqa: S108 - only a parent for mkdtemp, which makes a 0700 folder
WORKER_STOP_S = 30.0


class SimFailedError(Exception):
    """The run could not go on (a worker died, the fleet never connected)."""


def check_deploy_options(settings: SimSettings) -> None:
    """Refuse an unknown ``--strategy``, a heartbeat the hub refuses, or a ``--plan``
    the hub's deployments would refuse, before anything starts.

    Raises:
        SimSettingsError: the strategy is unknown, the heartbeat out of range, or
            the plan (with ``--strategy`` over it) is not one a deployment takes.
    """
    try:
        parse_strategy(settings.strategy)
    except HubError as exc:
        raise SimSettingsError(f"--strategy: {exc}") from None
    try:
        heartbeat_seconds(settings.heartbeat_s)
    except HubError as exc:
        raise SimSettingsError(f"--heartbeat: {exc}") from None
    try:
        build_plan(**_staged_options(settings))
    except HubError as exc:
        raise SimSettingsError(f"--plan: {exc}") from None


def _staged_options(settings: SimSettings) -> dict[str, Any]:
    """What a staged deployment passes the hub: the plan, and the strategy over it when asked."""
    options: dict[str, Any] = {}
    if settings.plan:
        options["plan"] = settings.plan
    if not settings.plan or settings.strategy != "all-at-once":
        options["strategy"] = settings.strategy
    return options


@dataclass
class _Run:
    settings: SimSettings
    service: FleetService
    workers: Fleet
    status_files: list[Path]
    console: Console
    hubs: Fleet | None = None
    started_at: float = field(default_factory=time.monotonic)
    last_inferences: tuple[float, int] = (0.0, 0)
    views: list[DeviceView] = field(default_factory=list)

    def statuses(self) -> list[dict[str, Any]]:
        found = []
        for path in self.status_files:
            with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
                found.append(json.loads(path.read_text(encoding="utf-8")))
        return found

    def cpu_s(self) -> tuple[float, float]:
        """CPU seconds so far of the hub processes and of the worker processes."""

        def total(fleet: Fleet | None) -> float:
            procs = fleet.procs.values() if fleet is not None else ()
            return sum(u.cpu_s for p in procs if (u := usage(p.pid)) is not None)

        return total(self.hubs), total(self.workers)

    def check_workers(self) -> None:
        for name, proc in self.workers.procs.items():
            if proc.poll() is not None:
                raise SimFailedError(f"{name} exited with status {proc.returncode}")

    def look(self, phase: str) -> Progress:
        """Poll the workers and the hub once."""
        self.check_workers()
        statuses = self.statuses()
        self.views = self.service.devices.list(LABELS)
        now = time.monotonic()
        total = sum(v["inferences"] for s in statuses for v in s.get("versions", {}).values())
        then, before = self.last_inferences
        rate = (total - before) / (now - then) if then and now > then else 0.0
        self.last_inferences = (now, total)
        return Progress(
            phase=phase,
            devices=self.settings.devices,
            started=sum(s["started"] for s in statuses),
            connected=sum(s["connected"] for s in statuses),
            registered=len(self.views),
            online=sum(v.online for v in self.views),
            counts=tally(self.views, SKILL),
            inferences_per_s=rate,
            disconnects=sum(s["disconnects"] for s in statuses),
            crashes=sum(s["crashes"] for s in statuses),
        )

    def watch(
        self, live: Live, phase: str, done: Callable[[Progress], bool], timeout_s: float
    ) -> bool:
        """Poll until ``done`` holds or ``timeout_s`` passes; whether it held."""
        deadline = time.monotonic() + timeout_s
        while True:
            cpu = time.thread_time()
            progress = self.look(phase)
            live.update(progress_table(progress))
            if done(progress):
                return True
            if time.monotonic() > deadline:
                return False
            # Reading a large fleet's state costs the cores the hub and the agents share:
            # looking takes at most a tenth of one (10,000 devices: every few seconds;
            # all at once, the times measured are the hub's records, not the looks').
            # Its CPU time counts, not its wall time: a read that waited for the hub's
            # writes cost nothing and must not push the next look back.
            time.sleep(max(POLL_S, POLL_SHARE * (time.thread_time() - cpu)))


@dataclass
class _Deployed:
    converged: bool
    converge_s: float
    active_s: list[float]
    outcome: str = ""
    reason: str = ""
    moved: int | None = None
    failed_seen: int = 0
    hub_cpu_s: float | None = None
    agents_cpu_s: float | None = None
    waves: list[WaveSummary] = field(default_factory=list)


def run_sim(settings: SimSettings, console: Console) -> int:
    """Run one simulation and print its summary; returns the exit status (0: all converged).

    Raises:
        SimSettingsError: the settings cannot run (nothing was created).
        HubError: the hub home cannot be made or opened, or publishing failed.
        SimFailedError: a worker process died.
        OSError: a process could not be started or a file written.
    """
    check_deploy_options(settings)
    service = open_home(settings, Path()) if settings.home is not None else None
    work = settings.workdir or Path(tempfile.mkdtemp(prefix="edgeskill-sim-", dir=ram_folder()))
    work.mkdir(parents=True, exist_ok=True)
    ok = False
    # SIGTERM (a timeout, a batch scheduler) unwinds like Ctrl-C, so the hub and the
    # worker processes are stopped rather than left running without their parent.
    previous = _on_sigterm_exit()
    try:
        service = service or open_home(settings, work)
        with service:
            ok = _simulate(settings, service, work, console)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if settings.workdir is None and ok:
            shutil.rmtree(work, ignore_errors=True)
        else:
            console.print(f"state and logs in {work}")
    return 0 if ok else 1


def ram_folder() -> Path | None:
    """Where a run's device state goes by default: the host's RAM (``/dev/shm``), if it has one.

    Every simulated device stands for a board with its own flash. Thousands of them
    on one host disk queue their fsyncs (outbox commits, install markers) behind
    each other, and the run then measures that disk rather than the rollout: on a
    2,000-device run here, the agents took 176 CPU-s and converged in 38 s with
    their state on disk, 107 CPU-s and 26 s in RAM. The agents still call fsync.
    """
    return _RAM if _RAM.is_dir() and os.access(_RAM, os.W_OK) else None


def _on_sigterm_exit() -> Any:
    """Make SIGTERM raise SystemExit(143) in the main thread; the previous handler, or None."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def terminated(_signum: int, _frame: object) -> None:
        # Once: a second SIGTERM during the unwinding would cut short the stopping of
        # the hub and workers (each bounded by its own timeout) and orphan them.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise SystemExit(128 + signal.SIGTERM)

    return signal.signal(signal.SIGTERM, terminated)


def _simulate(settings: SimSettings, service: FleetService, work: Path, console: Console) -> bool:
    publish_versions(service, work)
    plans = _plan_devices(settings)
    source = work / "source.npz"
    replay = synthetic_source(seed=settings.seed)
    with source.open("wb") as fh:
        np.savez(fh, x=replay.x, y=np.asarray(replay.y))
    claim = None if settings.insecure else write_claim(service, settings.devices, work)
    logs = work / "logs"
    hubs, workers, broker = Fleet(logs), Fleet(logs), Fleet(logs)
    deployed: dict[str, _Deployed] = {}
    connect_s: float | None = None
    soak: tuple[float, float] | None = None
    run: _Run | None = None
    try:
        endpoints = start_hubs(settings, service, hubs, broker, work)
        files = _start_workers(settings, plans, endpoints, work, source, claim, workers)
        run = _Run(settings, service, workers, files, console, hubs)
        with Live(console=console, refresh_per_second=4) as live:
            connect_s = _connect(run, live)
            if connect_s is not None:
                for i, version in enumerate(settings.deploy):
                    deployed[version] = _deploy(run, live, version, first=i == 0)
                if settings.soak_s:
                    soak = _soak(run, live, settings.soak_s)
    finally:
        _stop_workers(workers)
        final = run.statuses() if run is not None else []
        views = service.devices.list(LABELS)
        used = [u for p in hubs.procs.values() if (u := usage(p.pid)) is not None]
        hubs.stop_all()
        broker.stop_all()
        stop_strays()
        cleared = _clear_broker(settings, plans)
    summary = _summary(settings, service, final, views, connect_s, deployed)
    summary.hub_cpu_s = sum(u.cpu_s for u in used) if used else None
    summary.hub_peak_rss_mb = max(u.peak_rss_mb for u in used) if used else None
    summary.agents_cpu_s = sum(float(s.get("cpu_s", 0.0)) for s in final) or None
    summary.agents_heap_frozen = sum(int(s.get("gc_frozen", 0)) for s in final)
    summary.fetches = sum(int(s.get("fetches", 0)) for s in final)
    summary.fetch_busy = sum(int(s.get("fetch_busy", 0)) for s in final)
    if soak is not None:
        summary.soak_hub_cores, summary.soak_agents_cores = soak
    console.print(summary_table(summary))
    for line in outcome_lines(summary):
        console.print(line, soft_wrap=True, highlight=False, markup=False)
    if cleared:
        console.print(cleared, soft_wrap=True, highlight=False, markup=False)
    if settings.json_out is not None:
        write_json(summary, settings.json_out)
    return summary.ok


def _clear_broker(settings: SimSettings, plans: list[DevicePlan]) -> str:
    """Delete what the simulated devices left retained on a broker the run did not start.

    The hub publishes each device's desired state retained and each agent its status:
    on a broker of the user's (``--mqtt-url``) 10,000 devices left 20,000 messages a
    run for the broker to hold (and persist) until someone cleared them. Only the
    simulated devices' own topics are cleared, once the hub and the agents are gone.
    A broker the run started is stopped with what it held. Returns the line to print.
    """
    if settings.transport != "mqtt" or not settings.mqtt_url:
        return ""
    from cloud.mqtt_client import clear_device_topics  # noqa: PLC0415 - MQTT only

    devices = [p.device_id for p in plans]
    try:
        cleared = clear_device_topics(settings.mqtt_url, devices)
    except TransportError as exc:
        return f"retained messages of the simulated devices not cleared: {exc}"
    line = f"retained messages cleared: desired state and status of {len(devices)} devices"
    missed = 2 * len(devices) - cleared
    return f"{line} ({missed} topics not acknowledged in time)" if missed else line


def _soak(run: _Run, live: Live, seconds: float) -> tuple[float, float]:
    """Run on for ``seconds`` after the deployments; the cores the hub and the agents used.

    What an idle fleet costs: heartbeats, telemetry windows, inputs fed to the skills.
    """
    hub_before, agents_before = run.cpu_s()
    started = time.monotonic()
    run.watch(live, "soak", lambda _: False, seconds)
    took = time.monotonic() - started
    hub_after, agents_after = run.cpu_s()
    return (hub_after - hub_before) / took, (agents_after - agents_before) / took


def _stop_workers(workers: Fleet) -> None:
    """SIGTERM every worker at once, then wait: each writes its final status as it ends."""
    for proc in workers.procs.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for name in list(workers.procs):
        workers.stop(name, timeout_s=WORKER_STOP_S)


def _start_workers(
    settings: SimSettings,
    plans: list[DevicePlan],
    endpoints: HubEndpoints,
    work: Path,
    source: Path,
    claim: Path | None,
    workers: Fleet,
) -> list[Path]:
    files = []
    per = -(-len(plans) // settings.procs)
    for i in range(settings.procs):
        share = plans[i * per : (i + 1) * per]
        if not share:
            break
        spec = WorkerSpec(
            devices=share,
            hub_urls=endpoints.hub_urls,
            enroll_urls=endpoints.enroll_urls,
            first_index=i * per,
            state_root=work / "agents",
            status_file=work / f"worker-{i}.status.json",
            trusted_root=endpoints.trusted_root,
            source=source,
            labels=dict(LABELS),
            specs=dict(settings.versions),
            insecure=settings.insecure,
            hub_ca=None if settings.insecure else endpoints.ca,
            claim_token_file=claim,
            crash_rate=settings.crash_rate,
            disconnect_rate=settings.disconnect_rate,
            slow_link_ms=settings.slow_link_ms,
            rate_hz=settings.rate_hz,
            telemetry_window_s=settings.telemetry_window_s,
            metadata_refresh_s=settings.metadata_refresh_s,
            seed=settings.seed,
        )
        path = work / f"worker-{i}.json"
        path.write_text(spec.to_json(), encoding="utf-8")
        workers.spawn(f"worker-{i}", [sys.executable, "-m", "edgeskill.sim.worker", str(path)])
        files.append(spec.status_file)
    return files


def _connect(run: _Run, live: Live) -> float | None:
    """Wait until every agent is connected and registered with the hub; the seconds it took.

    Registered, not online: the hub's presence follows heartbeats, which a busy
    hub records late, so it lags behind connections in a large fleet.
    """
    n = run.settings.devices
    started = time.monotonic()
    if not run.watch(
        live,
        "connecting",
        lambda p: p.connected >= n and p.registered >= n,
        run.settings.connect_timeout_s,
    ):
        return None
    return time.monotonic() - started


#: Phases in which a staged rollout has ended.
ENDED_PHASES = ("completed", "aborted", "rolled_back")


def _deploy(run: _Run, live: Live, version: str, *, first: bool) -> _Deployed:
    """Deploy ``version`` to the fleet and wait until it has settled.

    The fleet's first deployment goes all at once: there is no running version
    for a canary's gates to compare with. Later ones follow ``--strategy`` and
    ``--plan``. Each device's time to active counts from its wave's opening to
    when the hub recorded the report of it running (see :func:`_seen_at`). The
    opening is the deployment when all at once; staged, it is the hub's record of
    when the rollout admitted the device, read once it has settled (a rolled-back
    rollout holds none: then the first look that found the hub's desired state for
    the device changed since the deployment, to the look that found it running).
    All at once, the deployment has settled when every device runs
    ``version`` or failed it; staged, when its rollout has ended and the fleet
    shows the end: every device on ``version`` (or failed it) when it completed,
    none on it and every device running again when it was rolled back or aborted.
    """
    kwargs = {} if first else _staged_options(run.settings)
    dep = run.service.deployments.create(SKILL, version, GROUP, **kwargs)
    staged = not first and (run.settings.strategy != "all-at-once" or bool(run.settings.plan))
    started, wall_started = time.monotonic(), time.time()
    cpu_before = run.cpu_s()
    active: dict[str, tuple[float, float]] = {}  # the look that found it running, the hub's
    opened: dict[str, float] = {}  # staged: when the device's wave was seen open
    generation = {v.device_id: v.desired_generation for v in run.views}
    ended: list[tuple[str, str]] = []
    peak = {"moved": 0, "failed": 0}  # a rollback puts both back to 0

    def done(progress: Progress) -> bool:
        now = time.monotonic() - started
        for view in run.views:
            if view.desired_generation > generation.get(view.device_id, 0):
                opened.setdefault(view.device_id, now)  # the hub wants something new of it
            state = view.skill(SKILL)
            if state is not None and (state.version, state.state) == (version, "running"):
                active.setdefault(view.device_id, (now, _seen_at(view, now, wall_started)))
        count = progress.counts.get(version, VersionCount())
        peak["failed"] = max(peak["failed"], count.failed)
        moved = count.running + count.failed >= len(run.views) > 0
        if not staged:
            return moved
        rollout = run.service.deployments.rollout(dep.id)  # the views are read already
        if rollout is None:
            return False
        peak["moved"] = max(peak["moved"], rollout.admitted)
        if rollout.phase not in ENDED_PHASES:
            return False
        reason = "" if rollout.reason == rollout.phase else rollout.reason
        ended[:] = [(rollout.phase, reason)]
        if rollout.phase == "completed":
            return moved
        return count.running == 0 and all(_running(v) for v in run.views)

    settled = run.watch(live, f"deploying {version}", done, run.settings.converge_timeout_s)
    hub_after, agents_after = run.cpu_s()
    hub_cpu, agents_cpu = hub_after - cpu_before[0], agents_after - cpu_before[1]
    outcome, reason = ended[0] if ended else ("completed" if settled else "", "")
    took = time.monotonic() - started
    admitted = run.service.deployments.admissions(dep.id) if staged else {}
    if admitted:  # the hub's records of each admission: look times are left aside
        opened = {d: max(0.0, at / 1000 - wall_started) for d, at in admitted.items()}
    found = {d: seen[0] if staged and not admitted else seen[1] for d, seen in active.items()}
    if staged:  # from the wave's opening; a device never seen admitted is left out
        waited = [t - opened[d] for d, t in found.items() if d in opened]
    else:
        waited = list(found.values())
    if settled and found and len(found) == len(run.views) and (admitted or not staged):
        took = max(found.values())  # the hub's record of the last device, not the look after
    return _Deployed(
        settled,
        took,
        sorted(waited),
        outcome,
        reason,
        peak["moved"] if staged else None,
        peak["failed"],
        hub_cpu,
        agents_cpu,
        waves_of(opened, found) if staged else [],
    )


def _seen_at(view: DeviceView, now: float, wall_started: float) -> float:
    """When the hub saw ``view`` run the version, in seconds from the deployment.

    The hub's record of the report (same machine, same clock) when it is earlier
    than this look: a look of a large fleet comes seconds apart, and would count
    every device that became active in between as active at the look.
    """
    if view.reported_ms is None:
        return now
    return min(now, max(0.0, view.reported_ms / 1000 - wall_started))


def _running(view: DeviceView) -> bool:
    state = view.skill(SKILL)
    return state is not None and state.state in ("running", "rolled_back") and bool(state.version)


def _summary(
    settings: SimSettings,
    service: FleetService,
    statuses: list[dict[str, Any]],
    views: list[DeviceView],
    connect_s: float | None,
    deployed: dict[str, _Deployed],
) -> RunSummary:
    kpis = merge_versions(statuses)
    counts = tally(views, SKILL)
    ids = {v.device_id for v in views}
    try:
        by_device = service.telemetry.inferences_by_device()
    except HubError:
        by_device = {}
    rows = []
    for version in SKILL_VERSIONS:
        k, c, d = kpis.get(version), counts.get(version, VersionCount()), deployed.get(version)
        if k is None and d is None and not c.running:
            continue
        rows.append(
            VersionSummary(
                version=version,
                devices_running=c.running,
                failed_installs=max(c.failed, d.failed_seen if d else 0),
                inferences=k.inferences if k else 0,
                errors=k.errors if k else 0,
                accuracy=k.correct / k.inferences if k and k.inferences else None,
                latency_p50_ms=percentile(k.latencies_ms, 50) if k else None,
                latency_p99_ms=percentile(k.latencies_ms, 99) if k else None,
                deployed=d is not None,
                converged=d is not None and d.converged,
                converge_s=d.converge_s if d else None,
                active_p50_s=percentile(d.active_s, 50) if d else None,
                active_p99_s=percentile(d.active_s, 99) if d else None,
                outcome=d.outcome if d else "",
                outcome_reason=d.reason if d else "",
                moved=d.moved if d else None,
                hub_cpu_s=d.hub_cpu_s if d else None,
                agents_cpu_s=d.agents_cpu_s if d else None,
                waves=d.waves if d else [],
            )
        )
    enrol = [t for s in statuses for t in s.get("enrol_s", [])]
    ok = connect_s is not None and all(d.converged for d in deployed.values())
    return RunSummary(
        transport=settings.transport,
        devices=settings.devices,
        started=sum(s["started"] for s in statuses),
        hubs=settings.hubs,
        procs=settings.procs,
        secure=not settings.insecure,
        connect_s=connect_s,
        enrol_p50_s=percentile(enrol, 50),
        enrol_p99_s=percentile(enrol, 99),
        disconnects=sum(s["disconnects"] for s in statuses),
        crashes=sum(s["crashes"] for s in statuses),
        device_inferences=sum(k.inferences for k in kpis.values()),
        hub_inferences=sum(n for d, n in by_device.items() if d in ids),
        versions=rows,
        ok=ok and len(deployed) == len(settings.deploy),
    )
