"""Exception roots of the hub.

:class:`TransportError` is the wire layer's (:mod:`protos.errors`), re-exported
here: it is not a :class:`HubError`, so code that reports hub failures catches
``(HubError, TransportError)``.
"""

from protos.errors import TransportError
from protos.fetch import FetchErrorCode

__all__ = [
    "AuthError",
    "ConflictError",
    "FetchRefusedError",
    "FetchTooLargeError",
    "FetchUnknownDeviceError",
    "HubError",
    "IdentityMismatchError",
    "IllegalTransitionError",
    "NotFoundError",
    "PermissionDeniedError",
    "SessionRefusedError",
    "StoreError",
    "TransportError",
    "ValidationError",
]


class HubError(Exception):
    """Root of everything the hub raises."""


class StoreError(HubError):
    """The registry store failed or refused a change."""


class NotFoundError(StoreError):
    """A record that was asked for does not exist."""


class ConflictError(StoreError):
    """A change collides with what exists (an immutable version re-pushed, a duplicate name)."""


class ValidationError(HubError):
    """Input from a user or a device is malformed (selector, label, version)."""


class IllegalTransitionError(ValidationError):
    """A drift incident was asked to move to a stage it cannot reach from where it is."""


class AuthError(HubError):
    """A console request carries no valid API token (unknown, revoked or expired)."""


class PermissionDeniedError(HubError):
    """A principal's role, project or group scope does not allow what it asked for."""


class IdentityMismatchError(HubError):
    """A connection whose client certificate names one device tried to act as another."""


class SessionRefusedError(HubError):
    """A connection must end: its first message was not a valid register."""


class FetchRefusedError(HubError):
    """The hub will not serve a fetch: a bad path, offset or request (the device's fault).

    Attributes:
        code: the wire code the refusal is sent with.
    """

    code = FetchErrorCode.REFUSED


class FetchTooLargeError(FetchRefusedError):
    """The file asked for is over the device's or the hub's cap."""

    code = FetchErrorCode.TOO_LARGE


class FetchUnknownDeviceError(FetchRefusedError):
    """A device that never registered asked for a file."""

    code = FetchErrorCode.UNKNOWN_DEVICE
