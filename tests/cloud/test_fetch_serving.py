"""Serving a repository file in chunks: the first is read as the file opens."""

from __future__ import annotations

import asyncio
import io
from typing import Any

import pytest

from cloud import fetch_serving
from cloud.fetch_serving import FileChunks, next_chunk


class Counted(io.BytesIO):
    """A file that counts its reads."""

    reads = 0

    def read(self, size: int | None = -1, /) -> bytes:
        self.reads += 1
        return super().read(size)


def hops(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record each worker-thread hop :func:`next_chunk` takes."""
    made: list[str] = []
    real = asyncio.to_thread

    async def counted(fn: Any, /, *args: Any) -> Any:
        made.append(getattr(fn, "__name__", repr(fn)))
        return await real(fn, *args)

    monkeypatch.setattr(fetch_serving.asyncio, "to_thread", counted)
    return made


def test_a_one_chunk_file_is_served_without_a_hop_and_closed_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made = hops(monkeypatch)
    fh = Counted(b"metadata" * 10)
    chunks = FileChunks(fh, 1024)
    assert fh.reads == 1 and fh.closed  # read whole as it opened

    async def serve() -> list[bytes | None]:
        return [await next_chunk(chunks), await next_chunk(chunks)]

    assert asyncio.run(serve()) == [b"metadata" * 10, None]
    assert made == ["next"]  # only the question "is there more?", answered from a closed file


def test_a_larger_file_hands_out_its_first_chunk_then_reads_the_rest_off_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made = hops(monkeypatch)
    data = bytes(range(256)) * 40  # 10,240 bytes: 3 chunks of 4,096
    fh = Counted(data)
    fh.seek(100)
    chunks = FileChunks(fh, 4096)

    async def serve() -> list[bytes]:
        got = []
        while (chunk := await next_chunk(chunks)) is not None:
            got.append(chunk)
        return got

    got = asyncio.run(serve())
    assert b"".join(got) == data[100:] and [len(c) for c in got] == [4096, 4096, 1948]
    assert made == ["next", "next", "next"]  # the second, the third, and the end
    assert fh.closed


def test_file_chunks_iterate_as_before_and_close_drops_what_was_read() -> None:
    data = b"x" * 5000
    assert b"".join(FileChunks(io.BytesIO(data), 1000)) == data
    fh = io.BytesIO(data)
    chunks = FileChunks(fh, 1000)
    chunks.close()
    assert fh.closed and chunks.take_ready() is None and list(chunks) == []
    empty = FileChunks(io.BytesIO(b""), 1000)
    assert empty.take_ready() is None and list(empty) == []
