"""The link emulator shapes real TCP traffic and keeps it intact; the device slowdown says how."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from edgeskill.linkemu import DeviceSlowdown, LinkEmulator, Shape, emulate_in_thread
from edgeskill.processes import wait_until
from tests.support.ports import free_port


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(1 << 16):
            self.request.sendall(data)
        self.request.shutdown(socket.SHUT_WR)


class _Sink(socketserver.BaseRequestHandler):
    """Counts what arrives; after the sender's EOF, answers with the count."""

    def handle(self) -> None:
        server: CountingServer = self.server  # type: ignore[assignment]
        total = 0
        with contextlib.suppress(OSError):  # the flooding client resets at the end
            while data := self.request.recv(1 << 16):
                total += len(data)
                with server.lock:
                    server.received += len(data)
            self.request.sendall(str(total).encode())
            self.request.shutdown(socket.SHUT_WR)


class CountingServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, handler: type[socketserver.BaseRequestHandler]) -> None:
        super().__init__(("127.0.0.1", free_port()), handler)
        self.lock = threading.Lock()
        self.received = 0

    def count(self) -> int:
        with self.lock:
            return self.received


@contextmanager
def serving(handler: type[socketserver.BaseRequestHandler]) -> Iterator[CountingServer]:
    server = CountingServer(handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    while data := sock.recv(1 << 16):
        chunks.append(data)
    return b"".join(chunks)


def test_a_large_random_payload_survives_both_ways_with_jitter_and_loss() -> None:
    payload = os.urandom(4 << 20)
    rough = Shape(rate_bps=40e6, delay_ms=2.0, jitter_ms=3.0, loss=0.02, rto_ms=5.0)
    with (
        serving(_Echo) as echo,
        emulate_in_thread(echo.server_address[:2], up=rough, down=rough, seed=1) as link,
        socket.create_connection(("127.0.0.1", link.port), timeout=20) as sock,
    ):

        def send() -> None:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)

        sender = threading.Thread(target=send)
        sender.start()
        back = read_all(sock)
        sender.join(20)
    assert len(back) == len(payload)
    assert back == payload


def test_throughput_follows_the_set_rate() -> None:
    rate, size = 1e6, 1_000_000
    with (
        serving(_Sink) as sink,
        emulate_in_thread(sink.server_address[:2], up=Shape(rate_bps=rate)) as link,
        socket.create_connection(("127.0.0.1", link.port), timeout=20) as sock,
    ):
        started = time.perf_counter()
        sock.sendall(os.urandom(size))
        sock.shutdown(socket.SHUT_WR)
        answer = read_all(sock)
        elapsed = time.perf_counter() - started
    assert int(answer) == size
    assert 0.7 * rate <= size / elapsed <= 1.3 * rate


def test_each_direction_adds_at_least_its_delay() -> None:
    async def scenario() -> list[float]:
        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while data := await reader.read(1024):
                writer.write(data)
                await writer.drain()
            writer.close()

        server = await asyncio.start_server(echo, "127.0.0.1", free_port())
        target = server.sockets[0].getsockname()[:2]
        emulator = LinkEmulator(
            target, up=Shape(delay_ms=40.0), down=Shape(delay_ms=25.0), port=free_port()
        )
        async with server, emulator:
            reader, writer = await asyncio.open_connection("127.0.0.1", emulator.port)
            rounds = []
            async with asyncio.timeout(10):
                for _ in range(5):
                    started = time.perf_counter()
                    writer.write(b"p")
                    await writer.drain()
                    assert await reader.readexactly(1) == b"p"
                    rounds.append((time.perf_counter() - started) * 1000)
            writer.close()
        return rounds

    rounds = asyncio.run(scenario())
    assert min(rounds) >= 65.0
    assert max(rounds) < 65.0 + 200.0  # generous: loaded test machines


def test_a_rate_change_mid_stream_takes_effect() -> None:
    slow, fast = Shape(rate_bps=100e3), Shape(rate_bps=2e6)
    stop = threading.Event()
    with (
        serving(_Sink) as sink,
        emulate_in_thread(sink.server_address[:2], up=slow) as link,
        socket.create_connection(("127.0.0.1", link.port), timeout=20) as sock,
    ):

        def flood() -> None:
            chunk = os.urandom(16384)
            with contextlib.suppress(OSError):  # the test shuts the socket to stop it
                while not stop.is_set():
                    sock.sendall(chunk)

        sender = threading.Thread(target=flood)
        sender.start()
        try:
            wait_until(lambda: sink.count() >= 20_000, 5.0, "the first bytes", 0.01)
            start, before = time.perf_counter(), sink.count()
            wait_until(lambda: sink.count() >= before + 50_000, 5.0, "50 kB at 100 kB/s", 0.01)
            slow_rate = (sink.count() - before) / (time.perf_counter() - start)
            link.set_shape(up=fast)  # from this thread, while the proxy's loop runs in another
            start, before = time.perf_counter(), sink.count()
            # 1 MB: 10 s at the old rate, 0.5 s at the new one
            wait_until(lambda: sink.count() >= before + 1_000_000, 4.0, "1 MB at 2 MB/s", 0.01)
            fast_rate = (sink.count() - before) / (time.perf_counter() - start)
        finally:
            stop.set()
            sock.shutdown(socket.SHUT_RDWR)
            sender.join(10)
    assert 50e3 <= slow_rate <= 200e3
    assert fast_rate >= 5 * slow_rate


def test_a_refused_target_closes_the_client() -> None:
    closed_port = free_port()  # nothing listens there
    with (
        emulate_in_thread(("127.0.0.1", closed_port)) as link,
        socket.create_connection(("127.0.0.1", link.port), timeout=10) as sock,
    ):
        assert sock.recv(1) == b""


def test_shapes_validate_themselves() -> None:
    with pytest.raises(ValueError, match="loss"):
        Shape(loss=1.5)
    with pytest.raises(ValueError, match="rate_bps"):
        Shape(rate_bps=0)
    with pytest.raises(ValueError, match="delay_ms"):
        Shape(delay_ms=-1)


def test_device_slowdown_says_which_method_ran() -> None:
    with DeviceSlowdown(4.0) as slowdown:
        if slowdown.method == "scaled-time":
            assert slowdown.device_ms(10.0) == 40.0
            assert "scaling measured time" in slowdown.describe()
        else:
            assert slowdown.method == "cgroup-cpu-quota"
            assert slowdown.device_ms(10.0) == 10.0
            assert "cgroup v2" in slowdown.describe()
    assert DeviceSlowdown(1.0).method == "none"
    with pytest.raises(ValueError, match="factor"):
        DeviceSlowdown(0.5)


def test_device_slowdown_writes_a_cpu_quota_into_a_cgroup_v2_tree(tmp_path: Path) -> None:
    # A stand-in for a delegated cgroup v2 directory: the files the kernel would show.
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    (tmp_path / "cgroup.subtree_control").write_text("")
    with DeviceSlowdown(4.0, parent=tmp_path, name="head") as slowdown:
        assert slowdown.method == "cgroup-cpu-quota"
        assert (tmp_path / "head" / "cpu.max").read_text() == "25000 100000"
        assert (tmp_path / "cgroup.subtree_control").read_text() == "+cpu"
        slowdown.throttle(4242)
        assert (tmp_path / "head" / "cgroup.procs").read_text() == "4242"
        assert slowdown.device_ms(10.0) == 10.0


def test_device_slowdown_falls_back_without_the_cpu_controller(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("memory pids\n")
    slowdown = DeviceSlowdown(16.0, parent=tmp_path)
    assert slowdown.method == "scaled-time"
    assert "cpu controller" in slowdown.reason
    assert slowdown.device_ms(1.5) == 24.0
