"""Acks folded per device: what the MQTT adapter sends for messages handled together."""

from __future__ import annotations

from cloud.session import ack_envelope, merge_acks
from protos import kind_of, make_envelope, pb


def test_acks_are_folded_per_device_and_other_replies_keep_their_order() -> None:
    welcome = make_envelope("cam-1", welcome=pb.Welcome())
    replies = [
        ack_envelope("cam-1", "m1"),
        welcome,
        ack_envelope("cam-2", "x1"),
        ack_envelope("cam-1", "m2"),
        ack_envelope("cam-1", "m1"),  # a resend acked twice: once is enough
    ]
    merged = merge_acks(replies)
    assert merged[0] is welcome
    acks = {env.device_id: list(env.ack.ids) for env in merged[1:]}
    assert acks == {"cam-1": ["m1", "m2"], "cam-2": ["x1"]}
    assert all(kind_of(env) == "ack" for env in merged[1:])


def test_an_ack_never_carries_more_ids_than_the_cap() -> None:
    ids = [f"m{i}" for i in range(10)]
    merged = merge_acks([ack_envelope("cam-1", i) for i in ids], cap=4)
    assert [len(env.ack.ids) for env in merged] == [4, 4, 2]
    assert [i for env in merged for i in env.ack.ids] == ids
    assert len({env.id for env in merged}) == 3  # each envelope has an id of its own
