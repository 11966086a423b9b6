"""Errors of the wire layer."""


class ProtocolError(Exception):
    """A message on the wire is malformed, oversized or of an unknown kind (the peer's fault)."""
