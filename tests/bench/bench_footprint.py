"""Agent footprint per device profile: install size, idle RSS, RSS running the digits skill.

Run: ``python tests/bench/bench_footprint.py [--profiles arm64-cpu,...]``

* ``install_mb``: the agent's dependency set for the profile's architecture, installed:
  the uncompressed size of every wheel in ``firmware_images/locks/<profile>.lock`` plus
  the agent's own wheel (wheels are downloaded once into .build/firmware/wheels);
* ``idle_rss_mb``: the agent process started as the firmware images start it
  (``python -m edge_agent run --board <profile>`` on this machine: ``edgeskill agent run``'s
  options without Typer, Rich and Pydantic), enrolled over mTLS and connected to a real
  hub, nothing deployed, no input source; median of samples over 5 s;
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
import json
import statistics
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
from edgeskill.firmware_build import download_wheels  # noqa: E402
from edgeskill.firmware_recipes import FIRMWARE_DIR, TARGETS, load_recipe, parse_lock  # noqa: E402
from edgeskill.processes import Fleet, agent_args, wait_for_port, wait_until  # noqa: E402
from protos.envelope import now_ms  # noqa: E402

RESULTS = REPO / "tests" / "bench" / "results" / "footprint.json"
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
        port = free_port_pair()
        home = work / "hub"
        hub = Hub.init(home, grpc_bind=f"127.0.0.1:{port}")
        fleet = Fleet(work / "logs")
        try:
            FleetService(hub).skills.publish(bundle)
            fleet.start("hub", ["hub", "serve", "--home", str(home)])
            wait_for_port(port)
            for profile in profiles:
                console.print(f"measuring {profile}")
                rows.append(_one(profile, hub, fleet, work, port, agent_wheel))
        finally:
            fleet.stop_all()
            hub.close()
    return rows


def _spawn(hub: Hub, fleet: Fleet, work: Path, port: int, profile: str, device: str,
           source: Path | None) -> Any:  # fmt: skip
    """Start an agent as the firmware images start it (a replay ``source`` added) and
    wait until it has enrolled and registered; its process."""
    # The bare idle agent stays out of the profile's group (bench=<profile>): not deployed to.
    token = hub.enroller().create_claim({"bench": profile if source else "idle"})
    root = work / "hub" / "trust" / "metadata" / "root.json"
    args = agent_args(f"grpcs://127.0.0.1:{port}", device, [], work / device, root,
                      source, profile)  # fmt: skip
    if source is not None:
        args += ["--source-loop", "--source-rate", "50"]
    args += ["--claim-token", token,
             "--hub-ca", str(work / "hub" / "pki" / "ca.crt"),
             "--enroll-url", f"grpcs://{hub.config.enroll_bind}"]  # fmt: skip
    # As firmware_images/common/edgeskill-agent starts it: the agent's own entry.
    agent = fleet.spawn(device, [sys.executable, "-m", "edge_agent", "run", *args[2:]])

    def registered() -> bool:
        record = hub.store.get_device(device)
        return record is not None and bool(record.profile)

    wait_until(registered, 120, f"{device} to register")
    return agent


def _one(profile: str, hub: Hub, fleet: Fleet, work: Path, port: int, wheel: Path) -> dict:  # type: ignore[type-arg]
    # Idle as the firmware starts it: no input source, so nothing that decodes inputs loads.
    bare = f"fp-{profile}-idle"
    agent = _spawn(hub, fleet, work, port, profile, bare, None)
    idle = sample(lambda: rss_mb(agent.pid))
    fleet.stop(bare)
    device = f"fp-{profile}"
    hub.store.create_group(f"g-{profile}", f"bench={profile}")
    agent = _spawn(hub, fleet, work, port, profile, device, work / "holdout.npz")
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
        "idle_rss_mb": round(idle, 1),
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
