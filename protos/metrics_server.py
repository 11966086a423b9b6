"""A Prometheus text endpoint on its own thread, shared by the hub and the agent.

Both sides serve their metrics the same way: one registry per endpoint (so
several hubs or agents in one process never share series), a ``HOST:PORT``
bind address, and a handle that knows its port and stops cleanly. Callers
translate the two errors below into their own package's errors.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client import CollectorRegistry

__all__ = ["MetricsBindError", "MetricsServer", "parse_bind", "start_metrics_server"]

#: How long :meth:`MetricsServer.stop` waits for the serving thread to end.
_JOIN_TIMEOUT_S = 5.0


class MetricsBindError(ValueError):
    """A metrics address that is not ``HOST:PORT`` with a port in 0..65535."""


def parse_bind(bind: str) -> tuple[str, int]:
    """Split ``HOST:PORT`` (``[::1]:PORT`` for IPv6) into its parts; port 0 picks a free one.

    Raises:
        MetricsBindError: no port, a port outside 0..65535, or no host.
    """
    host, sep, port_text = bind.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise MetricsBindError(f"bad metrics address {bind!r}; expected HOST:PORT")
    return host, int(port_text)


class MetricsServer:
    """A running endpoint: the port it listens on, and a way to stop it."""

    def __init__(self, server: WSGIServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread

    @property
    def port(self) -> int:
        """The port it listens on (the one picked when the bind asked for port 0)."""
        return int(self._server.server_port)

    def stop(self) -> None:
        """Stop serving and release the port; blocks until the serving thread ends."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(_JOIN_TIMEOUT_S)


def start_metrics_server(registry: CollectorRegistry, bind: str) -> MetricsServer:
    """Serve ``registry`` as Prometheus text on ``bind`` (``HOST:PORT``), on a daemon thread.

    Raises:
        MetricsBindError: a malformed ``bind``.
        OSError: the address cannot be bound (taken, or not an address of this machine).
    """
    # Its HTTP server (http.server, wsgiref) costs a few MB; a process without an
    # endpoint (an agent without --metrics-bind) never loads it.
    from prometheus_client import start_http_server  # noqa: PLC0415

    host, port = parse_bind(bind)
    server, thread = start_http_server(port, host, registry=registry)
    return MetricsServer(server, thread)
