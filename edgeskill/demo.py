"""``edgeskill demo``: a hub and three agents, end to end, on the embedded defaults.

Trains the digits model, builds and signs the ``digits`` skill, deploys it to
the group ``kind=camera``; the two cameras install it and classify a held-out
stream, the gateway gets nothing. Each component is a separate process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from cloud.factory import (
    LIBRARY,
    build_skill,
    quantized_variants,
    train_digits_onnx,
    write_holdout,
)
from cloud.hub import Hub
from protos.envelope import now_ms

# (device, labels, board): boards come from the agent's profile table, so the two
# cameras pick different model variants from the same bundle (see `variant`).
DEVICES = [
    ("cam-1", ["kind=camera"], "x86-cpu"),
    ("cam-2", ["kind=camera"], "arm-cpu"),
    ("gw-1", ["kind=gateway"], "x86-cpu"),
]


def free_port() -> int:
    """A TCP port free on the loopback interface right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, timeout_s: float = 30.0) -> None:
    """Block until something listens on ``port``.

    Raises:
        TimeoutError: nothing listened in time.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on port {port}")


@dataclass
class Fleet:
    """Child processes of the demo (or a test), stopped together."""

    logs: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        """Start ``edgeskill ARGS`` as a child named ``name``, logging to a file."""
        self.logs.mkdir(parents=True, exist_ok=True)
        with (self.logs / f"{name}.log").open("ab") as log:
            env = {**os.environ, "GRPC_VERBOSITY": "ERROR", "PYTHONUNBUFFERED": "1"}
            proc = subprocess.Popen(
                [sys.executable, "-m", "edgeskill.cli", *args], stdout=log, stderr=log, env=env
            )
        self.procs[name] = proc
        return proc

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout_s: float = 10.0) -> None:
        """Stop one child: ``sig`` first, SIGKILL after ``timeout_s``."""
        proc = self.procs.pop(name)
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def stop_all(self) -> None:
        """Stop every child."""
        for name in list(self.procs):
            self.stop(name)


def agent_args(
    hub_url: str,
    device_id: str,
    labels: list[str],
    state: Path,
    root: Path,
    source: Path | None,
    board: str | None = None,
) -> list[str]:
    """Command-line arguments of ``edgeskill agent run`` for one device."""
    args = ["agent", "run", "--hub", hub_url, "--device-id", device_id, "--state-dir", str(state)]
    args += ["--trusted-root", str(root), "--telemetry-window", "1"]
    for label in labels:
        args += ["--label", label]
    if source is not None:
        args += ["--source", str(source)]
    if board is not None:
        args += ["--board", board]
    return args


def wait_until(
    check: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.25
) -> None:
    """Poll ``check`` until it holds.

    Raises:
        TimeoutError: it did not hold within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(interval_s)
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")


@contextlib.contextmanager
def _workdir(path: Path | None) -> Iterator[Path]:
    if path is not None:
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="edgeskill-demo-") as tmp:
        yield Path(tmp)


def run_demo(
    console: Console, *, keep: bool = False, transport: str = "grpc", workdir: Path | None = None
) -> int:
    """Run the demo; returns the exit status."""
    if keep and workdir is None:
        workdir = Path(tempfile.mkdtemp(prefix="edgeskill-demo-"))
    with _workdir(workdir) as work:
        status = _demo(console, work, keep=keep, transport=transport)
        if workdir is not None:
            console.print(f"state and logs in {work}")
        return status


def _demo(console: Console, work: Path, *, keep: bool, transport: str) -> int:
    started = time.monotonic()
    hub = Hub.init(work / "hub", grpc_bind=f"127.0.0.1:{free_port()}")
    trained = train_digits_onnx(work / "models" / "digits.onnx", console=console)
    console.print(
        f"trained digits CNN: test accuracy {trained.accuracy:.3f}, "
        f"ONNX matches torch to {trained.max_diff:.1e}"
    )
    variants = quantized_variants(trained, work / "models")
    bundle = build_skill(LIBRARY / "digits", "1.0.0", variants, work / "dist")
    rec = hub.push(bundle)
    console.print(f"built and signed {rec.target_name} ({rec.size} bytes)")
    holdout = work / "holdout.npz"
    count = write_holdout(trained.data, holdout)
    fleet = Fleet(work / "logs")
    hub_url = ""
    try:
        hub_url = _start_hub(fleet, hub, work, transport)
        root = work / "hub" / "trust" / "metadata" / "root.json"
        for device_id, labels, board in DEVICES:
            state = work / "agents" / device_id
            fleet.start(
                device_id, agent_args(hub_url, device_id, labels, state, root, holdout, board)
            )
        wait_until(
            lambda: len(hub.store.list_devices()) == len(DEVICES), 60, "three agents to register"
        )
        hub.store.create_group("cameras", "kind=camera")
        hub.store.create_deployment("digits", "1.0.0", "cameras", now_ms=now_ms())
        console.print("deployed digits 1.0.0 to group cameras (kind=camera)")
        _wait_for_inferences(console, hub, ["cam-1", "cam-2"], count)
        ok = _print_table(console, hub, count)
        console.print(f"demo finished in {time.monotonic() - started:.1f} s")
        if keep:
            console.print(f"--keep: hub at {hub_url}, agents running; logs in {work / 'logs'}")
            fleet.procs.clear()
        return 0 if ok else 1
    except TimeoutError as exc:
        console.print(f"[red]demo failed:[/] {exc}; logs in {work / 'logs'}")
        return 1
    finally:
        kept = bool(keep and not fleet.procs)
        fleet.stop_all()
        hub.close()
        if hub_url.startswith("mqtt") and not kept:
            _forget_retained(hub_url)


def _start_hub(fleet: Fleet, hub: Hub, work: Path, transport: str) -> str:
    """Start the hub process; returns the URL agents connect to."""
    port = int(hub.config.grpc_bind.rsplit(":", 1)[1])
    args = ["hub", "serve", "--home", str(work / "hub")]
    url = f"grpc://127.0.0.1:{port}"
    if transport == "mqtt":
        # A topic prefix of its own keeps this demo apart from anything else on the broker.
        broker = os.environ.get("EDGESKILL_DEMO_BROKER", "127.0.0.1:1883")
        url = f"mqtt://{broker}/edgeskill-demo/{uuid.uuid4().hex[:8]}?session_expiry=600"
        args += ["--mqtt", url]
    elif transport != "grpc":
        raise ValueError(f"unknown transport {transport!r}; use grpc or mqtt")
    fleet.start("hub", args)
    wait_for_port(port)  # the hub subscribes on the broker before it opens this port
    return url


def _forget_retained(url: str) -> None:
    """Remove the demo's retained presence and desired state from the broker."""
    from cloud.errors import TransportError  # noqa: PLC0415
    from cloud.mqtt_client import clear_retained  # noqa: PLC0415 - only for MQTT demos

    with contextlib.suppress(TransportError):
        clear_retained(url)


def _wait_for_inferences(console: Console, hub: Hub, devices: list[str], count: int) -> None:
    def done() -> int:
        totals = {s.device_id: s.inferences for s in hub.store.telemetry_summary()}
        return sum(min(totals.get(d, 0), count) for d in devices)

    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(
            "cameras classifying the held-out stream", total=count * len(devices)
        )
        deadline = time.monotonic() + 90
        while (n := done()) < count * len(devices):
            progress.update(task, completed=n)
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"only {n} of {count * len(devices)} inferences reported in 90 s"
                )
            time.sleep(0.25)


def _print_table(console: Console, hub: Hub, count: int) -> bool:
    summary = {s.device_id: s for s in hub.store.telemetry_summary()}
    table = Table(
        "device",
        "labels",
        "skill",
        "version",
        "state",
        "inferences",
        "accuracy",
        "p50 latency",
        "board",
        "variant",
        title="EdgeSkill demo",
    )
    ok = True
    for device_id, labels, board in DEVICES:
        rep = hub.store.reported_for(device_id)
        skill = rep.skills[0] if rep and rep.skills else None
        s = summary.get(device_id)
        expected = "kind=camera" in labels
        ok &= (
            (s is not None and s.inferences >= count) if expected else (s is None and skill is None)
        )
        table.add_row(
            device_id,
            ",".join(labels),
            skill.name if skill else "-",
            skill.version if skill else "-",
            skill.state if skill else "-",
            str(s.inferences) if s else "0",
            f"{s.accuracy:.3f}" if s and s.labelled else "-",
            f"{s.latency_p50_ms:.2f} ms" if s else "-",
            board,
            _short_variant(skill.variant) if skill else "-",
        )
    console.print(table)
    return ok


def _short_variant(variant: str) -> str:
    # "classifier=onnx-cpu/int8 on onnxruntime/CPUExecutionProvider" -> "onnx-cpu/int8"
    return variant.split("=", 1)[-1].split(" on ", 1)[0] if variant else "-"
