"""Single-key reads coalesced into batch calls (the hub's desired-state reads)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from cloud.batched_reads import BatchedReads


class Table:
    """A blocking read of many keys that records each call; a gate can hold a call."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail_call: Exception | None = None
        self.fail_keys: dict[str, Exception] = {}

    def read_many(self, keys: list[str]) -> dict[str, str | Exception]:
        self.calls.append(list(keys))
        self.gate.wait(10)
        if self.fail_call is not None:
            raise self.fail_call
        return {k: self.fail_keys.get(k, f"value of {k}") for k in keys if k != "absent"}


def test_reads_asked_together_are_one_call_and_each_caller_gets_its_own_value() -> None:
    table = Table()
    reads: BatchedReads[str, str] = BatchedReads(table.read_many)

    async def main() -> list[str]:
        return await asyncio.gather(*(reads.get(f"dev-{i}") for i in range(50)), reads.get("dev-7"))

    values = asyncio.run(main())
    assert values == [f"value of dev-{i}" for i in range(50)] + ["value of dev-7"]
    assert len(table.calls) == 1 and sorted(table.calls[0]) == sorted(f"dev-{i}" for i in range(50))
    assert (reads.calls, reads.keys_read) == (1, 50)


def test_keys_asked_during_a_read_go_in_the_next_call_and_batches_are_capped() -> None:
    table = Table()
    reads: BatchedReads[str, str] = BatchedReads(table.read_many, max_keys=4)

    async def main() -> None:
        table.gate.clear()
        first = asyncio.ensure_future(reads.get("a"))
        while not table.calls:  # the first read is running and held
            await asyncio.sleep(0.001)
        later = [asyncio.ensure_future(reads.get(k)) for k in "bcdefg"]
        await asyncio.sleep(0.01)
        assert len(table.calls) == 1  # nobody else read while the first call ran
        table.gate.set()
        assert await first == "value of a"
        assert [await t for t in later] == [f"value of {k}" for k in "bcdefg"]

    asyncio.run(main())
    assert table.calls == [["a"], ["b", "c", "d", "e"], ["f", "g"]]


def test_a_failed_call_fails_its_batch_only_and_a_key_error_fails_its_key_only() -> None:
    table = Table()
    reads: BatchedReads[str, str] = BatchedReads(table.read_many)

    async def main() -> None:
        table.fail_call = OSError("database gone")
        results = await asyncio.gather(reads.get("a"), reads.get("b"), return_exceptions=True)
        assert all(isinstance(r, OSError) for r in results)
        table.fail_call = None
        table.fail_keys["bad"] = ValueError("cannot sign bad")
        good, bad, absent = await asyncio.gather(
            reads.get("good"), reads.get("bad"), reads.get("absent"), return_exceptions=True
        )
        assert good == "value of good"
        assert isinstance(bad, ValueError) and "cannot sign" in str(bad)
        assert isinstance(absent, LookupError)
        assert await reads.get("a") == "value of a"  # the earlier failure is not remembered

    asyncio.run(main())


def test_a_cancelled_caller_leaves_the_read_and_the_keys_other_caller_alone() -> None:
    table = Table()
    reads: BatchedReads[str, str] = BatchedReads(table.read_many)

    async def main() -> None:
        table.gate.clear()
        leaving = asyncio.ensure_future(reads.get("k"))
        staying = asyncio.ensure_future(reads.get("k"))
        while not table.calls:
            await asyncio.sleep(0.001)
        leaving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await leaving
        table.gate.set()
        assert await staying == "value of k"

    asyncio.run(main())
    assert table.calls == [["k"]]


def test_a_batch_size_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_keys"):
        BatchedReads(Table().read_many, max_keys=0)
