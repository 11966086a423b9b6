"""Serving the console with uvicorn inside the caller's asyncio loop (the hub process's).

A non-loopback bind address needs TLS (a certificate and key) unless the caller
says ``insecure``: API tokens travel in every request, so plain HTTP is only
for a closed test network, and then a loud warning is logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from pathlib import Path

import uvicorn

from cloud.console.app import create_app
from cloud.errors import ValidationError
from cloud.service import FleetService

__all__ = ["ConsoleServer", "parse_bind", "start_console"]

_log = logging.getLogger(__name__)
#: Seconds the server may take to start listening.
START_TIMEOUT_S = 10.0
#: Seconds open connections (live streams) get to finish when the server stops.
STOP_GRACE_S = 2.0


def parse_bind(bind: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) as a host and a port (0: any free port).

    Raises:
        ValidationError: Not HOST:PORT, or a port outside 0..65535.
    """
    host, sep, port = bind.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValidationError(f"bad console bind {bind!r}: expected HOST:PORT")
    return host, int(port)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signals to the process it runs in (the hub's)."""

    def capture_signals(self) -> contextlib.AbstractContextManager[None]:  # type: ignore[override]
        return contextlib.nullcontext()


class ConsoleServer:
    """A running console; :meth:`stop` ends it."""

    def __init__(
        self, server: uvicorn.Server, task: asyncio.Task[None], sock: socket.socket
    ) -> None:
        """Wrap a started uvicorn server, the task serving it and its listening socket."""
        self._server = server
        self._task = task
        self._sock = sock

    @property
    def port(self) -> int:
        """The port the console listens on."""
        return int(self._sock.getsockname()[1])

    @property
    def scheme(self) -> str:
        """``https`` with TLS, else ``http``."""
        return "https" if self._server.config.ssl_certfile else "http"

    async def stop(self) -> None:
        """Stop serving: live streams get :data:`STOP_GRACE_S` to end, then are cut."""
        self._server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), STOP_GRACE_S + 3)
        except TimeoutError:
            self._server.force_exit = True
            self._task.cancel()
        finally:
            self._sock.close()


async def start_console(
    fleet: FleetService,
    bind: str,
    *,
    tls_cert: Path | None = None,
    tls_key: Path | None = None,
    insecure: bool = False,
) -> ConsoleServer:
    """Serve the console of ``fleet`` on ``bind`` in the running loop until stopped.

    Raises:
        ValidationError: A bad bind address, one half of a TLS pair, or a non-loopback
            address without TLS and without ``insecure``.
        OSError: The address cannot be bound.
    """
    host, port = parse_bind(bind)
    if (tls_cert is None) != (tls_key is None):
        raise ValidationError("the console's TLS needs both a certificate and a key")
    if tls_cert is None and not _loopback(host):
        if not insecure:
            raise ValidationError(
                f"refusing to serve the console on {bind} without TLS: API tokens would "
                "cross the network in clear; give a TLS certificate and key, bind "
                "127.0.0.1, or pass --insecure on a closed test network"
            )
        _log.warning(
            "INSECURE: the console serves plain HTTP on %s; anyone on the network can "
            "read API tokens. Use it only on a closed test network.",
            bind,
        )
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    config = uvicorn.Config(
        create_app(fleet),
        log_level="warning",
        access_log=False,
        lifespan="off",
        ssl_certfile=str(tls_cert) if tls_cert else None,
        ssl_keyfile=str(tls_key) if tls_key else None,
        timeout_graceful_shutdown=int(STOP_GRACE_S),
        server_header=False,
    )
    server = _Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]), name="console")
    deadline = asyncio.get_running_loop().time() + START_TIMEOUT_S
    while not server.started:
        if task.done():
            sock.close()
            task.result()
            raise ValidationError(f"the console did not start on {bind}")
        if asyncio.get_running_loop().time() > deadline:
            server.should_exit = True
            sock.close()
            raise ValidationError(f"the console did not start on {bind} in {START_TIMEOUT_S} s")
        await asyncio.sleep(0.02)
    _log.info("console serving on %s://%s:%d", "https" if tls_cert else "http", host, port)
    return ConsoleServer(server, task, sock)
