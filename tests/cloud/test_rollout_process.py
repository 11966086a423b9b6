"""The leader's rollout passes in a process of their own, on SQLite and PostgreSQL.

The child opens its own store on the same database and runs the same loop:
these tests drive a canary through it, check that its log lines and the
notifier's nudge reach the parent, and kill it to see the next pass fail
clearly and the one after carry on in a new child.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator

import pytest

from cloud.errors import StoreError
from cloud.rollout.plan import plan_from_dict
from cloud.rollout_process import RolloutProcessLoop, shareable
from cloud.store import Store
from tests.cloud.test_rollout_store import (
    CANARY,
    DEVICES,
    Clock,
    admitted_devices,
    desired,
    fleet_on_v1,
    phase,
    report,
)


def test_only_a_database_two_processes_can_open_is_shareable() -> None:
    assert shareable("sqlite:////var/lib/edgeskill/hub.db")
    assert shareable("postgresql+psycopg2://hub@db/fleet")
    assert not shareable("sqlite://")
    assert not shareable("sqlite:///:memory:")
    assert not shareable("sqlite:///file:hub?mode=memory&cache=shared&uri=true")
    with pytest.raises(ValueError, match="two processes"):
        RolloutProcessLoop(None, "sqlite://")  # type: ignore[arg-type]


@pytest.fixture
def passes(store: Store, store_url: str) -> Iterator[tuple[RolloutProcessLoop, list[int]]]:
    nudges: list[int] = []
    loop = RolloutProcessLoop(store, store_url, on_write=lambda: nudges.append(1))
    try:
        yield loop, nudges
    finally:
        loop.close()


def test_no_process_runs_until_there_is_a_rollout_to_drive(
    store: Store, passes: tuple[RolloutProcessLoop, list[int]]
) -> None:
    loop, nudges = passes
    fleet_on_v1(store, Clock())  # all at once: nothing for the engine
    assert loop.pass_once() == 0
    assert loop.pid is None
    assert nudges == []


def test_a_canary_is_opened_and_completed_by_the_child(
    store: Store,
    passes: tuple[RolloutProcessLoop, list[int]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop, nudges = passes
    clock = Clock()
    fleet_on_v1(store, clock)
    dep = store.create_deployment(
        "face", "2.0.0", "cams", plan=plan_from_dict(CANARY), now_ms=clock.now
    )
    caplog.set_level(logging.INFO)
    assert loop.pass_once() == 1
    assert loop.pid is not None and loop.pid != os.getpid()
    canary = admitted_devices(store, dep.id)
    assert len(canary) == 5
    assert {d for d in DEVICES if desired(store, d) == "2.0.0"} == set(canary)
    assert nudges == [1]
    assert any(
        r.name == "cloud.rollout_loop" and "canary opened: 5 -> 2.0.0" in r.getMessage()
        for r in caplog.records
    )
    child = loop.pid
    for device in canary:
        report(store, device, "2.0.0", "running", "2.0.0", clock.now)
    for _ in range(3):  # join the reports; the next wave, with no interval, is the rest
        loop.pass_once()
    for device in DEVICES:
        report(store, device, "2.0.0", "running", "2.0.0", clock.now)
    for _ in range(3):
        loop.pass_once()
    assert phase(store, dep.id) == "completed"
    assert {desired(store, d) for d in DEVICES} == {"2.0.0"}
    assert loop.pid == child  # one child for every pass
    assert loop.rolling is False


def test_a_child_killed_fails_one_pass_and_a_new_one_carries_on(
    store: Store, passes: tuple[RolloutProcessLoop, list[int]]
) -> None:
    loop, _ = passes
    clock = Clock()
    fleet_on_v1(store, clock)
    dep = store.create_deployment(
        "face", "2.0.0", "cams", plan=plan_from_dict(CANARY), now_ms=clock.now
    )
    loop.pass_once()
    canary = admitted_devices(store, dep.id)
    killed = loop.pid
    assert killed is not None
    os.kill(killed, signal.SIGKILL)
    with pytest.raises(StoreError, match="the rollout process went away"):
        loop.pass_once()
    assert loop.pid is None
    for device in canary:
        report(store, device, "2.0.0", "running", "2.0.0", clock.now)
    for _ in range(3):
        loop.pass_once()
    assert loop.pid not in (None, killed)
    assert admitted_devices(store, dep.id).keys() == set(DEVICES)  # the canary passed
    assert admitted_devices(store, dep.id).keys() >= canary.keys()


def test_closing_stops_the_child(
    store: Store, passes: tuple[RolloutProcessLoop, list[int]]
) -> None:
    loop, _ = passes
    clock = Clock()
    fleet_on_v1(store, clock)
    store.create_deployment("face", "2.0.0", "cams", plan=plan_from_dict(CANARY), now_ms=clock.now)
    loop.pass_once()
    child = loop.pid
    assert child is not None
    loop.close()
    assert loop.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)
