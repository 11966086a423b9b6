"""Transport benchmark: the hub over MQTT 5 and over gRPC, side by side, with 1,000 devices.

Run: ``python tests/bench/bench_transport.py [--devices 1000] [--seconds 8]``.

One real hub process (``edgeskill hub serve``, SQLite store) serves both transports
at once; the benchmark starts its own Mosquitto (``set_tcp_nodelay true``, no
persistence) on a free port. The simulated devices are light clients in this one
process - paho clients driven by this asyncio loop, and ``grpc.aio`` streams - that
speak the real wire protocol: register, telemetry envelopes, the hub's acks.

Per transport it measures, in this order:

* telemetry latency: every device sends one window every ``1/rate`` seconds; the
  latency is send -> the hub's ack back at the device, i.e. through the broker (for
  MQTT), the hub and the durable store write;
* hub ingest: every device keeps ``--window`` messages in flight; messages/s acked;
* fetch: the agent's own transport downloads a 5 MB signed file (median of 3).

It prints a table and writes ``tests/bench/results/transport.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc.aio
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from plots import plot_bars
from rich.console import Console
from rich.table import Table

from cloud.hub import Hub
from edge_agent.transport.base import AgentTransport
from edge_agent.transport.grpc import GrpcAgentTransport, channel_options
from edge_agent.transport.mqtt import MqttAgentTransport
from protos import decode_envelope, encode_envelope, kind_of, make_envelope, pb
from protos import edgeskill_pb2_grpc as pb_grpc
from protos.topics import MqttEndpoint
from tests.support import Fleet, free_port, wait_for_port

RESULTS = Path(__file__).parent / "results" / "transport.json"
FETCH_BYTES = 5 * 1000 * 1000
console = Console()


class Meter:
    """Send times, latencies and ack counts of one phase."""

    def __init__(self) -> None:
        self.sent: dict[str, float] = {}
        self.latencies_ms: list[float] = []
        self.acked = 0
        self.waiters: dict[str, asyncio.Future[None]] = {}

    def sending(self, msg_id: str) -> asyncio.Future[None]:
        self.sent[msg_id] = time.perf_counter()
        fut = asyncio.get_running_loop().create_future()
        self.waiters[msg_id] = fut
        return fut

    def ack(self, msg_id: str) -> None:
        started = self.sent.pop(msg_id, None)
        if started is not None:
            self.latencies_ms.append((time.perf_counter() - started) * 1000)
            self.acked += 1
        fut = self.waiters.pop(msg_id, None)
        if fut is not None and not fut.done():
            fut.set_result(None)


def telemetry(device_id: str, seq: int) -> pb.Envelope:
    msg = pb.Telemetry(skill="bench", version="1.0.0", inferences=1, metrics={"seq": float(seq)})
    return make_envelope(device_id, telemetry=msg)


class MqttDevices:
    """Many paho clients on this asyncio loop (no thread per client)."""

    def __init__(self, url: str, ids: list[str], meter: Meter) -> None:
        self.ep = MqttEndpoint.parse(url)
        self.ids, self.meter = ids, meter
        self.clients: dict[str, mqtt.Client] = {}
        self.welcomed: dict[str, asyncio.Future[None]] = {}

    def _client(self, device_id: str) -> mqtt.Client:
        loop = asyncio.get_running_loop()
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=f"bench-{device_id}", protocol=mqtt.MQTTv5
        )
        misc: list[asyncio.Task[None]] = []

        def opened(c: mqtt.Client, _u: object, sock: Any) -> None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            loop.add_reader(sock, c.loop_read)
            misc.append(loop.create_task(_misc_loop(c)))

        def closed(_c: mqtt.Client, _u: object, sock: Any) -> None:
            loop.remove_reader(sock)
            for task in misc:
                task.cancel()

        client.on_socket_open = opened
        client.on_socket_close = closed
        client.on_socket_register_write = lambda c, _u, s: loop.add_writer(s, c.loop_write)
        client.on_socket_unregister_write = lambda _c, _u, s: loop.remove_writer(s)
        client.on_message = lambda _c, _u, msg: self._on_message(device_id, bytes(msg.payload))
        return client

    def _on_message(self, device_id: str, payload: bytes) -> None:
        env = decode_envelope(payload)
        if kind_of(env) == "welcome" and not self.welcomed[device_id].done():
            self.welcomed[device_id].set_result(None)
        elif kind_of(env) == "ack":
            for msg_id in env.ack.ids:
                self.meter.ack(msg_id)

    async def connect(self, device_id: str) -> None:
        client = self.clients[device_id] = self._client(device_id)
        self.welcomed[device_id] = asyncio.get_running_loop().create_future()
        client.connect(self.ep.host, self.ep.port, 60)
        client.subscribe(self.ep.topics.device_down_filter(device_id), qos=1)
        reg = make_envelope(device_id, register=pb.Register(labels={"kind": "bench"}))
        client.publish(self.ep.topics.up(device_id, "register"), encode_envelope(reg), qos=1)
        await asyncio.wait_for(self.welcomed[device_id], 60)

    async def send(self, device_id: str, env: pb.Envelope) -> None:
        topic = self.ep.topics.up(device_id, "telemetry")
        self.clients[device_id].publish(topic, encode_envelope(env), qos=1)

    async def close(self) -> None:
        for client in self.clients.values():
            client.disconnect()
        await asyncio.sleep(0.5)


async def _misc_loop(client: mqtt.Client) -> None:
    while client.loop_misc() == mqtt.MQTT_ERR_SUCCESS:
        await asyncio.sleep(1)


class GrpcDevices:
    """Many ``Connect`` streams over a handful of channels."""

    def __init__(self, target: str, ids: list[str], meter: Meter) -> None:
        self.ids, self.meter = ids, meter
        self.channels = [
            grpc.aio.insecure_channel(target, options=channel_options()) for _ in range(8)
        ]
        self.calls: dict[str, Any] = {}
        self.readers: list[asyncio.Task[None]] = []

    async def connect(self, device_id: str) -> None:
        stub = pb_grpc.HubStub(self.channels[hash(device_id) % len(self.channels)])
        call = self.calls[device_id] = stub.Connect()
        await call.write(make_envelope(device_id, register=pb.Register(labels={"kind": "bench"})))
        while kind_of(await asyncio.wait_for(call.read(), 60)) != "welcome":
            pass
        self.readers.append(asyncio.create_task(self._read(call)))

    async def _read(self, call: Any) -> None:
        while (env := await call.read()) is not grpc.aio.EOF:
            if kind_of(env) == "ack":
                for msg_id in env.ack.ids:
                    self.meter.ack(msg_id)

    async def send(self, device_id: str, env: pb.Envelope) -> None:
        await self.calls[device_id].write(env)

    async def close(self) -> None:
        for task in self.readers:
            task.cancel()
        for call in self.calls.values():
            call.cancel()
        for channel in self.channels:
            await channel.close()


async def connect_all(devices: MqttDevices | GrpcDevices, limit: int = 100) -> float:
    gate = asyncio.Semaphore(limit)

    async def one(device_id: str) -> None:
        async with gate:
            await devices.connect(device_id)

    started = time.perf_counter()
    await asyncio.gather(*(one(d) for d in devices.ids))
    return time.perf_counter() - started


async def rate_phase(
    devices: MqttDevices | GrpcDevices, seconds: float, rate: float
) -> list[float]:
    meter = devices.meter
    meter.latencies_ms.clear()
    end = time.perf_counter() + seconds

    async def device(i: int, device_id: str) -> None:
        await asyncio.sleep(i / len(devices.ids) / rate)  # spread the devices over one period
        seq = 0
        while time.perf_counter() < end:
            seq += 1
            env = telemetry(device_id, seq)
            meter.sending(env.id)
            await devices.send(device_id, env)
            await asyncio.sleep(1 / rate)

    await asyncio.gather(*(device(i, d) for i, d in enumerate(devices.ids)))
    await asyncio.sleep(2)  # the last acks
    return sorted(meter.latencies_ms)


async def ingest_phase(devices: MqttDevices | GrpcDevices, seconds: float, window: int) -> float:
    meter = devices.meter
    await asyncio.sleep(1)
    meter.sent.clear()
    end = time.perf_counter() + seconds

    async def device(device_id: str) -> None:
        pending: set[asyncio.Future[None]] = set()
        seq = 0
        while time.perf_counter() < end:
            while len(pending) >= window:
                _, pending = await asyncio.wait(pending, timeout=1, return_when="FIRST_COMPLETED")
            seq += 1
            env = telemetry(device_id, seq)
            pending.add(meter.sending(env.id))
            await devices.send(device_id, env)

    before = meter.acked
    await asyncio.gather(*(device(d) for d in devices.ids))
    return (meter.acked - before) / seconds


async def fetch_rate(make: Callable[[], AgentTransport], path: str) -> float:
    transport = make()
    device_id = "bench-fetch"
    await transport.connect(make_envelope(device_id, register=pb.Register()))
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


async def run_transport(
    name: str,
    devices: MqttDevices | GrpcDevices,
    fetch: Callable[[], Awaitable[float]],
    args: argparse.Namespace,
) -> dict[str, Any]:
    console.print(f"[bold]{name}[/]: connecting {len(devices.ids)} devices ...")
    connect_s = await connect_all(devices)
    console.print(f"  registered in {connect_s:.1f} s; telemetry at {args.rate}/s per device ...")
    latencies = await rate_phase(devices, args.seconds, args.rate)
    console.print(f"  {len(latencies)} acked; ingest with {args.window} in flight per device ...")
    ingest = await ingest_phase(devices, args.seconds, args.window)
    await devices.close()
    mb_s = await fetch()
    return {
        "transport": name,
        "devices": len(devices.ids),
        "ingest_msgs_per_s": round(ingest, 1),
        "p50_ms": round(pct(latencies, 0.50), 2),
        "p99_ms": round(pct(latencies, 0.99), 2),
        "fetch_mb_per_s": round(mb_s, 1),
        "offered_msgs_per_s": round(len(devices.ids) * args.rate, 1),
        "latency_samples": len(latencies),
        "register_all_s": round(connect_s, 2),
    }


def start_broker(folder: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    conf = folder / "mosquitto.conf"
    conf.write_text(
        f"user {getpass.getuser()}\nlistener {port} 127.0.0.1\nallow_anonymous true\n"
        "set_tcp_nodelay true\nmax_queued_messages 10000\npersistence false\n"
    )
    proc = subprocess.Popen(["mosquitto", "-c", str(conf)], stderr=subprocess.DEVNULL)
    wait_for_port(port)
    return proc, port


def prepare_hub(work: Path, grpc_port: int, url: str) -> str:
    hub = Hub.init(work / "hub", grpc_bind=f"127.0.0.1:{grpc_port}", mqtt_url=url, insecure=True)
    blob = work / "blob.bin"
    blob.write_bytes(os.urandom(FETCH_BYTES))
    hub.trust.add_target("bench/blob.bin", blob)
    hub.close()
    return f"targets/bench/{next((work / 'hub/trust/targets/bench').iterdir()).name}"


async def bench(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    broker, mqtt_port = start_broker(work)
    grpc_port = free_port()
    url = f"mqtt://127.0.0.1:{mqtt_port}/bench?session_expiry=60"
    path = prepare_hub(work, grpc_port, url)
    fleet = Fleet(work / "logs")
    fleet.start("hub", ["hub", "serve", "--home", str(work / "hub")])
    try:
        wait_for_port(grpc_port)
        ids = [f"m-{i:04d}" for i in range(args.devices)]
        mqtt_row = await run_transport(
            "mqtt",
            MqttDevices(url, ids, Meter()),
            lambda: fetch_rate(lambda: MqttAgentTransport(url, "bench-fetch"), path),
            args,
        )
        ids = [f"g-{i:04d}" for i in range(args.devices)]
        target = f"127.0.0.1:{grpc_port}"
        grpc_row = await run_transport(
            "grpc",
            GrpcDevices(target, ids, Meter()),
            lambda: fetch_rate(lambda: GrpcAgentTransport(target, "bench-fetch"), path),
            args,
        )
        return [mqtt_row, grpc_row]
    finally:
        fleet.stop_all()
        broker.send_signal(signal.SIGTERM)
        broker.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rate", type=float, default=0.2, help="telemetry per device per second")
    parser.add_argument("--window", type=int, default=2, help="messages in flight per device")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="edgeskill-bench-") as tmp:
        rows = asyncio.run(bench(args, Path(tmp)))
    table = Table(title=f"Hub transports, {args.devices} simulated devices, {os.cpu_count()} cores")
    for col in (
        "transport",
        "devices",
        "ingest msg/s",
        "p50 ms",
        "p99 ms",
        "fetch MB/s",
        "offered msg/s",
    ):
        table.add_column(col, justify="left" if col == "transport" else "right")
    for r in rows:
        table.add_row(
            r["transport"],
            str(r["devices"]),
            f"{r['ingest_msgs_per_s']:.0f}",
            f"{r['p50_ms']:.2f}",
            f"{r['p99_ms']:.2f}",
            f"{r['fetch_mb_per_s']:.1f}",
            f"{r['offered_msgs_per_s']:.0f}",
        )
    console.print(table)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "seconds_per_phase": args.seconds,
        "rate_per_device": args.rate,
        "window": args.window,
        "cpu_count": os.cpu_count(),
        "broker": "mosquitto, set_tcp_nodelay true",
        "store": "sqlite",
        "wall_s": round(time.perf_counter() - started, 1),
    }
    RESULTS.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    keys = ["ingest_msgs_per_s", "p50_ms", "p99_ms", "fetch_mb_per_s"]
    title = f"hub over MQTT and gRPC, {rows[0]['devices']} devices"
    picture = plot_bars(rows, "transport", keys, RESULTS.with_suffix(".png"), title)
    console.print(f"wrote {RESULTS} and {picture} in {meta['wall_s']} s")


if __name__ == "__main__":
    sys.exit(main())
