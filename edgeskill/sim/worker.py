"""One simulator worker process: a share of the fleet's agents on one event loop.

Started by :mod:`edgeskill.sim.run` as ``python -m edgeskill.sim.worker SPEC``
with a JSON spec (:class:`WorkerSpec`). Each device is a real agent from
:func:`edge_agent.wiring.build_agent`, enrolled with the run's claim token
unless the run is insecure, with the simulated launcher and the faulty
transport wrapped around its real one. The worker writes its counters to a
status file twice a second and once more, with latency samples, when it is
stopped (SIGTERM or SIGINT).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import random
import resource
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from edge_agent import eventloop
from edge_agent.agent import Agent
from edge_agent.config import AgentConfig
from edge_agent.errors import AgentError, TransportError
from edge_agent.profile import PROFILES, profile_for
from edge_agent.sandbox.launcher import SkillLauncher
from edge_agent.wiring import build_agent, ensure_identity, transport_factory
from edge_agent.workload import ReplaySource
from edgeskill.processes import settle_collector
from edgeskill.sim.faults import FaultCounters, faulty_factory
from edgeskill.sim.params import DevicePlan, VersionSpec
from edgeskill.sim.runtime import SimStats, SimulatedLauncher
from skills.errors import SkillError

__all__ = ["WorkerSpec", "agent_threads", "main", "run_worker"]

log = logging.getLogger(__name__)

#: Devices enrolling at once per worker (each makes a key and a TLS handshake).
ENROL_CONCURRENCY = 32
STATUS_INTERVAL_S = 0.5
_MAX_ERRORS = 5
#: Threads the agents of a worker share for their blocking steps (installs, outbox
#: commits, inventory scans). Few: the steps are short and mostly CPU, and each
#: thread more that wants the GIL at the same moment costs the process time in the
#: kernel handing it over, not progress. In a 1,000-device upgrade one worker's 64
#: threads spent 2.57 s in the kernel against 2.33 s in Python (futex waits were 96%
#: of their syscall time); 4 threads, 1.19 against 2.27. At 2,000 devices (4
#: workers, 200 in flight), 4 threads against 64 took the agents' upgrade CPU from
#: 24.6-26.5 to 19.2-20.6 s over MQTT and from 29.6-33.3 to 20.3-20.4 s over gRPC,
#: and convergence with it.
AGENT_THREADS = 4
#: With a slow link an install holds its thread through every delayed chunk of its
#: fetch (the TUF client waits there), so slow links get threads enough that those
#: waits do not hold up the other agents' short steps.
SLOW_LINK_THREADS = 64


def agent_threads(slow_link_ms: float) -> int:
    """How many threads a worker gives its agents' blocking steps (see :data:`AGENT_THREADS`)."""
    return SLOW_LINK_THREADS if slow_link_ms > 0 else AGENT_THREADS


@dataclass(frozen=True)
class WorkerSpec:
    """What one worker runs; written as JSON by the simulator, read here."""

    devices: list[DevicePlan]
    hub_urls: list[str]
    enroll_urls: list[str]
    first_index: int
    state_root: Path
    status_file: Path
    trusted_root: Path
    source: Path
    labels: dict[str, str]
    specs: dict[str, VersionSpec]
    insecure: bool = False
    hub_ca: Path | None = None
    claim_token_file: Path | None = None
    crash_rate: float = 0.0
    disconnect_rate: float = 0.0
    slow_link_ms: float = 0.0
    rate_hz: float = 2.0
    telemetry_window_s: float = 2.0
    metadata_refresh_s: float = 300.0
    seed: int = 0

    def to_json(self) -> str:
        """The spec as JSON text."""
        data = dataclasses.asdict(self)
        return json.dumps(data, default=str)

    @classmethod
    def from_json(cls, text: str) -> WorkerSpec:
        """Read a spec written by :meth:`to_json`."""
        data: dict[str, Any] = json.loads(text)
        data["devices"] = [
            DevicePlan(d["device_id"], d["board"], tuple(d["fail_versions"]))
            for d in data["devices"]
        ]
        data["specs"] = {v: VersionSpec(**s) for v, s in data["specs"].items()}
        for key in ("state_root", "status_file", "trusted_root", "source"):
            data[key] = Path(data[key])
        for key in ("hub_ca", "claim_token_file"):
            data[key] = Path(data[key]) if data[key] else None
        return cls(**data)


@dataclass
class _Worker:
    spec: WorkerSpec
    stats: SimStats = field(default_factory=SimStats)
    faults: FaultCounters = field(default_factory=FaultCounters)
    agents: list[Agent] = field(default_factory=list)
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    enrol_s: list[float] = field(default_factory=list)
    #: The inputs, read once and shared by every agent of the worker.
    source: ReplaySource | None = None
    #: Objects moved out of the collector's sight once the fleet was up (0: not yet).
    #: Counted once: ``gc.get_freeze_count`` walks them all, a million and more.
    frozen: int = 0

    def status(self, *, final: bool = False) -> dict[str, Any]:
        snapshot = self.stats.snapshot(latencies=final)
        return {
            "pid": os.getpid(),
            "devices": len(self.spec.devices),
            "started": len(self.agents),
            "failed_to_start": self.failed,
            "errors": self.errors,
            "connected": self.faults.connected,
            "sessions": self.faults.sessions,
            "disconnects": self.faults.disconnects,
            "fetches": self.faults.fetches,
            "fetch_busy": self.faults.fetch_busy,
            "enrol_s": sorted(self.enrol_s) if final else [],
            "cpu_s": time.process_time(),  # every thread of this worker: its agents' cost
            "gc_frozen": self.frozen,
            "final": final,
            **snapshot,
        }

    def write_status(self, *, final: bool = False) -> None:
        path = self.spec.status_file
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.status(final=final)), encoding="utf-8")
        tmp.replace(path)


def _config(spec: WorkerSpec, index: int, device: DevicePlan, token: str | None) -> AgentConfig:
    hubs = len(spec.hub_urls)
    hub = (spec.first_index + index) % hubs
    return AgentConfig(
        hub_url=spec.hub_urls[hub],
        device_id=device.device_id,
        state_dir=spec.state_root / device.device_id,
        labels=spec.labels,
        trusted_root=spec.trusted_root,
        source=spec.source,
        source_loop=True,
        source_rate_hz=spec.rate_hz,
        telemetry_window_s=spec.telemetry_window_s,
        metadata_refresh_s=spec.metadata_refresh_s,
        insecure=spec.insecure,
        tls_ca=None if spec.insecure else spec.hub_ca,
        claim_token=token,
        enroll_url=None if spec.insecure else spec.enroll_urls[hub],
    )


async def _start_one(
    worker: _Worker, index: int, device: DevicePlan, token: str | None, stop: asyncio.Event
) -> asyncio.Task[None] | None:
    spec = worker.spec
    config = _config(spec, index, device, token)
    try:
        if not spec.insecure:
            started = time.monotonic()
            identity = await ensure_identity(config)
            worker.enrol_s.append(time.monotonic() - started)
            if identity is not None:
                config = dataclasses.replace(
                    config,
                    tls_ca=identity.ca,
                    tls_cert=identity.cert,
                    tls_key=identity.key,
                    director_key=identity.director,
                )
        launcher = SimulatedLauncher(
            device.device_id,
            device.board,
            spec.specs,
            frozenset(device.fail_versions),
            worker.stats,
            crash_rate=spec.crash_rate,
            seed=spec.seed,
        )
        board = PROFILES[device.board]
        profile = profile_for(device.board, board.targets, cpu_count=1, memory_bytes=1 << 30)
        rng = random.Random(f"{spec.seed}:{device.device_id}:link")
        transports = faulty_factory(
            transport_factory(config),
            worker.faults,
            rng,
            disconnect_rate=spec.disconnect_rate,
            slow_link_ms=spec.slow_link_ms,
        )
        # The simulated process has the shape of a SkillProcess, not its type.
        as_launcher = cast("SkillLauncher", launcher)
        agent = await asyncio.to_thread(
            build_agent,
            config,
            profile,
            launcher=as_launcher,
            transports=transports,
            source=worker.source,
        )
    except (AgentError, SkillError, TransportError) as exc:
        worker.failed += 1
        if len(worker.errors) < _MAX_ERRORS:
            worker.errors.append(f"{device.device_id}: {exc}")
        log.warning("device %s did not start: %s", device.device_id, exc)
        return None
    worker.agents.append(agent)
    return asyncio.create_task(agent.run(stop), name=device.device_id)


async def run_worker(spec: WorkerSpec, stop: asyncio.Event) -> None:
    """Enrol (unless insecure), build and run every agent of ``spec`` until ``stop``."""
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(max_workers=agent_threads(spec.slow_link_ms)))
    token = None
    if spec.claim_token_file is not None:
        token = spec.claim_token_file.read_text(encoding="utf-8").strip()
    # Read once: thousands of agents each reading it on worker threads cost memory, and
    # numpy's header parse is not safe to run on many threads at once on Python 3.11.
    worker = _Worker(spec, source=ReplaySource.load(spec.source))
    gate = asyncio.Semaphore(ENROL_CONCURRENCY)

    async def start(index: int, device: DevicePlan) -> asyncio.Task[None] | None:
        async with gate:
            return await _start_one(worker, index, device, token, stop)

    reporter = asyncio.create_task(_report(worker, stop))
    starts = [asyncio.create_task(start(i, d)) for i, d in enumerate(spec.devices)]
    runs = [t for t in await asyncio.gather(*starts) if t is not None]
    await stop.wait()
    results = await asyncio.gather(*runs, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            log.error("an agent ended with %r", result)
    reporter.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await reporter
    worker.write_status(final=True)


def _all_connected(worker: _Worker) -> bool:
    started = len(worker.spec.devices) - worker.failed
    return len(worker.agents) == started > 0 and worker.faults.connected >= started


#: Container allocations between young collections once the fleet is up (Python's: 700).
YOUNG_GC_THRESHOLD = 100_000


def _freeze_heap() -> int:
    """Move every object alive now out of the collector's sight; how many were moved.

    A worker holds a thousand agents or more: some 600,000 long-lived objects
    (sessions, clients, TUF metadata, outboxes) that each full collection would
    walk again, at about half a second each, three times in a 2,000-device
    upgrade. Frozen once the fleet is up, they are left alone. What is made later
    is collected less often than by Python's default: in that upgrade, about 300
    young, 28 middle and 3 full collections a worker took a fifth of its time;
    with ``YOUNG_GC_THRESHOLD`` it was one young collection. A real device runs
    one agent to a process and keeps Python's default.
    """
    return settle_collector(YOUNG_GC_THRESHOLD)


async def _report(worker: _Worker, stop: asyncio.Event) -> None:
    while not stop.is_set():
        if not worker.frozen and _all_connected(worker):
            worker.frozen = _freeze_heap()
        await asyncio.to_thread(worker.write_status)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STATUS_INTERVAL_S):
                await stop.wait()


def main(argv: list[str] | None = None) -> int:
    """Run the worker whose spec file is the one argument; returns the exit status."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m edgeskill.sim.worker SPEC.json", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    spec = WorkerSpec.from_json(Path(args[0]).read_text(encoding="utf-8"))
    # Each agent holds a few descriptors (params.FDS_PER_AGENT): take all we may.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await run_worker(spec, stop)

    eventloop.run(runner())
    return 0


if __name__ == "__main__":
    sys.exit(main())
