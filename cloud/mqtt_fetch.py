"""Fetch over MQTT 5 on the hub's side: one window of chunks per request, or an error.

The agent names a response topic, correlation data and a window size (a user
property); the hub answers with up to that many chunks from the requested
offset, each carrying the correlation data, and the agent asks again from
where the window ended. Windows keep what sits in the broker's queues bounded.
"""

from __future__ import annotations

from collections.abc import Callable

from paho.mqtt.properties import Properties

from cloud.fetch_serving import FileChunks, next_chunk
from protos import pb
from protos.fetch import DEFAULT_WINDOW, WINDOW_PROPERTY, FetchErrorCode
from protos.paho_loop import publish_properties
from protos.topics import CHUNK_CONTENT_TYPE, ERROR_CONTENT_TYPE

__all__ = ["FetchReply", "requested_window"]

_MAX_ERROR_MESSAGE = 1000
Publish = Callable[[str, bytes, Properties], bool]


def requested_window(user: tuple[tuple[str, str], ...], cap: int) -> int:
    """The window the request asks for (its ``window`` user property), within 1..cap."""
    for key, value in user:
        if key == WINDOW_PROPERTY and value.isascii() and value.isdigit() and len(value) <= 6:
            return max(1, min(int(value), cap))
    return min(DEFAULT_WINDOW, cap)


class FetchReply:
    """Publishes the answer to one request on its response topic, with its correlation data."""

    def __init__(self, publish: Publish, topic: str, corr: bytes) -> None:
        self._publish, self._topic, self._corr = publish, topic, corr

    def _props(self, content_type: str) -> Properties:
        return publish_properties(correlation=self._corr, content_type=content_type)

    def error(self, code: FetchErrorCode, message: str) -> bool:
        """Refuse the request.

        Returns:
            False when the publish was refused.
        """
        body = pb.Error(code=code, message=message[:_MAX_ERROR_MESSAGE]).SerializeToString()
        return self._publish(self._topic, body, self._props(ERROR_CONTENT_TYPE))

    async def chunks(self, chunks: FileChunks, offset: int, size: int, window: int) -> bool:
        """Publish up to ``window`` chunks from ``offset``; the last one of the file says so.

        Returns:
            False when a publish was refused (the agent will ask again).
        """
        props = self._props(CHUNK_CONTENT_TYPE)
        for _ in range(window):
            data = await next_chunk(chunks)  # file reads off the loop
            if data is None and offset < size:
                return True  # the file shrank under us; the agent's checks catch it
            data = data or b""
            offset += len(data)
            chunk = pb.FetchChunk(
                offset=offset - len(data), data=data, total_size=size, last=offset >= size
            )
            if not self._publish(self._topic, chunk.SerializeToString(), props):
                return False
            if chunk.last:
                break
        return True
