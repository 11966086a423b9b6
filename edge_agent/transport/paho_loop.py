"""Drive a paho-mqtt client from the asyncio event loop instead of paho's network thread.

paho's own thread waits with ``select()``, which cannot watch a descriptor numbered
1024 or more (so hundreds of connections in one process starve), and it costs a
thread per connection. Here the socket is watched with the loop's ``add_reader`` and
``add_writer`` and a task runs paho's keepalive about once a second. Only paho's
blocking connect (TCP connect, TLS handshake) runs on a worker thread, while no
callback is installed; after :meth:`PahoLoop.watch` every paho call and callback
happens on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Callable

import paho.mqtt.client as mqtt

from edge_agent.errors import TransportError

__all__ = ["PahoLoop"]

_MISC_INTERVAL_S = 1.0


class PahoLoop:
    """The network I/O of one paho client, run on the running event loop.

    Args:
        client: a paho client with no socket callbacks of its own.
        name: what to call the broker in error messages (a redacted URL).
    """

    def __init__(self, client: mqtt.Client, name: str) -> None:
        self._client = client
        self._name = name
        self._loop = asyncio.get_running_loop()
        self._sock: socket.socket | None = None
        self._misc: asyncio.Task[None] | None = None
        #: Set once paho has closed the socket (a DISCONNECT sent, or the connection lost).
        self.closed = asyncio.Event()

    async def connect(self, connect: Callable[[], mqtt.MQTTErrorCode], timeout_s: float) -> None:
        """Run paho's blocking ``connect`` (bound to its arguments) on a worker thread.

        Install paho's callbacks after this returns, then call :meth:`watch`: a callback
        installed earlier could run on the worker thread.

        Raises:
            TransportError: the broker is unreachable or did not answer in time.
        """
        connecting = self._loop.run_in_executor(None, connect)
        try:
            async with asyncio.timeout(timeout_s):
                rc = await asyncio.shield(connecting)
        except BaseException as exc:
            if not connecting.done():  # the thread goes on: close what it opens once it ends
                connecting.add_done_callback(self._abandon)
            if isinstance(exc, OSError | ValueError):  # TimeoutError is an OSError
                reason = str(exc) or "no answer in time"
                raise TransportError(f"cannot reach the broker at {self._name}: {reason}") from exc
            raise
        sock = self._client.socket()
        if rc != mqtt.MQTT_ERR_SUCCESS or not isinstance(sock, socket.socket):
            self.close()
            reason = mqtt.error_string(rc) if rc else "connection closed"
            raise TransportError(f"cannot reach the broker at {self._name}: {reason}")
        self._sock = sock

    def watch(self) -> None:
        """Hand the connected socket to the event loop and start the keepalive task."""
        sock, client, loop = self._sock, self._client, self._loop
        if sock is None or self.closed.is_set():
            return
        # paho never sets it; Nagle adds tens of ms to small request/response traffic.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client.on_socket_close = lambda _c, _u, _s: self._unwatch()
        client.on_socket_register_write = lambda _c, _u, _s: self._want_write()
        client.on_socket_unregister_write = lambda _c, _u, _s: self._done_writing()
        loop.add_reader(sock, self._readable)
        if client.want_write():  # part of the CONNECT is still unsent
            self._want_write()
        self._misc = loop.create_task(self._keep_alive())

    def close(self) -> None:
        """Stop watching and close the socket if paho has not; safe to call twice."""
        if self._misc is not None:
            self._misc.cancel()
        sock = self._client.socket()
        if isinstance(sock, socket.socket) and sock.fileno() >= 0:
            self._unwatch()
            sock.close()
        self.closed.set()

    def _readable(self) -> None:
        client, sock = self._client, self._sock
        client.loop_read()
        # TLS may hold whole packets already taken off the socket, which no poll reports.
        while isinstance(sock, ssl.SSLSocket) and sock.pending() and client.socket() is sock:
            client.loop_read()

    def _writable(self) -> None:
        self._client.loop_write()
        if not self._client.want_write():  # in case paho did not know it was watched
            self._done_writing()

    def _want_write(self) -> None:
        sock = self._sock
        if self._client.socket() is not sock or sock is None:
            return  # closed already
        self._loop.add_writer(sock, self._writable)

    def _done_writing(self) -> None:
        if self._sock is not None and self._sock.fileno() >= 0:
            self._loop.remove_writer(self._sock)

    def _unwatch(self) -> None:
        """Stop watching the socket; paho calls this just before it closes it."""
        sock, self._sock = self._sock, None
        if sock is not None and sock.fileno() >= 0 and not self._loop.is_closed():
            self._loop.remove_reader(sock)
            self._loop.remove_writer(sock)
        self.closed.set()

    async def _keep_alive(self) -> None:
        # Pings, and the keepalive deadline that paho's own loop would check each second.
        while self._client.loop_misc() == mqtt.MQTT_ERR_SUCCESS:
            await asyncio.sleep(_MISC_INTERVAL_S)

    def _abandon(self, connecting: asyncio.Future[mqtt.MQTTErrorCode]) -> None:
        """Close the socket of a connect given up on while its thread still ran."""
        if not connecting.cancelled():
            connecting.exception()  # retrieved: it was reported as a timeout already
        sock = self._client.socket()
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()
        self.closed.set()
