"""Transport benchmark: the hub's ingest over MQTT 5 and gRPC against the raw path, in one run.

Run: ``python tests/bench/bench_transport.py [--devices 1000] [--seconds 8] [--procs 2]``
(``make bench`` points it at the project's test broker).

Everything runs on this machine, in this order, with the same devices, message
(a telemetry envelope), QoS 1 and one connection per device:

* raw MQTT: the broker alone - every device publishes to a plain topic, keeping
  ``--window`` publishes unacknowledged by the broker, and one subscriber
  process counts what arrives;
* raw gRPC: a bare ``grpc.aio`` server process that decodes each envelope and
  acks it without storing it; one channel and stream per device;
* the hub (``edgeskill hub serve``, SQLite store) over MQTT, then over gRPC:
  telemetry latency at ``--rate`` per device (send -> the hub's ack, after the
  durable write), then ingest with ``--window`` in flight per device (messages
  stored, deduplicated and acknowledged per second), then a 5 MB fetch.

The devices live in ``--procs`` load-generator processes (``loadgen.py``), never
on a measuring loop. After the hub's phases the stored rows are counted against
the messages sent: ``lost`` must be 0. ``ratio`` is hub msg/s over raw msg/s.
It prints a table and writes ``tests/bench/results/transport.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, Listener
from pathlib import Path
from typing import Any

import loadgen
from plots import plot_bars
from profiling import HubProfile
from rich.console import Console
from rich.table import Table

from cloud.hub import Hub
from edge_agent.transport.base import AgentTransport
from edge_agent.transport.grpc import GrpcAgentTransport
from edge_agent.transport.mqtt import MqttAgentTransport
from edgeskill.processes import Fleet, free_port, wait_for_port
from protos import make_envelope, pb

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.support.services import mqtt_host_port

RESULTS = Path(__file__).parent / "results" / "transport.json"
#: py-spy's samples of the hub (``--profile``); big, so kept out of the results.
PROFILES = Path(__file__).resolve().parents[2] / ".build" / "bench"
FETCH_BYTES = 5 * 1000 * 1000
console = Console()


class Children:
    """Starts ``loadgen.py`` processes, each told its role over a Unix socket."""

    def __init__(self, work: Path) -> None:
        key = secrets.token_bytes(16)
        self.address = str(work / "loadgen.sock")
        self.listener = Listener(self.address, "AF_UNIX", authkey=key)
        self.env = {**os.environ, loadgen.KEY_ENV: key.hex(), "GRPC_VERBOSITY": "ERROR"}
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, roles: list[tuple[str, tuple[Any, ...]]]) -> list[Connection]:
        """One child per role, all started before any is waited for; their connections."""
        for _ in roles:
            argv = [sys.executable, loadgen.__file__, self.address]
            self.procs.append(subprocess.Popen(argv, env=self.env))
        conns = [self.listener.accept() for _ in roles]
        for conn, role in zip(conns, roles, strict=True):
            conn.send(role)
        return conns

    def close(self) -> None:
        """Wait for the children (they end when told); kill any that do not."""
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()
        self.listener.close()


class Workers:
    """Load-generator processes sharing a list of devices; commands go to all of them."""

    def __init__(self, kids: Children, spec: dict[str, Any], ids: list[str], procs: int) -> None:
        shares = [ids[i::procs] for i in range(procs)]
        self.conns = kids.start([("devices", ({**spec, "ids": share},)) for share in shares])
        self.pids = [proc.pid for proc in kids.procs[-procs:]]

    def ask(self, command: str, **kwargs: Any) -> list[Any]:
        for conn in self.conns:
            conn.send((command, kwargs))
        return [conn.recv() for conn in self.conns]

    def close(self) -> None:
        self.ask("close")


def _ingest(
    workers: Workers, args: argparse.Namespace, drain_s: float, others: dict[str, int]
) -> tuple[float, dict[str, Any]]:
    """Run the ingest phase; also the CPU each process spent per message acked in it.

    ``others`` names the processes besides the load generators to account for
    (the broker, the raw subscriber or bare server, the hub): on a machine whose
    cores all of them share, this says where the time goes.
    """
    pids = {**others, "load generators": workers.pids}
    before = {name: _cpu(p) for name, p in pids.items()}
    start_at = time.monotonic() + 1.0
    found = workers.ask(
        "ingest", start_at=start_at, seconds=args.seconds, window=args.window, drain_s=drain_s
    )
    totals: dict[str, Any] = {
        k: sum(f[k] for f in found) for k in ("sent", "acked", "acked_in_phase")
    }
    acked = max(1, totals["acked"])
    totals["cpu_us_per_msg"] = {
        name: round((_cpu(p) - before[name]) / acked * 1e6) for name, p in pids.items()
    }
    return start_at, totals


def _cpu(pids: int | list[int]) -> float:
    return sum(cpu_seconds(p) for p in ([pids] if isinstance(pids, int) else pids))


def broker_pid(port: int) -> int | None:
    """The pid of the Mosquitto listening on ``port``, found by its command line (read only)."""
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"mosquitto"):
            text = _read_or_empty(next((a for a in argv if a.endswith(b".conf")), b""))
            if f"listener {port}".encode() in text or f"port {port}".encode() in text:
                return int(proc.name)
    return None


def _read_or_empty(path: bytes) -> bytes:
    try:
        return Path(path.decode()).read_bytes()
    except (OSError, UnicodeDecodeError):
        return b""


def raw_mqtt(kids: Children, args: argparse.Namespace, url: str, prefix: str) -> dict[str, Any]:
    host, port = mqtt_host_port()
    (ours,) = kids.start([("raw-subscriber", (host, port, f"{prefix}/raw/#"))])
    others = {"subscriber": kids.procs[-1].pid, **_broker(port)}
    assert ours.recv() == "ready"
    ids = [f"rm-{i:05d}" for i in range(args.devices)]
    workers = Workers(kids, {"transport": "mqtt", "mode": "raw", "target": url}, ids, args.procs)
    try:
        workers.ask("connect")
        start_at, totals = _ingest(workers, args, drain_s=2.0, others=others)
        ours.send((start_at, start_at + args.seconds))
        arrived, arrived_all = ours.recv()
    finally:
        workers.close()
        ours.send(None)
    return {
        "msgs_per_s": arrived / args.seconds,
        "sent": totals["sent"],
        "arrived": arrived_all,
        "cpu_us_per_msg": totals["cpu_us_per_msg"],
    }


def _broker(port: int) -> dict[str, int]:
    pid = broker_pid(port)
    return {} if pid is None else {"broker": pid}


def raw_grpc(kids: Children, args: argparse.Namespace) -> dict[str, Any]:
    (ours,) = kids.start([("bare-grpc", ())])
    others = {"bare server": kids.procs[-1].pid}
    target = f"127.0.0.1:{ours.recv()}"
    ids = [f"rg-{i:05d}" for i in range(args.devices)]
    workers = Workers(kids, {"transport": "grpc", "mode": "raw", "target": target}, ids, args.procs)
    try:
        workers.ask("connect")
        _, totals = _ingest(workers, args, drain_s=2.0, others=others)
    finally:
        workers.close()
        ours.send(None)
    return {
        "msgs_per_s": totals["acked_in_phase"] / args.seconds,
        "sent": totals["sent"],
        "arrived": totals["acked"],
        "cpu_us_per_msg": totals["cpu_us_per_msg"],
    }


def hub_transport(
    kids: Children,
    args: argparse.Namespace,
    name: str,
    target: str,
    hub_pid: int,
    profile: HubProfile | None,
) -> dict[str, Any]:
    ids = [f"{name[0]}-{i:05d}" for i in range(args.devices)]
    workers = Workers(kids, {"transport": name, "mode": "hub", "target": target}, ids, args.procs)
    try:
        console.log(f"[bold]hub {name}[/]: connecting {args.devices} devices ...")
        connect_s = max(workers.ask("connect"))
        start_at = time.monotonic() + 1.0
        found = workers.ask("rate", start_at=start_at, seconds=args.seconds, rate=args.rate)
        latencies = sorted(x for f in found for x in f["latencies_ms"])
        rate_sent = len(latencies) + sum(f["unacked"] for f in found)
        console.log(f"  {len(latencies)} acked at {args.rate}/s per device; ingest ...")
        if profile is not None:
            profile.start(name, args.seconds + 1.0)
        cpu_before = cpu_seconds(hub_pid)
        others = {"hub": hub_pid, **(_broker(mqtt_host_port()[1]) if name == "mqtt" else {})}
        _, totals = _ingest(workers, args, drain_s=15.0, others=others)
        hub_cpu = (cpu_seconds(hub_pid) - cpu_before) / args.seconds
        if profile is not None:
            profile.finish()
    finally:
        workers.close()
    return {
        "devices": args.devices,
        "hub_msgs_per_s": totals["acked_in_phase"] / args.seconds,
        "p50_ms": pct(latencies, 0.50),
        "p99_ms": pct(latencies, 0.99),
        "offered_msgs_per_s": args.devices * args.rate,
        "latency_samples": len(latencies),
        "register_all_s": connect_s,
        "sent": rate_sent + totals["sent"],
        "acked": len(latencies) + totals["acked"],
        "prefix": f"{name[0]}-",
        "hub_cpu": hub_cpu,
        "cpu_us_per_msg": totals["cpu_us_per_msg"],
    }


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stored_windows(home: Path, prefix: str) -> int:
    hub = Hub.open(home)
    try:
        rows = hub.store.telemetry_summary()
    finally:
        hub.close()
    return sum(r.windows for r in rows if r.device_id.startswith(prefix) and r.skill == "bench")


async def fetch_rate(make: Callable[[], AgentTransport], path: str) -> float:
    transport = make()
    await transport.connect(make_envelope("bench-fetch", register=pb.Register()))
    try:
        rates = []
        for _ in range(3):
            started = time.perf_counter()
            data = await transport.fetch(path, 2 * FETCH_BYTES)
            rates.append(len(data) / (time.perf_counter() - started) / 1e6)
        return statistics.median(rates)
    finally:
        await transport.close()


def pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def prepare_hub(work: Path, grpc_port: int, url: str) -> str:
    hub = Hub.init(work / "hub", grpc_bind=f"127.0.0.1:{grpc_port}", mqtt_url=url, insecure=True)
    blob = work / "blob.bin"
    blob.write_bytes(os.urandom(FETCH_BYTES))
    hub.trust.add_target("bench/blob.bin", blob)
    hub.close()
    return f"targets/bench/{next((work / 'hub/trust/targets/bench').iterdir()).name}"


def row(
    name: str, raw: dict[str, Any], hub: dict[str, Any], stored: int, mb_s: float
) -> dict[str, Any]:
    hub_rate = hub["hub_msgs_per_s"]
    return {
        "transport": name,
        "devices": hub["devices"],
        "ingest_msgs_per_s": round(hub_rate, 1),
        "p50_ms": round(hub["p50_ms"], 2),
        "p99_ms": round(hub["p99_ms"], 2),
        "fetch_mb_per_s": round(mb_s, 1),
        "offered_msgs_per_s": round(hub["offered_msgs_per_s"], 1),
        "latency_samples": hub["latency_samples"],
        "register_all_s": round(hub["register_all_s"], 2),
        "raw_msgs_per_s": round(raw["msgs_per_s"], 1),
        "hub_msgs_per_s": round(hub_rate, 1),
        "ratio": round(hub_rate / raw["msgs_per_s"], 3) if raw["msgs_per_s"] else None,
        "hub_sent": hub["sent"],
        "hub_acked": hub["acked"],
        "hub_stored": stored,
        "lost": hub["sent"] - stored,
        "hub_cpu_cores": round(hub["hub_cpu"], 2),
        "raw_sent": raw["sent"],
        "raw_arrived": raw["arrived"],
        # CPU per message acked, by process: where each phase's time went.
        "raw_cpu_us_per_msg": raw["cpu_us_per_msg"],
        "hub_cpu_us_per_msg": hub["cpu_us_per_msg"],
    }


def bench(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    host, port = mqtt_host_port()
    prefix = f"bench-{os.getpid()}"
    url = f"mqtt://{host}:{port}/{prefix}?session_expiry=60"
    kids = Children(work)
    fleet = Fleet(work / "logs")
    try:
        console.log(f"[bold]raw[/]: broker {host}:{port} alone, then a bare grpc.aio server ...")
        raws = {
            name: raw_mqtt(kids, args, url, prefix) if name == "mqtt" else raw_grpc(kids, args)
            for name in args.transports
        }
        grpc_port = free_port()
        path = prepare_hub(work, grpc_port, url)
        hub_proc = fleet.start("hub", ["hub", "serve", "--home", str(work / "hub")])
        profile = HubProfile(hub_proc.pid, PROFILES) if args.profile else None
        wait_for_port(grpc_port)
        targets = {"mqtt": url, "grpc": f"127.0.0.1:{grpc_port}"}
        makers: dict[str, Callable[[], AgentTransport]] = {
            "mqtt": lambda: MqttAgentTransport(url, "bench-fetch"),
            "grpc": lambda: GrpcAgentTransport(targets["grpc"], "bench-fetch"),
        }
        rows = []
        for name in args.transports:
            hub = hub_transport(kids, args, name, targets[name], hub_proc.pid, profile)
            stored = stored_windows(work / "hub", hub["prefix"])
            mb_s = asyncio.run(fetch_rate(makers[name], path))
            rows.append(row(name, raws[name], hub, stored, mb_s))
        return rows
    finally:
        fleet.stop_all()
        kids.close()


def print_table(rows: list[dict[str, Any]], devices: int) -> None:
    table = Table(title=f"Hub transports, {devices} simulated devices, {os.cpu_count()} cores")
    columns = {
        "transport": "transport",
        "raw msg/s": "raw_msgs_per_s",
        "hub msg/s": "hub_msgs_per_s",
        "ratio": "ratio",
        "lost": "lost",
        "hub CPU": "hub_cpu_cores",
        "p50 ms": "p50_ms",
        "p99 ms": "p99_ms",
        "fetch MB/s": "fetch_mb_per_s",
        "offered msg/s": "offered_msgs_per_s",
    }
    for title in columns:
        table.add_column(title, justify="left" if title == "transport" else "right")
    for r in rows:
        table.add_row(*(_cell(r[key]) for key in columns.values()))
    console.print(table)
    cpu = Table(title="CPU µs per message acked, by process (all share the same cores)")
    for title in ("transport", "phase", "process", "µs/msg"):
        cpu.add_column(title, justify="left" if title != "µs/msg" else "right")
    for r in rows:
        for phase in ("raw", "hub"):
            for process, us in r[f"{phase}_cpu_us_per_msg"].items():
                cpu.add_row(r["transport"], phase, process, str(us))
    console.print(cpu)


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.2f}" if value < 10 else f"{value:.0f}"
    return str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rate", type=float, default=0.2, help="telemetry per device per second")
    parser.add_argument("--window", type=int, default=2, help="messages in flight per device")
    parser.add_argument("--procs", type=int, default=2, help="load-generator processes")
    parser.add_argument(
        "--transports",
        type=lambda v: v.split(","),
        default=["mqtt", "grpc"],
        help="comma-separated, of mqtt and grpc",
    )
    parser.add_argument(
        "--profile", action="store_true", help="sample the hub with py-spy during ingest"
    )
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="edgeskill-bench-") as tmp:
        rows = bench(args, Path(tmp))
    print_table(rows, args.devices)
    meta = {
        "seconds_per_phase": args.seconds,
        "rate_per_device": args.rate,
        "window": args.window,
        "load_processes": args.procs,
        "cpu_count": os.cpu_count(),
        "broker": "mosquitto (the test services' broker)",
        "store": "sqlite",
        "raw": "mqtt: publishers -> broker -> one subscriber; grpc: bare grpc.aio acking server",
        "wall_s": round(time.perf_counter() - started, 1),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    keys = ["raw_msgs_per_s", "hub_msgs_per_s", "p50_ms", "p99_ms", "fetch_mb_per_s"]
    title = f"hub over MQTT and gRPC vs raw, {rows[0]['devices']} devices"
    picture = plot_bars(rows, "transport", keys, RESULTS.with_suffix(".png"), title)
    console.print(f"wrote {RESULTS} and {picture} in {meta['wall_s']} s")
    if any(r["lost"] for r in rows):
        console.print("[red]messages lost: sent and not stored[/]")
        sys.exit(1)


if __name__ == "__main__":
    main()
