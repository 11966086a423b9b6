"""Agent footprint per device profile: install size, idle RSS, RSS running the digits skill.

Run: ``python tests/bench/bench_footprint.py [--profiles arm64-cpu,...]``

* ``install_mb``: the agent's dependency set for the profile's architecture, installed:
  the uncompressed size of every wheel in ``firmware_images/locks/<profile>.lock`` plus
  the agent's own wheel (wheels are downloaded once into ~/.cache/edgeskill/firmware/wheels);
* ``idle_rss_mb``: the agent installed and started as the firmware images do it: the
  lock's wheels of the target whose architecture is this machine's (x86-gateway on
  x86_64) and the agent's wheel unpacked and compiled by
  ``firmware_images/common/install.py``'s own code, run as ``python -m edge_agent run
  --board <profile>`` by a bare interpreter (a virtual environment with no packages)
  with that folder on ``PYTHONPATH``, after ``python -m edge_agent enroll`` made its
  identity (as the firmware's launcher does at a first boot); connected over mTLS to a
  real hub, nothing deployed, no input source; median of samples over 5 s
  (``idle_from`` says which install ran; without a lock for this architecture, this
  checkout's environment); over gRPC, the images' default hub URL;
* ``idle_mqtt_rss_mb``: the same agent on an ``mqtts://`` hub (the demo's TLS broker):
  it loads no gRPC, which it needs only to enrol and to renew its certificate;
* ``idle_source_rss_mb``: the same with a replay source (``--source holdout.npz``): the
  agent that then runs the skill, before the deployment (the source's arrays and numpy
  are loaded at start);
* ``running_rss_mb``: the agent and its skill process together while the digits skill
  runs the variant the profile picks (``skill_rss_mb`` and ``variant`` say which).

RSS is measured here, on x86_64, with the profile forced: the agent's code path is the
profile's, the native libraries are this machine's. Goal: idle agent < 60 MB (KubeEdge's
EdgeCore runs in about 70 MB). Writes ``tests/bench/results/footprint.json``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from cloud.hub import Hub  # noqa: E402
from cloud.service import FleetService  # noqa: E402
from edgeskill.demo import _start_hub_mqtt  # noqa: E402
from edgeskill.firmware_build import download_wheels  # noqa: E402
from edgeskill.firmware_recipes import FIRMWARE_DIR, TARGETS, load_recipe, parse_lock  # noqa: E402
from edgeskill.processes import Fleet, agent_args, wait_until  # noqa: E402
from protos.envelope import now_ms  # noqa: E402

RESULTS = REPO / "tests" / "bench" / "results" / "footprint.json"
#: How a firmware-like install is started: the interpreter command and its environment.
Installed = tuple[list[str], dict[str, str]] | None
WHEELS = REPO / ".build" / "firmware" / "footprint-wheels"


def install_mb(profile: str, agent_wheel: Path) -> float:
    recipe = load_recipe(profile)
    lock_path = FIRMWARE_DIR / "locks" / f"{profile}.lock"
    house = WHEELS / profile
    house.mkdir(parents=True, exist_ok=True)
    download_wheels(recipe, lock_path, house, lambda _: None)
    total = 0
    wheels = [house / w.filename for w in parse_lock(lock_path.read_text(), profile).wheels]
    for wheel in [*wheels, agent_wheel]:
        with zipfile.ZipFile(wheel) as archive:
            total += sum(info.file_size for info in archive.infolist())
    return total / 2**20


def firmware_install(work: Path, agent_wheel: Path) -> tuple[list[str], dict[str, str]] | None:
    """The agent as a firmware image installs it on this machine's architecture.

    Returns:
        The interpreter command and environment that start it, or None when no target's
        lock is for this machine (then the agent runs from this checkout's environment).
    """
    machine, python = platform.machine(), ".".join(platform.python_version_tuple()[:2])
    target = next(
        (t for t in TARGETS if (r := load_recipe(t)).arch == machine and r.python == python),
        None,
    )
    if target is None:
        return None
    spec = importlib.util.spec_from_file_location(
        "fw_install", FIRMWARE_DIR / "common" / "install.py"
    )
    assert spec is not None and spec.loader is not None
    installer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(installer)
    lock_path = FIRMWARE_DIR / "locks" / f"{target}.lock"
    house = WHEELS / target
    house.mkdir(parents=True, exist_ok=True)
    download_wheels(load_recipe(target), lock_path, house, lambda _: None)
    lib = work / "firmware-lib"
    for wheel in parse_lock(lock_path.read_text(), target).wheels:
        installer.unpack(house / wheel.filename, lib)
    installer.unpack(agent_wheel, lib)
    installer.compile_bytecode(lib)
    bare = work / "bare-python"  # no site-packages of its own, as a device's system Python
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    return [str(bare / "bin" / "python")], {"PYTHONPATH": str(lib)}


def rss_mb(pid: int) -> float:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    return int(status.split("VmRSS:")[1].split()[0]) / 1024


def tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        current = todo.pop()
        pids.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
    return pids


def sample(fn, seconds: float = 5.0) -> float:  # type: ignore[no-untyped-def]
    values = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        values.append(fn())
        time.sleep(0.5)
    return statistics.median(values)


def build_bundle_for_bench(work: Path) -> Path:
    from converters.onnx_export import export_onnx  # noqa: PLC0415
    from tests.edge_agent.digits_variants import (  # noqa: PLC0415
        export_named_tflite,
        train_digits_model,
    )
    from tests.support.skillkit import LIBRARY, VariantFile, build_skill  # noqa: PLC0415

    model, data = train_digits_model()
    onnx = export_onnx(model, data.test.x[:1], work / "m" / "digits.onnx")
    tfl = export_named_tflite(model, data.test.x[:1], work / "m" / "digits.tflite")
    variants = [
        VariantFile("onnx-cpu", "fp32", onnx),
        VariantFile("openvino", "fp32", onnx),  # OpenVINO reads ONNX (one file to ship)
        VariantFile("tflite", "fp32", tfl),
    ]
    holdout = work / "holdout.npz"
    import numpy as np  # noqa: PLC0415

    np.savez(holdout, x=data.test.x.astype(np.float32), y=data.test.y)
    return build_skill(LIBRARY / "digits", "1.0.0", variants, work / "dist")


def measure(profiles: list[str], console: Console) -> list[dict[str, object]]:
    from tests.integration.conftest import free_port_pair  # noqa: PLC0415

    rows = []
    with tempfile.TemporaryDirectory(prefix="edgeskill-footprint-") as tmp:
        work = Path(tmp)
        bundle = build_bundle_for_bench(work)
        (work / "agentwheel").mkdir()
        from edgeskill.firmware_build import _agent_wheel  # noqa: PLC0415

        agent_wheel = _agent_wheel(work / "agentwheel", lambda _: None)
        installed = firmware_install(work, agent_wheel)
        port = free_port_pair()
        home = work / "hub"
        hub = Hub.init(home, grpc_bind=f"127.0.0.1:{port}")
        fleet, broker = Fleet(work / "logs"), Fleet(work / "logs")
        try:
            service = FleetService(hub)
            service.skills.publish(bundle)
            # The demo's TLS broker (its ACL, the hub's client certificate) and the hub
            # serving devices over both transports.
            mqtt_url = _start_hub_mqtt(console, fleet, broker, service, work)
            urls = {"grpc": f"grpcs://127.0.0.1:{port}", "mqtt": mqtt_url}
            for profile in profiles:
                console.print(f"measuring {profile}")
                rows.append(_one(profile, hub, fleet, work, urls, agent_wheel, installed))
        finally:
            fleet.stop_all()
            broker.stop_all()
            hub.close()
    return rows


def _spawn(hub: Hub, fleet: Fleet, work: Path, url: str, profile: str, device: str,
           source: Path | None, installed: Installed = None) -> Any:  # fmt: skip
    """Start an agent as the firmware's launcher starts it (a replay ``source`` added) and
    wait until it has registered; its process.

    As ``firmware_images/common/edgeskill-agent`` does at a first boot, the device enrols
    first with its claim token in a process of its own (``python -m edge_agent enroll``),
    then the agent starts from the identity in its state folder. ``installed``: the
    firmware-like install's interpreter and environment; without it, this checkout's.
    """
    root = work / "hub" / "trust" / "metadata" / "root.json"
    args = agent_args(url, device, [], work / device, root, source, profile)[2:]
    # The bare idle agent stays out of the profile's group (bench=<profile>).
    token = hub.enroller().create_claim({"bench": profile if source else "idle"})
    claim = ["--claim-token", token,
             "--hub-ca", str(work / "hub" / "pki" / "ca.crt"),
             "--enroll-url", f"grpcs://{hub.config.enroll_bind}"]  # fmt: skip
    python, env = installed or ([sys.executable], {})
    subprocess.run(
        [*python, "-m", "edge_agent", "enroll", *args, *claim],
        env={**os.environ, **env}, check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    if source is not None:
        args += ["--source-loop", "--source-rate", "50"]
    agent = fleet.spawn(device, [*python, "-m", "edge_agent", "run", *args], env)

    def registered() -> bool:
        record = hub.store.get_device(device)
        return record is not None and bool(record.profile)

    wait_until(registered, 120, f"{device} to register")
    return agent


def _one(profile: str, hub: Hub, fleet: Fleet, work: Path, urls: dict[str, str], wheel: Path,
         installed: Installed) -> dict:  # type: ignore[type-arg]  # fmt: skip
    # Idle as the firmware installs and starts it: no input source, so nothing that decodes
    # inputs loads; over each transport. The runs with a skill need the profile's runtime
    # (this checkout's) and go over gRPC, the images' default.
    idle = {}
    for transport, url in urls.items():
        bare = f"fp-{profile}-idle-{transport}"
        agent = _spawn(hub, fleet, work, url, profile, bare, None, installed)
        idle[transport] = sample(lambda: rss_mb(agent.pid))  # noqa: B023 - used at once
        fleet.stop(bare)
    device = f"fp-{profile}"
    hub.store.create_group(f"g-{profile}", f"bench={profile}")
    agent = _spawn(hub, fleet, work, urls["grpc"], profile, device, work / "holdout.npz")
    idle_source = sample(lambda: rss_mb(agent.pid))
    hub.store.create_deployment("digits", "1.0.0", f"g-{profile}", now_ms=now_ms())

    def served() -> bool:
        return sum(r.inferences for r in hub.store.telemetry_for(device, "digits")) >= 50

    wait_until(served, 180, f"{device} to run digits")
    running = sample(lambda: sum(rss_mb(p) for p in tree(agent.pid)))
    agent_running = rss_mb(agent.pid)
    logs = "".join(p.read_text(errors="replace") for p in (work / device / "logs").rglob("*.log"))
    variant = (
        logs.split("digits ready on ")[-1].split("\n")[0] if "digits ready on" in logs else "?"
    )
    fleet.stop(device)
    return {
        "profile": profile,
        "install_mb": round(install_mb(profile, wheel), 1),
        "idle_rss_mb": round(idle["grpc"], 1),
        "idle_mqtt_rss_mb": round(idle["mqtt"], 1),
        "idle_from": "firmware install" if installed else "checkout",
        "idle_source_rss_mb": round(idle_source, 1),
        "running_rss_mb": round(running, 1),
        "agent_running_rss_mb": round(agent_running, 1),
        "skill_rss_mb": round(running - agent_running, 1),
        "variant": variant,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profiles", default=",".join(TARGETS))
    args = parser.parse_args()
    console = Console()
    rows = measure(args.profiles.split(","), console)
    table = Table(title="agent footprint (RSS on x86_64 with the profile forced)")
    for key in rows[0]:
        table.add_column(key)
    for row in rows:
        table.add_row(*(str(v) for v in row.values()))
    console.print(table)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"goal_idle_rss_mb": 60, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
