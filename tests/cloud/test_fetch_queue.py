"""The fetch queue's admission rules, with no event loop and a hand-moved clock."""

from __future__ import annotations

import pytest

from cloud.fetch_queue import Admission, FetchQueue


def queue(
    slots: int = 2, max_queued: int = 4, per_device: int = 2
) -> tuple[FetchQueue[int], list[float]]:
    """A queue whose requests wait at most 5 s, and its clock: ``now[0]``, moved by hand."""
    now = [100.0]
    return FetchQueue[int](slots, max_queued, per_device, 5.0, clock=lambda: now[0]), now


def test_free_slots_start_at_once_and_the_rest_wait_in_arrival_order() -> None:
    q, _ = queue(slots=2, max_queued=4, per_device=4)
    assert [q.offer("a", 1), q.offer("b", 2)] == [Admission.START] * 2
    assert [q.offer("c", 3), q.offer("a", 4), q.offer("b", 5)] == [Admission.QUEUED] * 3
    assert (q.running, len(q)) == (2, 3)
    assert [q.release(), q.release(), q.release(), q.release(), q.release()] == [
        3,
        4,
        5,
        None,
        None,
    ]
    assert (q.running, len(q)) == (0, 0)
    assert q.offer("a", 6) is Admission.START  # the slots are free again


def test_beyond_the_queue_cap_and_a_devices_share_requests_are_refused() -> None:
    q, _ = queue(slots=1, max_queued=3, per_device=2)
    assert q.offer("a", 1) is Admission.START
    assert [q.offer("a", 2), q.offer("a", 3)] == [Admission.QUEUED] * 2
    assert q.offer("a", 4) is Admission.DEVICE_FULL
    assert q.offer("b", 5) is Admission.QUEUED
    assert q.offer("c", 6) is Admission.QUEUE_FULL
    assert Admission.QUEUE_FULL.refused and Admission.DEVICE_FULL.refused
    assert not Admission.QUEUED.refused
    assert q.release() == 2  # a's share frees as its requests leave the queue
    assert q.offer("a", 7) is Admission.QUEUED
    assert [q.release(), q.release(), q.release(), q.release()] == [3, 5, 7, None]


def test_requests_past_their_wait_are_handed_back_and_never_given_a_slot() -> None:
    q, now = queue(slots=1, max_queued=4, per_device=4)
    q.offer("a", 1)
    q.offer("a", 2)
    now[0] += 3
    q.offer("b", 3)
    assert q.next_deadline() == 105.0
    assert q.expired() == []
    now[0] += 2  # 2 waited 5 s, 3 only 2 s
    assert q.expired() == [2]
    assert q.next_deadline() == 108.0
    assert q.offer("a", 4) is Admission.QUEUED  # a's share was freed by the expiry
    assert q.release() == 3
    now[0] += 10
    assert q.expired() == [4]
    assert (q.release(), q.running, q.next_deadline()) == (None, 0, None)


def test_clear_hands_back_every_waiting_request_and_keeps_the_slots() -> None:
    q, _ = queue(slots=1, max_queued=4, per_device=2)
    q.offer("a", 1)
    q.offer("a", 2)
    q.offer("a", 3)
    assert q.clear() == [2, 3]
    assert q.offer("a", 4) is Admission.QUEUED  # the per-device counts were cleared too
    assert q.release() == 4
    assert q.release() is None


def test_bad_caps_and_a_release_without_a_slot_are_refused() -> None:
    with pytest.raises(ValueError, match="slots"):
        FetchQueue[int](0, 1, 1, 1.0)
    with pytest.raises(ValueError, match="slots"):
        FetchQueue[int](1, -1, 1, 1.0)
    q, _ = queue()
    with pytest.raises(RuntimeError, match="not taken"):
        q.release()
