"""``edgeskill demo --split``: the cut of a split model following an emulated link.

One hub process and one agent process, as in ``edgeskill demo`` (authenticated,
gRPC with mutual TLS, embedded defaults, no broker), except that the agent's
hub URL points at a :class:`~edgeskill.linkemu.LinkEmulator`: a user-space TCP
shaping proxy in this process (the kernel here has no netem; ``tc`` is not used).

The hub builds the built-in ``imagenet`` skill (EfficientNet-Lite0 cut into
segments, :mod:`cloud.models.imagenet_skill`), signs and deploys it with
``split.device_slowdown`` set, so the device is emulated as that many times
slower than this machine (the control process sleeps for the extra time after
each segment). The agent classifies scikit-image's sample photos continuously;
the demo switches the emulated link through its phases and prints, per phase,
the cut the agent chose, the paths its ``ctx.infer`` calls took and their
median latency, all from the telemetry the agent sent the hub.

:class:`SplitRig` (the hub, the link and the agent) is also what the split
end-to-end tests run.
"""

from __future__ import annotations

import contextlib
import signal
import statistics
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from rich.console import Console
from rich.table import Table

from cloud.errors import HubError
from cloud.service import FleetService
from edgeskill.linkemu import LinkEmulator, Shape, emulate_in_thread
from edgeskill.processes import Fleet, agent_args, free_port, wait_for_port, wait_until

if TYPE_CHECKING:
    from cloud.models.imagenet_skill import ImagenetBuild
    from cloud.service import TelemetryWindowView

__all__ = [
    "DEFAULT_PHASES",
    "DEVICE_ID",
    "SKILL",
    "LinkPhase",
    "PhaseStats",
    "SplitRig",
    "phase_stats",
    "run_split_demo",
    "split_rig",
    "write_photo_source",
]

DEVICE_ID = "cam-1"
SKILL = "imagenet"
GROUP = "cameras"
#: How many times slower than this machine the emulated device is.
DEFAULT_SLOWDOWN = 8.0
_METRIC_PREFIX = "split.classifier."
_PATHS = ("split", "hub", "device")


@dataclass(frozen=True)
class LinkPhase:
    """One setting of the emulated link, and how long the demo keeps it.

    Attributes:
        bits_per_s: The rate each way.
        rtt_ms: The round trip: each direction is delayed by half of it.
        seconds: How long the phase lasts.
    """

    bits_per_s: float
    rtt_ms: float
    seconds: float = 12.0

    def shape(self) -> Shape:
        """The emulator's shape of one direction."""
        return Shape(rate_bps=self.bits_per_s / 8, delay_ms=self.rtt_ms / 2)

    def describe(self) -> str:
        """``1 Gbit/s, 1 ms RTT``."""
        for unit, size in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
            if self.bits_per_s >= size:
                return f"{self.bits_per_s / size:g} {unit}, {self.rtt_ms:g} ms RTT"
        return f"{self.bits_per_s:g} bit/s, {self.rtt_ms:g} ms RTT"


DEFAULT_PHASES = (
    LinkPhase(1e9, 1.0),
    LinkPhase(1e6, 100.0),
    LinkPhase(1e9, 1.0),
)


@dataclass(frozen=True)
class PhaseStats:
    """What the agent reported during one phase.

    Attributes:
        phase: The link.
        items: Items classified.
        paths: ``ctx.infer`` calls by path (``split``, ``hub``, ``device``).
        fallbacks: Calls the device finished after the hub failed.
        cuts: The agent's cut at the end of each telemetry window, in order.
        latency_ms: The median of the windows' median item latency.
    """

    phase: LinkPhase
    items: int
    paths: dict[str, int]
    fallbacks: int
    cuts: list[str]
    latency_ms: float

    @property
    def final_cut(self) -> str:
        """The cut the agent had chosen when the phase ended (``-`` without telemetry)."""
        return self.cuts[-1] if self.cuts else "-"

    def cut_changes(self) -> str:
        """The cuts in the order they were chosen: ``device -> input``."""
        seen: list[str] = []
        for cut in self.cuts:
            if not seen or seen[-1] != cut:
                seen.append(cut)
        return " -> ".join(seen) or "-"


def phase_stats(
    windows: Sequence[TelemetryWindowView],
    phase: LinkPhase,
    start_ms: int,
    end_ms: int,
    cut_names: Sequence[str],
) -> PhaseStats:
    """Sum the telemetry windows whose middle falls in ``[start_ms, end_ms)``.

    Args:
        windows: The agent's windows of the skill, oldest first.
        phase: The link during the phase.
        start_ms: When the phase began (wall clock, ms).
        end_ms: When it ended.
        cut_names: The cut names by the agent's cut index (hub-only first, device last).
    """
    chosen = [w for w in windows if start_ms <= (w.window_start_ms + w.window_end_ms) // 2 < end_ms]
    paths = dict.fromkeys(_PATHS, 0)
    cuts: list[str] = []
    for w in chosen:
        for path in paths:
            paths[path] += int(w.metrics.get(f"split.path.{path}", 0))
        index = w.metrics.get(f"{_METRIC_PREFIX}cut_index")
        if index is not None and 0 <= int(index) < len(cut_names):
            cuts.append(cut_names[int(index)])
    latencies = [w.latency_p50_ms for w in chosen if w.inferences]
    return PhaseStats(
        phase=phase,
        items=sum(w.inferences for w in chosen),
        paths=paths,
        fallbacks=sum(int(w.metrics.get("split.fallbacks", 0)) for w in chosen),
        cuts=cuts,
        latency_ms=statistics.median(latencies) if latencies else float("nan"),
    )


def write_photo_source(path: Path) -> int:
    """Write scikit-image's sample photos, preprocessed, as an agent replay file.

    Returns:
        How many photos it holds.

    Raises:
        ConversionError: scikit-image is not installed.
        OSError: The file cannot be written.
    """
    from converters.efficientnet import sample_photos  # noqa: PLC0415 - torch

    photos, _ = sample_photos(augment=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, x=photos[:, None])  # one [1, 3, 224, 224] input per item
    return len(photos)


@dataclass
class SplitRig:
    """A hub process, a link emulator in front of it and one agent process.

    Attributes:
        work: The folder of their state and logs.
        service: The fleet service on the hub's home (this process).
        fleet: The child processes: ``hub`` and the agent.
        build: The ``imagenet`` bundle the hub published.
        link: The emulator the agent reaches the hub through.
        hub_port: The hub's own gRPC port, behind the emulator.
    """

    work: Path
    service: FleetService
    fleet: Fleet
    build: ImagenetBuild
    link: LinkEmulator
    hub_port: int
    cut_names: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        """Name the agent's cut indices: the plan's cuts in order, then ``device``."""
        ordered = sorted(self.build.plan.cuts, key=lambda c: c.after)
        self.cut_names = [c.name for c in ordered] + ["device"]

    def start_hub(self) -> None:
        """Start (or restart) the hub process on its port.

        Raises:
            TimeoutError: It did not listen in time.
            OSError: It could not be started.
        """
        proc = self.fleet.start("hub", ["hub", "serve", "--home", str(self.service.home)])
        wait_for_port(self.hub_port, proc=proc)

    def stop_hub(self, sig: int = signal.SIGTERM) -> None:
        """Stop the hub process with ``sig`` (SIGKILL after 10 s)."""
        self.fleet.stop("hub", sig)

    def set_link(self, phase: LinkPhase) -> None:
        """Shape both directions of the link as ``phase`` says."""
        self.link.set_shape(up=phase.shape(), down=phase.shape())

    def windows(self) -> list[TelemetryWindowView]:
        """The agent's telemetry windows of the skill that reached the hub, oldest first.

        Raises:
            HubError: The store failed.
        """
        return self.service.telemetry.windows(DEVICE_ID, SKILL)


@contextlib.contextmanager
def split_rig(
    work: Path,
    *,
    first: LinkPhase,
    source: Path,
    loop: bool = True,
    rate_hz: float = 10.0,
    config: Mapping[str, str] | None = None,
    cache_dir: Path | None = None,
) -> Iterator[SplitRig]:
    """Build and publish ``imagenet``, start the hub, the link and the agent, and deploy.

    Yields once the deployment is created (the agent may still be installing).

    Args:
        work: An empty folder for the state and logs.
        first: The link's shape at the start.
        source: The agent's replay file.
        loop: Replay it forever.
        rate_hz: Items per second the agent feeds.
        config: The deployment's skill configuration.
        cache_dir: Where the exported model is kept between runs.

    Raises:
        HubError: The hub home, the bundle or the deployment failed.
        TimeoutError: The hub or the agent did not come up in time.
        OSError: A process could not be started.
    """
    from cloud.models.imagenet_skill import build_imagenet_skill  # noqa: PLC0415 - torch

    hub_port = free_port()
    service = FleetService.init(work / "hub", grpc_bind=f"127.0.0.1:{hub_port}")
    fleet = Fleet(work / "logs")
    try:
        build = build_imagenet_skill(work / "dist", cache_dir=cache_dir)
        service.skills.publish(build.bundle)
        with emulate_in_thread(
            ("127.0.0.1", hub_port), up=first.shape(), down=first.shape()
        ) as link:
            rig = SplitRig(work, service, fleet, build, link, hub_port)
            rig.start_hub()
            _start_agent(rig, source, loop=loop, rate_hz=rate_hz)
            wait_until(lambda: _online(service), 60, "the agent to connect")
            service.groups.create(GROUP, "kind=camera")
            service.deployments.create(SKILL, build.version, GROUP, config=dict(config or {}))
            yield rig
            # The agent first, while its hub is still there to take its goodbye.
            if DEVICE_ID in fleet.procs:
                fleet.stop(DEVICE_ID)
    finally:
        fleet.stop_all()
        service.close()


def _start_agent(rig: SplitRig, source: Path, *, loop: bool, rate_hz: float) -> None:
    service = rig.service
    labels = ["kind=camera"]
    url = f"grpcs://127.0.0.1:{rig.link.port}"
    args = agent_args(
        url, DEVICE_ID, labels, rig.work / "agent", service.trusted_root, source, "x86-cpu"
    )
    args += ["--source-rate", f"{rate_hz:g}"] + (["--source-loop"] if loop else [])
    token = service.identity.create_claim({"kind": "camera"}, uses=1, ttl_s=600)
    args += ["--claim-token", token, "--hub-ca", str(service.home / "pki" / "ca.crt")]
    args += ["--enroll-url", f"grpcs://{service.config.enroll_bind}"]
    rig.fleet.start(DEVICE_ID, args)


def _online(service: FleetService) -> bool:
    return any(d.online for d in service.devices.list() if d.device_id == DEVICE_ID)


def run_split_demo(
    console: Console,
    *,
    workdir: Path | None = None,
    phases: Sequence[LinkPhase] = DEFAULT_PHASES,
    slowdown: float = DEFAULT_SLOWDOWN,
    cache_dir: Path | None = None,
) -> int:
    """Run the split demo; returns the exit status (0 when every phase classified photos).

    Raises:
        ValueError: No phases, or a slowdown below 1.
    """
    if not phases or slowdown < 1:
        raise ValueError("the split demo needs at least one phase and a slowdown >= 1")
    with contextlib.ExitStack() as stack:
        if workdir is None:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="edgeskill-split-"))
            work = Path(tmp)
        else:
            work = workdir
            work.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        try:
            status = _demo(console, work, phases, slowdown, cache_dir)
        except (TimeoutError, HubError, OSError) as exc:
            console.print(f"[red]split demo failed:[/] {exc}; logs in {work / 'logs'}")
            return 1
        console.print(f"split demo finished in {time.monotonic() - started:.1f} s")
        if workdir is not None:
            console.print(f"state and logs in {work}")
        return status


def _demo(
    console: Console,
    work: Path,
    phases: Sequence[LinkPhase],
    slowdown: float,
    cache_dir: Path | None,
) -> int:
    source = work / "photos.npz"
    config = {"split.device_slowdown": f"{slowdown:g}"}
    with contextlib.ExitStack() as stack:
        with console.status("exporting and cutting EfficientNet-Lite0; starting hub and agent"):
            count = write_photo_source(source)
            rig = stack.enter_context(
                split_rig(work, first=phases[0], source=source, config=config, cache_dir=cache_dir)
            )
        console.print(
            f"hub (pid {rig.fleet.procs['hub'].pid}) and agent {DEVICE_ID} "
            f"(pid {rig.fleet.procs[DEVICE_ID].pid}, {slowdown:g}x slower device, emulated by "
            f"sleeping) through a user-space link emulator; {count} photos on a loop"
        )
        console.print("cuts: " + ", ".join(rig.cut_names))
        wait_until(lambda: bool(rig.windows()), 90, "the first classifications")
        spans = _run_phases(console, rig, phases)
        last_end = spans[-1][1]
        wait_until(
            lambda: any(w.window_end_ms >= last_end for w in rig.windows()),
            20,
            "the last phase's telemetry",
        )
        windows = rig.windows()
        stats = [
            phase_stats(windows, phase, start, end, rig.cut_names)
            for phase, (start, end) in zip(phases, spans, strict=True)
        ]
    console.print(_table(stats, slowdown))
    moved = len({s.final_cut for s in stats}) > 1
    console.print("the cut moved with the link" if moved else "[yellow]the cut did not move[/]")
    return 0 if all(s.items for s in stats) else 1


def _run_phases(
    console: Console, rig: SplitRig, phases: Sequence[LinkPhase]
) -> list[tuple[int, int]]:
    """Hold each link for its phase; returns each phase's (start, end), wall-clock ms."""
    spans = []
    for number, phase in enumerate(phases, 1):
        rig.set_link(phase)
        start = time.time_ns() // 1_000_000
        with console.status(f"phase {number}/{len(phases)}: {phase.describe()}"):
            time.sleep(phase.seconds)
        end = time.time_ns() // 1_000_000
        spans.append((start, end))
        now = phase_stats(rig.windows(), phase, start, end, rig.cut_names)
        console.print(
            f"phase {number} ({phase.describe()}): cut {now.cut_changes()}, "
            f"{now.items} items so far"
        )
    return spans


def _table(stats: Sequence[PhaseStats], slowdown: float) -> Table:
    table = Table(
        "phase",
        "link",
        "cut chosen",
        "cuts over the phase",
        "split",
        "hub",
        "device",
        "fallbacks",
        "items",
        "median latency",
        title=f"Split inference: EfficientNet-Lite0, device {slowdown:g}x slower than the hub",
    )
    for number, s in enumerate(stats, 1):
        table.add_row(
            str(number),
            s.phase.describe(),
            s.final_cut,
            s.cut_changes(),
            str(s.paths["split"]),
            str(s.paths["hub"]),
            str(s.paths["device"]),
            str(s.fallbacks),
            str(s.items),
            f"{s.latency_ms:.1f} ms" if s.items else "-",
        )
    return table
