"""Transports from the agent to its hub, chosen by URL scheme."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from edge_agent.errors import TransportError
from edge_agent.transport.base import AgentTransport, FetchAborted, FetchLimits

__all__ = ["AgentTransport", "FetchAborted", "FetchLimits", "open_transport"]


def open_transport(
    url: str,
    device_id: str,
    *,
    ca: Path | None = None,
    cert: Path | None = None,
    key: Path | None = None,
) -> AgentTransport:
    """Make an (unconnected) transport for ``grpc://``, ``grpcs://``, ``mqtt://`` or ``mqtts://``.

    Args:
        url: the hub, such as ``grpcs://hub.example:7443``.
        device_id: this device's id.
        ca: PEM CA certificate the hub's certificate must chain to (``grpcs://`` only;
            default the system's roots).
        cert: PEM client certificate naming this device, for hubs that require mTLS.
        key: the client certificate's PEM private key.

    Raises:
        TransportError: the scheme is unknown, the URL has no host, TLS files are
            given for a scheme that does not take them, or they cannot be read.
    """
    parts = urlsplit(url)
    if not parts.hostname:
        raise TransportError(f"hub URL {url!r} has no host")
    tls_given = any(p is not None for p in (ca, cert, key))
    if tls_given and parts.scheme not in ("grpcs", "mqtts"):
        raise TransportError("--ca, --cert and --key apply to grpcs:// and mqtts:// hubs only")
    if parts.scheme in ("grpc", "grpcs"):
        from edge_agent.transport.grpc import (  # noqa: PLC0415 - per scheme
            GrpcAgentTransport,
            tls_credentials,
        )

        target = f"{parts.hostname}:{parts.port or 7443}"
        if parts.scheme == "grpc":
            return GrpcAgentTransport(target, device_id)
        creds = tls_credentials(ca=ca, cert=cert, key=key)
        return GrpcAgentTransport(target, device_id, credentials=creds)
    if parts.scheme in ("mqtt", "mqtts"):
        from edge_agent.transport.mqtt import MqttAgentTransport  # noqa: PLC0415 - per scheme

        return MqttAgentTransport(url, device_id, ca=ca, cert=cert, key=key)
    raise TransportError(
        f"unknown hub URL scheme {parts.scheme!r}; use grpc://, grpcs://, mqtt:// or mqtts://"
    )
