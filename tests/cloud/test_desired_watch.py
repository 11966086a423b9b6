"""One store poll wakes exactly the streams whose desired state changed."""

from __future__ import annotations

import asyncio
from pathlib import Path

from cloud.desired_watch import DesiredWatch
from cloud.store import open_store
from protos.envelope import now_ms


def test_only_changed_devices_are_woken(tmp_path: Path) -> None:
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

    async def scenario() -> tuple[bool, bool]:
        watch = DesiredWatch(store, interval_s=0.05)
        cam, gw = watch.subscribe("cam-1"), watch.subscribe("gw-1")
        await asyncio.sleep(0.2)  # the first poll wakes new subscribers once
        cam.clear()
        gw.clear()
        await asyncio.to_thread(store.create_deployment, "s", "1.0.0", "cams", now_ms=now_ms())
        await asyncio.wait_for(cam.wait(), 5)
        await asyncio.sleep(0.2)
        woke = (cam.is_set(), gw.is_set())
        await watch.close()
        return woke

    assert asyncio.run(scenario()) == (True, False)
