"""The fetch part of the wire contract: error codes and the MQTT 5 request properties.

Over MQTT a refused fetch is answered with an ``Error`` message whose ``code``
is one of :class:`FetchErrorCode`; over gRPC the same refusal is a status
code (:data:`GRPC_STATUS_NAMES`). A fetch request over MQTT asks for a window
of chunks with the user property :data:`WINDOW_PROPERTY`.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "DEFAULT_WINDOW",
    "GRPC_STATUS_NAMES",
    "MAX_CORRELATION_BYTES",
    "MAX_WINDOW",
    "WINDOW_PROPERTY",
    "FetchErrorCode",
]


class FetchErrorCode(StrEnum):
    """Why the hub refused a fetch."""

    #: The repository has no such file.
    NOT_FOUND = "not-found"
    #: The file is larger than the cap the device or the hub set.
    TOO_LARGE = "too-large"
    #: A bad path, offset or request; asking again gets the same answer.
    REFUSED = "refused"
    #: The device has not registered; it may ask again once it has.
    UNKNOWN_DEVICE = "unknown-device"
    #: The hub serves as many fetches as it allows; ask again in a moment.
    BUSY = "busy"

    @property
    def final(self) -> bool:
        """True when asking again would get the same answer."""
        return self in (FetchErrorCode.TOO_LARGE, FetchErrorCode.REFUSED)


#: The gRPC status (by name, so this module needs no grpc) each refusal is sent as.
GRPC_STATUS_NAMES: dict[FetchErrorCode, str] = {
    FetchErrorCode.NOT_FOUND: "NOT_FOUND",
    FetchErrorCode.TOO_LARGE: "RESOURCE_EXHAUSTED",
    FetchErrorCode.REFUSED: "INVALID_ARGUMENT",
    FetchErrorCode.UNKNOWN_DEVICE: "FAILED_PRECONDITION",
    FetchErrorCode.BUSY: "UNAVAILABLE",
}

#: Longest MQTT 5 correlation data of a fetch request.
MAX_CORRELATION_BYTES = 64
#: MQTT 5 user property of a fetch request: how many chunks to answer with.
WINDOW_PROPERTY = "window"
DEFAULT_WINDOW = 32
MAX_WINDOW = 64
