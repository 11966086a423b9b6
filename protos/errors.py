"""Errors of the wire layer, shared by the hub and the agent.

Each name is defined here once; ``cloud.errors`` and ``edge_agent.errors``
re-export :class:`TransportError` so each side can import it from its own
error module.
"""

__all__ = ["ProtocolError", "TransportError"]


class ProtocolError(Exception):
    """A message on the wire is malformed, oversized or of an unknown kind (the peer's fault)."""


class TransportError(Exception):
    """A connection failed, timed out or was refused, or its settings cannot be used.

    Raised on both sides of the wire: by the agent's transports (hub unreachable,
    stream lost, TLS files unreadable) and by the hub's servers (broker
    unreachable, an address that cannot be bound).
    """
