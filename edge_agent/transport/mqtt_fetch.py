"""Fetch over MQTT 5 on the agent's side: the window request and checks on each reply.

A fetch is a series of windows. Each window is one request (response topic,
correlation data, a ``window`` user property) answered by up to that many
chunks; the transport asks for the next window from where the last one ended.
"""

from __future__ import annotations

import contextlib

from paho.mqtt.properties import Properties

from edge_agent.errors import TransportError
from edge_agent.transport.base import FetchAborted, FetchBusy
from protos import pb
from protos.fetch import WINDOW_PROPERTY, FetchErrorCode
from protos.paho_loop import publish_properties
from protos.topics import ERROR_CONTENT_TYPE, Topics

__all__ = ["MAX_CHUNK_BYTES", "read_chunk", "window_request"]

_FINAL_CODES = frozenset(code.value for code in FetchErrorCode if code.final)
#: Largest chunk accepted; the broker is also told not to send bigger packets at all.
MAX_CHUNK_BYTES = 1024 * 1024


def window_request(
    topics: Topics, device_id: str, corr: bytes, req: pb.FetchRequest, window: int
) -> tuple[str, bytes, Properties]:
    """Topic, payload and properties of one window request.

    Raises:
        ProtocolError: a bad device id.
    """
    props = publish_properties(
        response_topic=topics.down(device_id, "fetch"),
        correlation=corr,
        user=((WINDOW_PROPERTY, str(window)),),
    )
    return topics.up(device_id, "fetch"), req.SerializeToString(), props


def read_chunk(
    content_type: str, payload: bytes, path: str, offset: int, max_bytes: int
) -> pb.FetchChunk:
    """Check one reply to a window request.

    Args:
        content_type: the reply's MQTT 5 content type.
        payload: the reply.
        path: the file asked for, for messages.
        offset: the next byte the agent needs.
        max_bytes: the agent's cap on the file.

    Returns:
        The chunk; one with an offset below ``offset`` is a redelivery to skip.

    Raises:
        FileNotFoundError: the hub has no such file.
        FetchAborted: the hub refused, or the file or a chunk is over a cap.
        TransportError: garbage, a gap (a lost chunk), or another refusal.
    """
    if content_type == ERROR_CONTENT_TYPE:
        raise _refusal(path, payload)
    chunk = pb.FetchChunk()
    try:
        chunk.ParseFromString(payload)
    except Exception as exc:  # protobuf raises DecodeError and, for some input, others
        raise TransportError(f"bad fetch chunk for {path}") from exc
    if len(chunk.data) > MAX_CHUNK_BYTES:
        raise FetchAborted(f"a chunk of {path} is over the {MAX_CHUNK_BYTES} byte cap")
    if chunk.total_size > max_bytes:
        raise FetchAborted(f"{path} is larger than the {max_bytes} byte cap")
    if chunk.offset > offset:
        raise TransportError(f"chunk of {path} at {chunk.offset}, expected {offset}")
    return chunk


def _refusal(path: str, payload: bytes) -> Exception:
    err = pb.Error()
    with contextlib.suppress(Exception):  # an unreadable refusal is still a refusal
        err.ParseFromString(payload)
    if err.code == FetchErrorCode.NOT_FOUND:
        return FileNotFoundError(path)
    if err.code == FetchErrorCode.BUSY:
        return FetchBusy(f"the hub is busy; {path} is asked for again")
    if err.code in _FINAL_CODES:  # asking again would get the same answer
        return FetchAborted(f"the hub refused {path}: {err.message[:500]}")
    return TransportError(f"the hub refused the fetch of {path}: {err.code} {err.message[:500]}")
