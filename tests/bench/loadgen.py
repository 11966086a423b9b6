"""Load generators and bare baselines of the transport benchmark, each in a process of its own.

The benchmark's parent process measures nothing on its own event loop: it
starts this file as child processes (``python loadgen.py SOCKET``), sends each
its role and then commands over the socket, and adds up what they report.
Clocks agree because ``time.monotonic`` is system-wide on Linux.

* :func:`devices_main`: a share of the simulated devices, on one asyncio loop.
  Over MQTT they are paho clients driven by the loop (one connection each);
  over gRPC each device has its own channel and ``Connect`` stream.
  ``mode="hub"`` speaks the hub's protocol (register, telemetry, the hub's acks);
  ``mode="raw"`` publishes the same envelopes to a plain topic (MQTT; the
  broker's PUBACK frees the window) or streams them to the bare server (gRPC).
* :func:`raw_subscriber_main`: one MQTT subscriber that counts what arrives.
* :func:`bare_grpc_main`: a ``grpc.aio`` server that acks every envelope
  without storing it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
import time
from collections.abc import AsyncIterator
from multiprocessing.connection import Client, Connection
from typing import Any

import grpc
import grpc.aio
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from protos import decode_envelope, encode_envelope, kind_of, make_envelope, pb
from protos.paho_loop import LeanClient, PahoLoop
from protos.topics import MqttEndpoint

CONNECT_LIMIT = 100
_SERVICE = pb.DESCRIPTOR.services_by_name["Hub"].full_name
_CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 8 * 1024 * 1024)]


def telemetry(device_id: str, seq: int) -> pb.Envelope:
    """One telemetry window, the message every phase sends."""
    msg = pb.Telemetry(skill="bench", version="1.0.0", inferences=1, metrics={"seq": float(seq)})
    return make_envelope(device_id, telemetry=msg)


def raw_topic(prefix: str, device_id: str) -> str:
    """The plain topic a raw publisher sends to (outside the hub's layout)."""
    return f"{prefix}/raw/{device_id}"


class Meter:
    """Send times and acks of this process's devices."""

    def __init__(self) -> None:
        self.sent: dict[str, float] = {}
        self.waiters: dict[str, asyncio.Future[None]] = {}
        self.latencies_ms: list[float] = []
        self.ack_times: list[float] = []

    def sending(self, msg_id: str) -> asyncio.Future[None]:
        self.sent[msg_id] = time.monotonic()
        fut = asyncio.get_running_loop().create_future()
        self.waiters[msg_id] = fut
        return fut

    def ack(self, msg_id: str) -> None:
        now = time.monotonic()
        started = self.sent.pop(msg_id, None)
        if started is not None:
            self.latencies_ms.append((now - started) * 1000)
            self.ack_times.append(now)
        fut = self.waiters.pop(msg_id, None)
        if fut is not None and not fut.done():
            fut.set_result(None)


class MqttDevices:
    """Paho clients on this asyncio loop (no thread per client)."""

    def __init__(self, url: str, ids: list[str], meter: Meter, *, raw: bool) -> None:
        self.ep = MqttEndpoint.parse(url)
        self.ids, self.meter, self.raw = ids, meter, raw
        self.clients: dict[str, mqtt.Client] = {}
        self.ready: dict[str, asyncio.Future[None]] = {}
        self.mids: dict[tuple[str, int], str] = {}

    def _client(self, device_id: str) -> mqtt.Client:
        loop = asyncio.get_running_loop()
        # The agent's own client class, in both the raw and the hub phase.
        client = LeanClient(
            CallbackAPIVersion.VERSION2, client_id=f"bench-{device_id}", protocol=mqtt.MQTTv5
        )
        misc: list[asyncio.Task[None]] = []

        def opened(c: LeanClient, _u: object, sock: Any) -> None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            loop.add_reader(sock, _read_all, c)
            misc.append(loop.create_task(_misc_loop(c)))

        def closed(_c: mqtt.Client, _u: object, sock: Any) -> None:
            loop.remove_reader(sock)
            for task in misc:
                task.cancel()

        def connected(*_args: object) -> None:
            if self.raw and not self.ready[device_id].done():
                self.ready[device_id].set_result(None)

        client.on_socket_open = opened
        client.on_socket_close = closed
        client.on_socket_register_write = lambda c, _u, s: loop.add_writer(s, c.loop_write)
        client.on_socket_unregister_write = lambda _c, _u, s: loop.remove_writer(s)
        client.on_connect = connected
        client.on_message = lambda _c, _u, msg: self._on_message(device_id, bytes(msg.payload))
        client.on_publish = lambda _c, _u, mid, _rc, _p: self._on_puback(device_id, mid)
        return client

    def _on_message(self, device_id: str, payload: bytes) -> None:
        # The hub's own acks: parsed, not validated, to keep the load generator cheap.
        env = pb.Envelope.FromString(payload)
        if kind_of(env) == "welcome" and not self.ready[device_id].done():
            self.ready[device_id].set_result(None)
        elif kind_of(env) == "ack":
            for msg_id in env.ack.ids:
                self.meter.ack(msg_id)

    def _on_puback(self, device_id: str, mid: int) -> None:
        msg_id = self.mids.pop((device_id, mid), None)
        if msg_id is not None:  # raw mode: the broker took it, which frees the window
            self.meter.ack(msg_id)

    async def connect(self, device_id: str) -> None:
        client = self.clients[device_id] = self._client(device_id)
        self.ready[device_id] = asyncio.get_running_loop().create_future()
        client.connect(self.ep.host, self.ep.port, 60)
        if not self.raw:
            client.subscribe(self.ep.topics.device_down_filter(device_id), qos=1)
            reg = make_envelope(device_id, register=pb.Register(labels={"kind": "bench"}))
            client.publish(self.ep.topics.up(device_id, "register"), encode_envelope(reg), qos=1)
        await asyncio.wait_for(self.ready[device_id], 60)

    async def send(self, device_id: str, env: pb.Envelope) -> None:
        if self.raw:
            topic = raw_topic(self.ep.topics.prefix, device_id)
        else:
            topic = self.ep.topics.up(device_id, "telemetry")
        _, mid = self.clients[device_id].publish_at_least_once(topic, encode_envelope(env))
        if self.raw:
            self.mids[(device_id, mid)] = env.id

    async def close(self) -> None:
        for client in self.clients.values():
            client.disconnect()
        await asyncio.sleep(0.2)  # let the DISCONNECT packets leave


def _read_all(client: LeanClient) -> None:
    """Read the socket, then every whole packet the client's buffer still holds."""
    client.loop_read()
    while client.buffered() and client.socket() is not None:
        client.loop_read()


async def _misc_loop(client: mqtt.Client) -> None:
    while client.loop_misc() == mqtt.MQTT_ERR_SUCCESS:
        await asyncio.sleep(1)


class GrpcDevices:
    """One channel and one ``Connect`` stream per device (as MQTT's one connection each)."""

    def __init__(self, target: str, ids: list[str], meter: Meter) -> None:
        self.target, self.ids, self.meter = target, ids, meter
        self.channels: list[grpc.aio.Channel] = []
        self.calls: dict[str, Any] = {}
        self.readers: list[asyncio.Task[None]] = []

    async def connect(self, device_id: str) -> None:
        channel = grpc.aio.insecure_channel(self.target, options=_CHANNEL_OPTIONS)
        self.channels.append(channel)
        call = self.calls[device_id] = channel.stream_stream(
            f"/{_SERVICE}/Connect",
            request_serializer=pb.Envelope.SerializeToString,
            response_deserializer=pb.Envelope.FromString,
        )()
        await call.write(make_envelope(device_id, register=pb.Register(labels={"kind": "bench"})))
        while kind_of(await asyncio.wait_for(call.read(), 60)) != "welcome":
            pass
        self.readers.append(asyncio.create_task(self._read(call)))

    async def _read(self, call: Any) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
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


Devices = MqttDevices | GrpcDevices


async def _connect_all(devices: Devices) -> float:
    gate = asyncio.Semaphore(CONNECT_LIMIT)

    async def one(device_id: str) -> None:
        async with gate:
            await devices.connect(device_id)

    started = time.monotonic()
    await asyncio.gather(*(one(d) for d in devices.ids))
    return time.monotonic() - started


async def _sleep_until(moment: float) -> None:
    await asyncio.sleep(max(0.0, moment - time.monotonic()))


async def _rate(devices: Devices, start_at: float, seconds: float, rate: float) -> dict[str, Any]:
    """Every device sends one window every ``1/rate`` s; latency is send -> ack."""
    meter = devices.meter
    meter.latencies_ms.clear()
    end = start_at + seconds

    async def device(i: int, device_id: str) -> None:
        await _sleep_until(start_at + i / len(devices.ids) / rate)  # spread over one period
        seq = 0
        while time.monotonic() < end:
            seq += 1
            env = telemetry(device_id, seq)
            meter.sending(env.id)
            await devices.send(device_id, env)
            await asyncio.sleep(1 / rate)

    await asyncio.gather(*(device(i, d) for i, d in enumerate(devices.ids)))
    await _drain(meter, 2.0)
    return {"latencies_ms": list(meter.latencies_ms), "unacked": len(meter.sent)}


async def _ingest(
    devices: Devices, start_at: float, seconds: float, window: int, drain_s: float
) -> dict[str, Any]:
    """Every device keeps ``window`` messages unacknowledged; count acks inside the phase."""
    meter = devices.meter
    meter.sent.clear()
    meter.ack_times.clear()
    end = start_at + seconds
    sent = 0

    async def device(device_id: str) -> None:
        nonlocal sent
        pending: dict[asyncio.Future[None], pb.Envelope] = {}
        seq = 0
        await _sleep_until(start_at)
        while time.monotonic() < end:
            while len(pending) >= window and time.monotonic() < end:
                done, _ = await asyncio.wait(pending, timeout=1, return_when="FIRST_COMPLETED")
                for fut in done:
                    del pending[fut]
                if not done:  # as an agent's outbox does: send again, same id
                    for env in pending.values():
                        await devices.send(device_id, env)
            if len(pending) >= window:
                break
            seq += 1
            env = telemetry(device_id, seq)
            pending[meter.sending(env.id)] = env
            await devices.send(device_id, env)
            sent += 1

    await asyncio.gather(*(device(d) for d in devices.ids))
    await _drain(meter, drain_s)
    in_phase = sum(1 for t in meter.ack_times if start_at <= t < end)
    return {"sent": sent, "acked": len(meter.ack_times), "acked_in_phase": in_phase}


async def _drain(meter: Meter, limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while meter.sent and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


async def _devices(conn: Connection, spec: dict[str, Any]) -> None:
    loop = asyncio.get_running_loop()
    meter = Meter()
    devices: Devices
    if spec["transport"] == "mqtt":
        devices = MqttDevices(spec["target"], spec["ids"], meter, raw=spec["mode"] == "raw")
    else:
        devices = GrpcDevices(spec["target"], spec["ids"], meter)
    while True:
        command, args = await loop.run_in_executor(None, conn.recv)
        if command == "connect":
            conn.send(await _connect_all(devices))
        elif command == "rate":
            conn.send(await _rate(devices, **args))
        elif command == "ingest":
            conn.send(await _ingest(devices, **args))
        else:
            await devices.close()
            conn.send(None)
            return


def devices_main(conn: Connection, spec: dict[str, Any]) -> None:
    """A load-generator process: ``spec`` has transport, mode, target and ids.

    Commands arrive on ``conn`` as ``(name, kwargs)``: ``connect``, ``rate``,
    ``ingest`` and ``close``; each is answered with its result.
    """
    asyncio.run(_devices(conn, spec))


def raw_subscriber_main(conn: Connection, host: str, port: int, topic_filter: str) -> None:
    """One MQTT subscriber (QoS 1) that counts arrivals; answers ``(start, end)`` with counts.

    It reads with the same client and event-loop driving as the hub (LeanClient on
    :class:`protos.paho_loop.PahoLoop`), so the baseline is not held back by a slower
    subscriber than the hub's. Sends ``"ready"`` once subscribed; then each
    ``(start_at, end)`` it receives is answered with ``(arrived in that span, arrived
    in all)``; ``None`` ends it.
    """
    asyncio.run(_raw_subscriber(conn, host, port, topic_filter))


async def _raw_subscriber(conn: Connection, host: str, port: int, topic_filter: str) -> None:
    loop = asyncio.get_running_loop()
    times: list[float] = []
    subscribed = loop.create_future()
    client = LeanClient(
        CallbackAPIVersion.VERSION2, client_id=f"bench-raw-sub-{port}", protocol=mqtt.MQTTv5
    )
    io = PahoLoop(client, f"{host}:{port}")
    await io.connect(lambda: client.connect(host, port, 60), 10.0)
    client.on_message = lambda _c, _u, _m: times.append(time.monotonic())
    client.on_subscribe = lambda *_a: subscribed.done() or subscribed.set_result(None)
    client.on_connect = lambda c, *_a: c.subscribe(topic_filter, qos=1)
    io.watch()
    await asyncio.wait_for(subscribed, 10)
    conn.send("ready")
    while (span := await loop.run_in_executor(None, conn.recv)) is not None:
        start_at, end = span
        conn.send((sum(1 for t in list(times) if start_at <= t < end), len(times)))
    client.disconnect()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(io.closed.wait(), 2)
    io.close()


async def _bare_connect(
    requests: AsyncIterator[bytes], _context: grpc.aio.ServicerContext
) -> AsyncIterator[pb.Envelope]:
    async for payload in requests:
        env = decode_envelope(payload)
        if kind_of(env) == "register":
            yield make_envelope(env.device_id, correlation_id=env.id, welcome=pb.Welcome())
        else:
            ack = pb.Ack(ids=[env.id])
            yield make_envelope(env.device_id, correlation_id=env.id, ack=ack)


async def _bare_server(conn: Connection) -> None:
    server = grpc.aio.server(options=[("grpc.max_concurrent_streams", 10_000)])
    handler = grpc.stream_stream_rpc_method_handler(
        _bare_connect, response_serializer=pb.Envelope.SerializeToString
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(_SERVICE, {"Connect": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    conn.send(port)
    await asyncio.get_running_loop().run_in_executor(None, conn.recv)
    await server.stop(1)


def bare_grpc_main(conn: Connection) -> None:
    """The bare ``grpc.aio`` baseline: decodes each envelope and acks it, storing nothing.

    Sends its port once listening; any message on ``conn`` stops it.
    """
    asyncio.run(_bare_server(conn))


ROLES = {
    "devices": devices_main,
    "raw-subscriber": raw_subscriber_main,
    "bare-grpc": bare_grpc_main,
}
KEY_ENV = "EDGESKILL_BENCH_KEY"


def main() -> None:
    """Run as ``python loadgen.py SOCKET``: connect to the benchmark and play the role it sends."""
    conn = Client(sys.argv[1], "AF_UNIX", authkey=bytes.fromhex(os.environ[KEY_ENV]))
    role, args = conn.recv()
    ROLES[role](conn, *args)


if __name__ == "__main__":
    main()
