"""Transports from the agent to its hub, chosen by URL scheme."""

from __future__ import annotations

from urllib.parse import urlsplit

from edge_agent.errors import TransportError
from edge_agent.transport.base import AgentTransport, FetchAborted, FetchLimits

__all__ = ["AgentTransport", "FetchAborted", "FetchLimits", "open_transport"]


def open_transport(url: str, device_id: str) -> AgentTransport:
    """Make an (unconnected) transport for ``grpc://host:port`` or ``mqtt://host:port``.

    Raises:
        TransportError: the scheme is unknown or the URL has no host.
    """
    parts = urlsplit(url)
    if not parts.hostname:
        raise TransportError(f"hub URL {url!r} has no host")
    if parts.scheme == "grpc":
        from edge_agent.transport.grpc import GrpcAgentTransport  # noqa: PLC0415 - per scheme

        return GrpcAgentTransport(f"{parts.hostname}:{parts.port or 7443}", device_id)
    if parts.scheme in ("mqtt", "mqtts"):
        from edge_agent.transport.mqtt import MqttAgentTransport  # noqa: PLC0415 - per scheme

        return MqttAgentTransport(url, device_id)
    raise TransportError(
        f"unknown hub URL scheme {parts.scheme!r}; use grpc://, mqtt:// or mqtts://"
    )
