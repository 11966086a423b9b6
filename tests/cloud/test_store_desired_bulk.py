"""Fleet-wide desired-state reads the MQTT adapter polls (SQLite and PostgreSQL)."""

from __future__ import annotations

from cloud.store import Store


def _fleet(store: Store) -> None:
    store.add_skill_version(
        "face",
        "1.0.0",
        target_name="face-1.0.0.skill",
        sha256="a" * 64,
        size=1,
        manifest="",
        now_ms=1,
    )
    store.create_group("cameras", "kind=camera")
    for i in range(3):
        store.register_device(f"cam-{i}", {"kind": "camera"}, {}, now_ms=1)
    store.register_device("gw-1", {"kind": "gateway"}, {}, now_ms=1)


def test_generations_cover_every_registered_device_in_one_call(store: Store) -> None:
    _fleet(store)
    assert store.desired_generations() == {"cam-0": 0, "cam-1": 0, "cam-2": 0, "gw-1": 0}
    store.create_deployment("face", "1.0.0", "cameras", now_ms=2)
    assert store.desired_generations() == {"cam-0": 1, "cam-1": 1, "cam-2": 1, "gw-1": 0}


def test_desired_many_matches_desired_for_and_keeps_the_order_asked(store: Store) -> None:
    _fleet(store)
    store.create_deployment("face", "1.0.0", "cameras", now_ms=2)
    ids = ["gw-1", "cam-2", "nobody", "cam-0", "cam-2"]
    got = store.desired_many(ids)
    assert [r.device_id for r in got] == ["gw-1", "cam-2", "nobody", "cam-0"]
    assert got == [store.desired_for(d) for d in ("gw-1", "cam-2", "nobody", "cam-0")]
    assert [s.version for s in got[1].skills] == ["1.0.0"]
    assert store.desired_many([]) == []
