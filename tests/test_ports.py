"""The tests' own port picker: blocks per worker, below the ephemeral range, no repeats."""

from __future__ import annotations

import pytest

from tests.support import ports


def test_ports_come_from_this_workers_block_are_even_apart_and_not_repeated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    monkeypatch.setattr(ports, "_state", {})
    got = [ports.free_port() for _ in range(50)]
    assert len(set(got)) == 50
    assert all(20000 <= p < 22000 for p in got)  # gw1: the third block
    assert len({p % 2 for p in got}) == 1  # the neighbour of each stays free for a pair
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    assert 18000 <= ports.free_port() < 20000
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert 16000 <= ports.free_port() < 18000  # a serial run
