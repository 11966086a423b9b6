"""One store poll wakes exactly the listeners whose desired state changed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from pathlib import Path

from cloud.desired_watch import DesiredNotifier
from cloud.errors import StoreError
from cloud.store import Store, open_store
from cloud.store.records import InstructionRecord
from protos.envelope import now_ms


def fleet(tmp_path: Path) -> Store:
    store = open_store(f"sqlite:///{tmp_path / 'hub.db'}")
    for dev, kind in (("cam-1", "camera"), ("gw-1", "gateway")):
        store.register_device(dev, {"kind": kind}, {}, now_ms=now_ms())
    store.add_skill_version(
        "s",
        "1.0.0",
        target_name="s/s-1.0.0.skill",
        sha256="a" * 64,
        size=1,
        manifest="x",
        now_ms=now_ms(),
    )
    store.create_group("cams", "kind=camera")
    return store


def test_only_changed_devices_are_woken(tmp_path: Path) -> None:
    store = fleet(tmp_path)

    async def scenario() -> list[tuple[bool, bool]]:
        notifier = DesiredNotifier(store.desired_generations)
        cam, gw = notifier.subscribe("cam-1"), notifier.subscribe("gw-1")
        woken = []
        for change in (False, False, True):
            if change:
                await asyncio.to_thread(store.create_deployment, "s", "1.0.0", "cams", now_ms=1)
            assert await notifier.poll_once()
            woken.append((cam.is_set(), gw.is_set()))
            cam.clear()
            gw.clear()
        return woken

    # The first poll wakes new subscribers once; then only a change wakes, and only its device.
    assert asyncio.run(scenario()) == [(True, True), (False, False), (True, False)]


def test_snapshots_follow_every_poll_and_one_query_serves_all(tmp_path: Path) -> None:
    store = fleet(tmp_path)
    calls: list[int] = []

    def poll() -> Mapping[str, int]:
        calls.append(1)
        return store.desired_generations()

    async def scenario() -> list[dict[str, int]]:
        notifier = DesiredNotifier(poll)
        snaps = notifier.snapshots()
        first = asyncio.ensure_future(anext(snaps))
        await asyncio.sleep(0)  # let the reader start waiting
        subscribers = [notifier.subscribe(f"cam-{i}") for i in range(50)]
        await notifier.poll_once()
        got = [await asyncio.wait_for(first, 5)]
        await asyncio.to_thread(store.create_deployment, "s", "1.0.0", "cams", now_ms=1)
        await notifier.poll_once()
        got.append(await asyncio.wait_for(anext(snaps), 5))
        await snaps.aclose()
        assert len(subscribers) == 50
        return got

    assert asyncio.run(scenario()) == [{"cam-1": 0, "gw-1": 0}, {"cam-1": 1, "gw-1": 0}]
    assert len(calls) == 2


def test_a_failed_poll_is_counted_and_wakes_the_fresh_subscriber_later(tmp_path: Path) -> None:
    store = fleet(tmp_path)
    failing = [True]

    def poll() -> Mapping[str, int]:
        if failing[0]:
            raise StoreError("database is away")
        return store.desired_generations()

    async def scenario() -> tuple[bool, bool]:
        notifier = DesiredNotifier(poll)
        cam = notifier.subscribe("cam-1")
        assert not await notifier.poll_once()
        before = cam.is_set()
        failing[0] = False
        assert await notifier.poll_once()
        assert (notifier.failures, notifier.polls) == (1, 1)
        return before, cam.is_set()

    assert asyncio.run(scenario()) == (False, True)


def test_with_a_fingerprint_the_fleet_is_read_only_when_it_moved_or_is_due(
    tmp_path: Path,
) -> None:
    store = fleet(tmp_path)
    reads: list[int] = []

    def poll() -> Mapping[str, int]:
        reads.append(1)
        return store.desired_generations()

    async def scenario() -> list[tuple[int, bool]]:
        notifier = DesiredNotifier(poll, fingerprint=store.desired_fingerprint, full_every_s=60)
        cam = notifier.subscribe("cam-1")
        seen = []

        async def step(change: Callable[[], object] | None = None) -> None:
            if change is not None:
                await asyncio.to_thread(change)
            assert await notifier.poll_once()
            seen.append((len(reads), cam.is_set()))
            cam.clear()

        await step()  # the first poll reads the fleet and wakes the new subscriber
        await step()  # nothing moved: no read, nobody woken
        late = notifier.subscribe("gw-1")
        await step()  # still no read, but a subscriber new since the last poll is woken once
        assert late.is_set()
        await step(lambda: store.create_deployment("s", "1.0.0", "cams", now_ms=1))  # a change
        await step(lambda: store.register_device("cam-2", {"kind": "camera"}, {}, now_ms=1))
        notifier.full_every_s = 0.0
        await step()  # due: read even though nothing moved
        assert notifier.latest["cam-2"] == 1 and notifier.full_reads == len(reads)
        return seen

    assert asyncio.run(scenario()) == [
        (1, True),
        (1, False),
        (1, False),
        (2, True),
        (3, False),
        (4, False),
    ]


def test_the_fingerprint_moves_with_devices_desired_states_and_instructions(
    tmp_path: Path,
) -> None:
    store = fleet(tmp_path)
    prints = [store.desired_fingerprint()]
    store.create_deployment("s", "1.0.0", "cams", now_ms=1)
    prints.append(store.desired_fingerprint())
    store.register_device("cam-2", {"kind": "camera"}, {}, now_ms=1)
    prints.append(store.desired_fingerprint())
    signed = InstructionRecord("cam-1", 1, 1, 10_000, 1, "b" * 64, b"signed")
    assert store.save_instruction(signed, previous=0)  # a director signed an instruction
    prints.append(store.desired_fingerprint())
    assert len(set(prints)) == 4
    assert store.desired_fingerprint() == prints[-1]  # and stays while nothing changes


def test_a_nudge_from_another_thread_polls_before_the_interval_is_over(tmp_path: Path) -> None:
    store = fleet(tmp_path)

    async def scenario() -> tuple[float, int]:
        notifier = DesiredNotifier(store.desired_generations, interval_s=3600.0)
        runner = asyncio.create_task(notifier.run())
        try:
            cam = notifier.subscribe("cam-1")
            await asyncio.wait_for(cam.wait(), 30)  # the first poll wakes a new subscriber
            cam.clear()
            polls = notifier.polls

            def deploy_and_nudge() -> None:  # as the leader's pass does, in its own thread
                store.create_deployment("s", "1.0.0", "cams", now_ms=1)
                notifier.nudge()

            started = asyncio.get_running_loop().time()
            await asyncio.to_thread(deploy_and_nudge)
            await asyncio.wait_for(cam.wait(), 30)  # an hour's interval: only the nudge
            return asyncio.get_running_loop().time() - started, notifier.polls - polls
        finally:
            runner.cancel()

    waited, polls = asyncio.run(scenario())
    assert waited < 30 and polls >= 1
    DesiredNotifier(store.desired_generations).nudge()  # not running: nothing to wake, no error
