"""Exception roots of the edge agent.

:class:`TransportError` is the wire layer's (:mod:`protos.errors`), re-exported
here: it is not an :class:`AgentError`, so code that reports agent failures
catches ``(AgentError, TransportError)``.
"""

from protos.errors import TransportError

__all__ = [
    "AgentError",
    "HealthCheckError",
    "InferRefusedError",
    "InputError",
    "InstallError",
    "OutboxError",
    "RuntimeBackendError",
    "SandboxError",
    "TransportError",
]


class AgentError(Exception):
    """Root of everything the agent raises."""


class InstallError(AgentError):
    """A skill version could not be installed or switched to."""


class HealthCheckError(InstallError):
    """A newly installed skill version failed its health check."""


class SandboxError(AgentError):
    """A skill's control process crashed, timed out or broke the pipe protocol."""


class RuntimeBackendError(AgentError):
    """No model variant or inference backend fits this device, or inference failed."""


class OutboxError(AgentError):
    """The durable outbox could not store or read a message."""


class InferRefusedError(TransportError):
    """The hub answered a split or joint inference request with a refusal.

    Asking again with the same request gets the same answer (unknown skill, model
    or cut, not entitled, malformed or over a cap) or, for ``resource-exhausted``,
    not before the hub's load drops; the device finishes on its own.

    Attributes:
        reason: What the hub said.
        code: The refusal's kind: ``not-found``, ``permission-denied``,
            ``invalid-argument`` or ``resource-exhausted`` (``""`` when not given).
    """

    def __init__(self, reason: str, code: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


class InputError(AgentError):
    """An input for a skill (an image, a WAV file, a text file, a camera) cannot be read."""
