"""PahoLoop's writes, against the test broker: end of turn, joined, and watched only when full."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import uuid
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from protos.paho_loop import LeanClient, PahoLoop
from tests.support.services import mqtt_host_port


class _Counted:
    """The running loop's add_writer / remove_writer, counted for one socket."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop, self.sock = loop, None
        self.added = self.removed = 0
        self._add, self._remove = loop.add_writer, loop.remove_writer

    def add_writer(self, fd: Any, *args: Any) -> None:
        self.added += fd is self.sock
        self._add(fd, *args)

    def remove_writer(self, fd: Any) -> bool:
        self.removed += fd is self.sock
        return self._remove(fd)


async def _connected() -> tuple[LeanClient, PahoLoop, asyncio.Queue[bytes], str]:
    host, port = mqtt_host_port()
    topic = f"test/paho-loop/{uuid.uuid4().hex}"
    client = LeanClient(
        CallbackAPIVersion.VERSION2, client_id=f"t-{uuid.uuid4().hex[:12]}", protocol=mqtt.MQTTv5
    )
    io = PahoLoop(client, f"{host}:{port}")
    await io.connect(lambda: client.connect(host, port, 60), 10.0)
    arrived: asyncio.Queue[bytes] = asyncio.Queue()
    subscribed = asyncio.get_running_loop().create_future()
    client.on_message = lambda _c, _u, m: arrived.put_nowait(bytes(m.payload))
    client.on_subscribe = lambda *_a: subscribed.done() or subscribed.set_result(None)
    client.on_connect = lambda c, *_a: c.subscribe(topic, qos=1)
    io.watch()
    await asyncio.wait_for(subscribed, 10)
    return client, io, arrived, topic


async def _close(client: LeanClient, io: PahoLoop) -> None:
    client.disconnect()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(io.closed.wait(), 5)
    io.close()


def test_packets_queued_in_one_turn_go_in_one_send_without_watching_the_socket() -> None:
    async def main() -> tuple[int, int, int, list[bytes]]:
        loop = asyncio.get_running_loop()
        client, io, arrived, topic = await _connected()
        counted = _Counted(loop)
        counted.sock = client.socket()
        loop.add_writer, loop.remove_writer = counted.add_writer, counted.remove_writer  # type: ignore[method-assign]
        sends = 0
        real_send = client._sock_send

        def send(buf: bytes) -> int:
            nonlocal sends
            sends += 1
            return real_send(buf)

        client._sock_send = send  # type: ignore[method-assign]
        for i in range(50):  # one turn of the loop
            client.publish(topic, f"m{i}".encode(), qos=1)
        assert sends == 0  # nothing is written inside publish: at the end of the turn
        got = [await asyncio.wait_for(arrived.get(), 10) for _ in range(50)]
        added, removed = counted.added, counted.removed  # before closing lets go of it all
        await _close(client, io)
        return sends, added, removed, got

    sends, added, removed, got = asyncio.run(main())
    assert got == [f"m{i}".encode() for i in range(50)]
    # The 50 PUBLISHes left in one send (their PUBACKs for the echoes in a few more),
    # and the socket, which had room, was never registered for writability.
    assert 1 <= sends <= 10
    assert (added, removed) == (0, 0)


def test_a_full_socket_is_watched_until_it_drains_and_then_let_go() -> None:
    async def main() -> tuple[int, int, bool, bytes]:
        loop = asyncio.get_running_loop()
        client, io, arrived, topic = await _connected()
        sock = client.socket()
        assert isinstance(sock, socket.socket)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # fills at once
        counted = _Counted(loop)
        counted.sock = sock
        loop.add_writer, loop.remove_writer = counted.add_writer, counted.remove_writer  # type: ignore[method-assign]
        payload = b"x" * (2 * 1024 * 1024)
        client.publish(topic, payload, qos=1)
        got = await asyncio.wait_for(arrived.get(), 30)
        added, removed, watching = counted.added, counted.removed, io._watching_write
        await _close(client, io)
        return added, removed, watching, got

    added, removed, watching, got = asyncio.run(main())
    assert got == b"x" * (2 * 1024 * 1024)
    assert added >= 1 and removed >= 1  # watched while full, let go once drained
    assert not watching
