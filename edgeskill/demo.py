"""``edgeskill demo``: a hub and three agents, end to end, on the embedded defaults.

Goes through the fleet service and the real model factory: the built-in digits
data set, a training job, the model, its INT8 variant and their onnx-cpu
conversions, then the ``digits`` skill built from those artefacts (so
``edgeskill model show`` shows its lineage), signed, and deployed to the group
``kind=camera``; the two cameras install it and classify a held-out stream,
the gateway gets nothing. Each component is a separate process.

It runs authenticated, as the quick start does: each agent enrols on its first
start with a claim token the demo makes for its labels (the hub, not the agent,
decides a device's labels), over the hub's gRPC enrolment port. Over gRPC the
hub then serves mutual TLS. Over MQTT (``--transport mqtt``) the demo starts a
Mosquitto of its own on a free loopback port with the config the project
generates (TLS trusting only the hub's CA, client certificates as user names,
the hub's revocation list, the per-device ACL; see :mod:`cloud.broker`); the
hub and the agents connect with their certificates, and the broker is stopped
with the rest.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
import time
from collections.abc import Iterator
from contextlib import redirect_stdout
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from cloud.errors import HubError
from cloud.service import FleetService
from edgeskill._common import write_holdout_stream
from edgeskill.processes import (
    Fleet,
    agent_args,
    find_program,
    free_port,
    wait_for_port,
    wait_until,
)

LIBRARY = Path(__file__).resolve().parents[1] / "skills" / "library"

# (device, labels, board): boards come from the agent's profile table, so the two
# cameras pick different model variants from the same bundle (see `variant`).
DEVICES = [
    ("cam-1", ["kind=camera"], "x86-cpu"),
    ("cam-2", ["kind=camera"], "arm-cpu"),
    ("gw-1", ["kind=gateway"], "x86-cpu"),
]
#: The demo's broker is its own, so the default topic prefix cannot meet anyone else's.
MQTT_PREFIX = "edgeskill/v1"
MQTT_OPTIONS = "session_expiry=600"


@contextlib.contextmanager
def _workdir(path: Path | None, prefix: str = "edgeskill-demo-") -> Iterator[Path]:
    """``path`` (made if missing), or a temporary folder removed afterwards."""
    if path is not None:
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        yield Path(tmp)


def run_demo(
    console: Console, *, keep: bool = False, transport: str = "grpc", workdir: Path | None = None
) -> int:
    """Run the demo; returns the exit status.

    Raises:
        ValueError: ``transport`` is neither ``grpc`` nor ``mqtt``.
    """
    if keep and workdir is None:
        workdir = Path(tempfile.mkdtemp(prefix="edgeskill-demo-"))
    with _workdir(workdir) as work:
        status = _demo(console, work, keep=keep, transport=transport)
        if workdir is not None:
            console.print(f"state and logs in {work}")
        return status


def _demo(console: Console, work: Path, *, keep: bool, transport: str) -> int:
    if transport not in ("grpc", "mqtt"):
        raise ValueError(f"unknown transport {transport!r}; use grpc or mqtt")
    started = time.monotonic()
    service = FleetService.init(work / "hub", grpc_bind=f"127.0.0.1:{free_port()}")
    fleet = Fleet(work / "logs")
    broker = Fleet(work / "logs")  # stopped after the hub and the agents, its clients
    hub_url = ""
    console_port = free_port()
    console_args = ("--console-bind", f"127.0.0.1:{console_port}")
    try:
        holdout, count = _build_and_publish(console, service, work)
        if transport == "mqtt":
            hub_url = _start_hub_mqtt(console, fleet, broker, service, work, *console_args)
        else:
            hub_url = _start_hub(fleet, service, work, *console_args)
        _print_console(console, service, console_port)
        for device_id, labels, board in DEVICES:
            state = work / "agents" / device_id
            args = agent_args(
                hub_url, device_id, labels, state, service.trusted_root, holdout, board
            )
            fleet.start(device_id, args + _identity_args(service, labels))
        wait_until(
            lambda: sum(d.online for d in service.devices.list()) == len(DEVICES),
            60,
            "three agents to connect",
        )
        service.groups.create("cameras", "kind=camera")
        service.deployments.create("digits", "1.0.0", "cameras")
        console.print("deployed digits 1.0.0 to group cameras (kind=camera)")
        _wait_for_inferences(console, service, ["cam-1", "cam-2"], count)
        ok = _print_table(console, service, count)
        console.print(f"demo finished in {time.monotonic() - started:.1f} s")
        if keep:
            _keep_running(console, work, hub_url, fleet, broker)
        return 0 if ok else 1
    except (TimeoutError, HubError, OSError) as exc:
        console.print(f"[red]demo failed:[/] {exc}; logs in {work / 'logs'}")
        return 1
    finally:
        fleet.stop_all()
        broker.stop_all()
        service.close()


def _keep_running(console: Console, work: Path, hub_url: str, *fleets: Fleet) -> None:
    """Leave the children running (--keep): forget them, and say how to stop them."""
    pids = " ".join(str(p.pid) for f in fleets for p in f.procs.values())
    console.print(f"--keep: hub at {hub_url}, agents running; logs in {work / 'logs'}")
    console.print(f"stop them with: kill {pids}")
    for f in fleets:
        f.procs.clear()


def _build_and_publish(console: Console, service: FleetService, work: Path) -> tuple[Path, int]:
    """Train, compress, convert, bundle and publish ``digits``; returns the held-out stream."""
    from cloud.models.bundles import package_skill  # noqa: PLC0415
    from cloud.models.worker import run_worker  # noqa: PLC0415 - torch
    from converters.pipeline import CompressOptions  # noqa: PLC0415 - torch

    factory = service.models
    dataset = factory.add_builtin_dataset("digits")
    job = factory.submit_training(dataset.id, arch="digits-cnn", epochs=8, model_name="digits-cnn")
    with console.status(f"training job {job.id}: the digits CNN"), redirect_stdout(io.StringIO()):
        # The job's own worker code, run in this process: torch is loaded here already,
        # and a worker process would load it again (seconds the demo need not spend).
        run_worker(service.home, job.id)
    job = factory.tables.get_job(job.id)
    if job.status != "succeeded":
        raise HubError(f"training job {job.id} {job.status}: {job.error}")
    model = factory.tables.get_model(job.model_name)
    console.print(f"trained {model.name} (job {job.id}): test accuracy {model.test_accuracy:.3f}")
    with console.status("quantising to INT8 and converting for onnx-cpu"):
        options = CompressOptions(tflite=False, latency=False)
        factory.compress(model.id, ["int8"], options=options)
        artifacts = [factory.convert(model.id, "onnx-cpu", variant=v) for v in ("float", "int8")]
    bundle = package_skill(factory, LIBRARY / "digits", "1.0.0", artifacts, work / "dist")
    published = service.skills.publish(bundle)
    rec = published.version
    console.print(
        f"built and signed {rec.target_name} ({rec.size} bytes), "
        f"{published.linked_artifacts} model artefacts linked"
    )
    holdout = work / "holdout.npz"
    return holdout, write_holdout_stream(factory, model.id, holdout)


def _print_console(console: Console, service: FleetService, port: int) -> None:
    """Wait for the console, and print its address with an admin token for it.

    Raises:
        TimeoutError: the console did not open its port in time.
    """
    wait_for_port(port)
    _, token = service.tokens.create("demo", "admin", "default", ttl_s=7 * 86400)
    console.print(f"console: http://127.0.0.1:{port}/ (log in with the token below)")
    console.print(f"console token: {token}", soft_wrap=True)


def _identity_args(service: FleetService, labels: list[str]) -> list[str]:
    """A claim token for a device with ``labels``, and where to enrol with it."""
    wanted = dict(label.split("=", 1) for label in labels)
    token = service.identity.create_claim(wanted, uses=1, ttl_s=600)
    ca = str(service.home / "pki" / "ca.crt")
    enroll = f"grpcs://{service.config.enroll_bind}"
    return ["--claim-token", token, "--hub-ca", ca, "--enroll-url", enroll]


def _start_hub(fleet: Fleet, service: FleetService, work: Path, *extra: str) -> str:
    """Start the hub process (gRPC, mutual TLS); returns the URL agents connect to.

    Raises:
        TimeoutError: the hub did not open its port in time.
        ChildProcessError: the hub exited before it opened its port.
    """
    port = int(service.config.grpc_bind.rsplit(":", 1)[1])
    proc = fleet.start("hub", ["hub", "serve", "--home", str(work / "hub"), *extra])
    # The hub subscribes on the broker before it opens this port. A busy machine can take a
    # while to start it; a hub that exits is said at once.
    wait_for_port(port, 120, proc)
    return f"grpcs://127.0.0.1:{port}"


def _start_hub_mqtt(
    console: Console, fleet: Fleet, broker: Fleet, service: FleetService, work: Path, *extra: str
) -> str:
    """Start the demo's own TLS broker, then the hub serving through it; returns the agents' URL.

    Mosquitto runs as the user who runs the demo (``run_as``'s default): that user
    owns the broker's key (mode 0600) and the private work folder. Started as root
    with no ``user`` line it would switch to ``mosquitto``, which can read neither.

    Raises:
        HubError: Mosquitto is not installed, or its files cannot be written.
        TimeoutError: the broker or the hub did not listen in time.
        OSError: the broker could not be started.
    """
    from cloud.broker import hub_mqtt_url, write_broker_config  # noqa: PLC0415 - MQTT only

    program = find_program("mosquitto")
    if program is None:
        raise HubError("the MQTT demo needs Mosquitto (the `mosquitto` program) installed")
    port = free_port()
    config = write_broker_config(service.home, work / "broker", port=port, prefix=MQTT_PREFIX)
    proc = broker.spawn("broker", [program, "-c", str(config)])
    wait_for_port(port, 10)
    console.print(f"broker: Mosquitto (pid {proc.pid}) with TLS and the generated ACL, port {port}")
    hub = hub_mqtt_url(service.home, "127.0.0.1", port, MQTT_PREFIX)
    _start_hub(fleet, service, work, "--mqtt", f"{hub}&{MQTT_OPTIONS}", *extra)
    return f"mqtts://127.0.0.1:{port}/{MQTT_PREFIX}?{MQTT_OPTIONS}"


def _wait_for_inferences(
    console: Console, service: FleetService, devices: list[str], count: int
) -> None:
    def done() -> int:
        totals = service.telemetry.inferences_by_device()
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


def _print_table(console: Console, service: FleetService, count: int) -> bool:
    summary = {s.device_id: s for s in service.telemetry.summary()}
    views = {d.device_id: d for d in service.devices.list()}
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
        view = views.get(device_id)
        skill = view.reported[0] if view and view.reported else None
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
