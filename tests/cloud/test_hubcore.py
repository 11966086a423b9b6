"""The hub's transport-independent message handling, over a real SQLite store and TUF repository."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import pytest

from cloud.director import DirectorSettings, HubDirector
from cloud.errors import FetchRefusedError, FetchTooLargeError, FetchUnknownDeviceError
from cloud.hubcore import HubCore, fetch_error_code, running
from cloud.store import DesiredRecord, Store, open_store
from protos import ProtocolError, kind_of, make_envelope, pb
from protos.envelope import decode_envelope, encode_envelope, now_ms, validate_envelope
from protos.fetch import FetchErrorCode
from protos.limits import MAX_OFFER_BYTES
from skills.trust import TrustRepository
from skills.trust.director import DirectorVerifier
from skills.trust.offer import offer_message, read_offer
from tests.support import async_wait_until


@pytest.fixture
def core(tmp_path: Path) -> HubCore:
    store = open_store(f"sqlite:///{tmp_path / 'hub.db'}")
    trust = TrustRepository.init(tmp_path / "trust")
    blob = tmp_path / "blob.skill"
    blob.write_bytes(bytes(range(256)) * 1000)
    trust.add_target("demo/blob.skill", blob)
    return HubCore(store, trust)


def register(device_id: str, **labels: str) -> pb.Envelope:
    return make_envelope(
        device_id, register=pb.Register(labels=labels, profile=pb.HardwareProfile(arch="x86_64"))
    )


def telemetry(device_id: str, n: int = 5) -> pb.Envelope:
    return make_envelope(
        device_id, telemetry=pb.Telemetry(skill="digits", version="1.0.0", inferences=n)
    )


def test_register_answers_welcome_and_desired_state(core: HubCore) -> None:
    replies = asyncio.run(core.register(register("cam-1", kind="camera")))
    assert [kind_of(r) for r in replies] == ["welcome", "desired"]
    device = core.store.get_device("cam-1")
    assert device is not None and device.labels == {"kind": "camera"} and device.online


@pytest.mark.parametrize(
    "env",
    [
        make_envelope("cam-1", heartbeat=pb.Heartbeat()),
        register("../etc"),
        register("cam-1", **{"bad key!": "x"}),
    ],
)
def test_bad_register_is_refused_and_stores_nothing(core: HubCore, env: pb.Envelope) -> None:
    with pytest.raises(ProtocolError):
        asyncio.run(core.register(env))
    assert core.store.list_devices() == []


def test_telemetry_is_acked_and_stored_once(core: HubCore) -> None:
    asyncio.run(core.register(register("cam-1")))
    env = telemetry("cam-1")
    env.telemetry.errors, env.telemetry.latency_p95_ms = 2, 4.5
    for _ in range(3):  # redelivery after a lost ack
        (ack,) = asyncio.run(core.handle("cam-1", env))
        assert list(ack.ack.ids) == [env.id]
    (stored,) = core.store.telemetry_for("cam-1")
    assert (stored.errors, stored.latency_p95_ms) == (2, 4.5)  # carried from the wire


def test_heartbeats_are_written_together_and_the_last_batch_on_close(core: HubCore) -> None:
    async def scenario() -> None:
        for device in ("cam-1", "cam-2"):
            await core.register(register(device))
            await core.disconnected(device)
        before = now_ms()
        for device in ("cam-1", "cam-2"):
            assert await core.handle(device, make_envelope(device, heartbeat=pb.Heartbeat())) == []
        await async_wait_until(
            lambda: all(d.online and d.last_seen_ms >= before for d in core.store.list_devices()),
            10,
            "both heartbeats written",
        )
        await core.disconnected("cam-1")
        await core.handle("cam-1", make_envelope("cam-1", heartbeat=pb.Heartbeat()))
        await core.close()  # at once, not after the linger

    asyncio.run(scenario())
    assert core.store.get_device("cam-1").online  # type: ignore[union-attr]


def test_a_device_cannot_speak_for_another(core: HubCore) -> None:
    asyncio.run(core.register(register("cam-1")))
    asyncio.run(core.register(register("cam-2")))
    with pytest.raises(ProtocolError, match="as 'cam-2'"):
        asyncio.run(core.handle("cam-1", telemetry("cam-2")))
    assert core.store.telemetry_for() == []


@pytest.mark.parametrize(
    "body",
    [
        {"telemetry": pb.Telemetry(skill="s", inferences=1, labelled=2)},
        {"telemetry": pb.Telemetry(skill="s", inferences=-1)},
        {"desired": pb.DesiredState(generation=9)},
        {"register": pb.Register()},
    ],
)
def test_inconsistent_or_forbidden_messages_are_refused(core: HubCore, body: dict) -> None:
    asyncio.run(core.register(register("cam-1")))
    with pytest.raises(ProtocolError):
        asyncio.run(core.handle("cam-1", make_envelope("cam-1", **body)))
    assert core.store.telemetry_for() == []


def test_fetch_streams_a_file_from_an_offset(core: HubCore) -> None:
    (ref,) = core.trust.targets()
    size, chunks = core.open_fetch(ref.path, 1000, 10**9)
    data = b"".join(chunks)
    assert size == 256_000 and data == (bytes(range(256)) * 1000)[1000:]


@pytest.mark.parametrize(
    "path", ["../hub.db", "/etc/passwd", "keys/root.pem", "metadata/../keys/root.pem", ""]
)
def test_fetch_refuses_paths_outside_the_repository(core: HubCore, path: str) -> None:
    with pytest.raises(FetchRefusedError) as info:
        core.open_fetch(path, 0, 10**9)
    assert fetch_error_code(info.value) == FetchErrorCode.REFUSED


@pytest.mark.parametrize(
    ("path", "message"),
    [("../hub.db", "bad fetch path '../hub.db'"), ("metadata/./../x.json", "bad fetch path"),
     ("//metadata/root.json", "bad fetch path"), ("keys/root.pem", "bad fetch path"),
     ("./metadata/root.json", "bad repository path './metadata/root.json'"),
     ("metadata//root.json", "bad repository path"), ("targets/a\\..\\b", "bad repository path")],
)  # fmt: skip
def test_fetch_refusals_keep_their_messages(core: HubCore, path: str, message: str) -> None:
    with pytest.raises(FetchRefusedError) as info:
        core.open_fetch(path, 0, 10**9)
    assert str(info.value).startswith(message)


def test_fetch_refuses_files_over_the_callers_cap(core: HubCore) -> None:
    (ref,) = core.trust.targets()
    with pytest.raises(FetchTooLargeError, match="over the 1000 byte cap") as info:
        core.open_fetch(ref.path, 0, 1000)
    assert fetch_error_code(info.value) == FetchErrorCode.TOO_LARGE


@pytest.mark.parametrize("offset", [-1, 256_001])
def test_fetch_refuses_an_offset_outside_the_file(core: HubCore, offset: int) -> None:
    (ref,) = core.trust.targets()
    with pytest.raises(FetchRefusedError, match="outside") as info:
        core.open_fetch(ref.path, offset, 10**9)
    assert type(info.value) is FetchRefusedError


def test_fetch_error_codes_follow_the_exception_type() -> None:
    assert fetch_error_code(FileNotFoundError("x")) == FetchErrorCode.NOT_FOUND
    assert fetch_error_code(FetchUnknownDeviceError("x")) == FetchErrorCode.UNKNOWN_DEVICE
    # The message does not matter, only the type.
    assert fetch_error_code(FetchRefusedError("over the cap")) == FetchErrorCode.REFUSED
    with pytest.raises(TypeError):
        fetch_error_code(ValueError("too-large"))


def test_missing_file_is_not_found(core: HubCore) -> None:
    with pytest.raises(FileNotFoundError):
        core.open_fetch("metadata/99.root.json", 0, 10**6)


def test_the_core_names_its_loops_and_running_drives_them(core: HubCore) -> None:
    assert [name for name, _ in core.loops()] == ["desired-notifier"]

    async def scenario() -> int:
        async with running(core):
            async with asyncio.timeout(10):
                while core.notifier.polls < 2:  # polls every 0.5 s
                    await asyncio.sleep(0.05)
        return core.notifier.polls

    polls = asyncio.run(scenario())
    assert polls >= 2
    assert core.notifier.failures == 0


def test_a_device_known_to_the_store_is_recognised_by_a_fresh_core(core: HubCore) -> None:
    asyncio.run(core.register(register("cam-1")))
    fresh = HubCore(core.store, core.trust)  # another hub process on the same store
    assert asyncio.run(fresh.is_known("cam-1")) is True
    assert asyncio.run(fresh.is_known("ghost")) is False


def report(device_id: str, generation: int, version: str, sent_at_ms: int) -> pb.Envelope:
    env = make_envelope(
        device_id,
        reported=pb.ReportedState(
            generation=generation,
            skills=[pb.SkillStatus(name="digits", version=version, state="running")],
        ),
    )
    env.sent_at_ms = sent_at_ms
    return env


def test_a_redelivered_older_report_does_not_hide_a_newer_one(core: HubCore) -> None:
    asyncio.run(core.register(register("cam-1")))
    t = 1_700_000_000_000
    asyncio.run(core.handle("cam-1", report("cam-1", 2, "2.0.0", t + 10)))
    asyncio.run(core.handle("cam-1", report("cam-1", 2, "1.0.0", t)))  # made earlier, arrived later
    asyncio.run(
        core.handle("cam-1", report("cam-1", 1, "0.9.0", t + 20))
    )  # answers an older generation
    rep = core.store.reported_for("cam-1")
    assert rep is not None and (rep.generation, rep.skills[0].version) == (2, "2.0.0")
    asyncio.run(core.handle("cam-1", report("cam-1", 2, "2.0.1", t + 30)))
    asyncio.run(core.handle("cam-1", report("cam-1", 3, "3.0.0", t + 5)))  # newer generation wins
    rep = core.store.reported_for("cam-1")
    assert rep is not None and (rep.generation, rep.skills[0].version) == (3, "3.0.0")


def test_each_stored_report_of_a_settled_skill_tells_the_rollout_loop(core: HubCore) -> None:
    heard: list[str] = []
    core.on_settled = heard.append
    asyncio.run(core.register(register("cam-1")))
    t = 1_700_000_000_000

    def say(state: str, version: str, wanted: str, at: int) -> None:
        status = pb.SkillStatus(name="digits", version=version, state=state, desired_version=wanted)
        env = make_envelope("cam-1", reported=pb.ReportedState(generation=1, skills=[status]))
        env.sent_at_ms = at
        asyncio.run(core.handle("cam-1", env))

    say("installing", "1.0.0", "2.0.0", t)  # on its way
    say("running", "1.0.0", "2.0.0", t + 1)  # still the old version
    assert heard == []
    say("running", "2.0.0", "2.0.0", t + 2)
    say("failed", "1.0.0", "3.0.0", t + 3)
    say("rolled_back", "1.0.0", "3.0.0", t + 4)
    assert heard == ["cam-1"] * 3
    rep = core.store.reported_for("cam-1")
    assert rep is not None and rep.skills[0].state == "rolled_back"  # stored before it was told


# -- signed desired state (the director) ------------------------------------------------


def _verify(director: HubDirector, env: pb.Envelope, device: str, last: int) -> int:
    verifier = DirectorVerifier([director.public_pem()])
    inst = verifier.verify(
        env.signed_desired.instruction, device_id=device, last_counter=last, now_ms=now_ms()
    )
    return inst.counter


def test_a_core_with_a_director_signs_desired_state_consistently_across_processes(
    core: HubCore, tmp_path: Path
) -> None:
    director = HubDirector(tmp_path / "home")
    signed = HubCore(core.store, core.trust, director=director)
    replies = asyncio.run(signed.register(register("cam-1", kind="camera")))
    assert [kind_of(r) for r in replies] == ["welcome", "signed_desired"]
    assert _verify(director, replies[1], "cam-1", 0) == 1
    # Another hub process with the same home and store hands out the same instruction.
    other = HubCore(core.store, core.trust, director=HubDirector(tmp_path / "home"))
    again = asyncio.run(other.desired("cam-1"))
    assert again.signed_desired.instruction == replies[1].signed_desired.instruction
    # Polls by either process sign nothing new while nothing changed.
    assert director.revisions(core.store) == {"cam-1": 1}
    assert other.director is not None and other.director.revisions(core.store) == {"cam-1": 1}
    assert director.signed + other.director.signed == 1


@pytest.mark.parametrize("signed", [False, True])
def test_a_desired_state_goes_out_with_the_metadata_an_upgrade_fetches(
    core: HubCore, tmp_path: Path, signed: bool
) -> None:
    hub = HubCore(
        core.store, core.trust, director=HubDirector(tmp_path / "home") if signed else None
    )
    asyncio.run(hub.register(register("cam-1")))
    first = asyncio.run(hub.desired("cam-1"))
    offer = read_offer(core.trust.read)
    assert offer is not None and first.metadata == offer_message(offer)
    assert {f.path for f in first.metadata.files} >= {"metadata/timestamp.json"}
    validate_envelope(decode_envelope(encode_envelope(first)))  # within every cap

    blob = tmp_path / "blob2.skill"
    blob.write_bytes(b"two")
    core.trust.add_target("demo/blob-2.skill", blob)  # a new version published
    later = asyncio.run(hub.desired("cam-1"))
    new_offer = read_offer(core.trust.read)
    assert new_offer is not None and new_offer != offer
    assert later.metadata == offer_message(new_offer)


def test_no_metadata_goes_out_when_it_is_over_the_offer_cap(core: HubCore, tmp_path: Path) -> None:
    source = tmp_path / "many.skill"
    source.write_bytes(b"x")
    long_name = "demo/" + "a-long-skill-name-" * 8
    for i in range(250):  # a targets file of many versions: over MAX_OFFER_BYTES
        core.trust.add_target(f"{long_name}{i}.skill", source)
    assert len(core.trust.read("metadata/targets.json", 1 << 20)) > MAX_OFFER_BYTES
    asyncio.run(core.register(register("cam-1")))
    env = asyncio.run(core.desired("cam-1"))
    assert kind_of(env) == "desired" and not env.HasField("metadata")


def test_instructions_near_expiry_are_signed_again_with_a_new_counter(
    core: HubCore, tmp_path: Path
) -> None:
    director = HubDirector(tmp_path / "home", DirectorSettings(ttl_s=100.0, refresh_margin_s=10.0))
    signed = HubCore(core.store, core.trust, director=director)
    first = asyncio.run(signed.register(register("cam-1")))[1]
    now = now_ms()
    assert director.revisions(core.store, now) == {"cam-1": 1}
    assert director.revisions(core.store, now + 95_000) == {"cam-1": 2}
    stored = core.store.instruction_for("cam-1")
    assert stored is not None and stored.instruction != first.signed_desired.instruction
    assert HubCore.revision(first) == 1


def test_security_events_are_stored_counted_acknowledged_and_deduplicated(core: HubCore) -> None:
    asyncio.run(core.register(register("cam-1")))
    event = pb.SecurityEvent(kind="desired-refused", reason="foreign", detail="x", count=3)
    env = make_envelope("cam-1", security_event=event)
    session = core.session()

    async def send_twice() -> list[list[pb.Envelope]]:
        await session.open(register("cam-1").SerializeToString())
        return [await session.receive(env.SerializeToString()) for _ in range(2)]

    first, second = asyncio.run(send_twice())
    assert [kind_of(r) for r in first] == ["ack"] == [kind_of(r) for r in second]
    assert core.security_events == {("desired-refused", "foreign"): 3}
    stored = core.store.security_events("cam-1")
    assert [(e.kind, e.reason, e.count, e.detail) for e in stored] == [
        ("desired-refused", "foreign", 3, "x")
    ]


class CountingStore:
    """The real store, with its single-device and many-device desired reads counted."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.reads: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def desired_many(self, device_ids: Sequence[str]) -> list[DesiredRecord]:
        self.reads.append(len(device_ids))
        return self._store.desired_many(device_ids)

    def desired_for(self, device_id: str) -> DesiredRecord:
        raise AssertionError("a session's desired state is read in a batch")


@pytest.mark.parametrize("signed", [False, True])
def test_sessions_woken_together_read_their_desired_states_in_one_query(
    core: HubCore, tmp_path: Path, signed: bool
) -> None:
    devices = [f"cam-{i}" for i in range(40)]
    director = HubDirector(tmp_path / "home") if signed else None
    counted = CountingStore(core.store)
    hub = HubCore(cast("Store", counted), core.trust, director=director)

    async def main() -> list[pb.Envelope]:
        for device in devices:
            await core.register(register(device, kind="camera"))
        core.store.add_skill_version(
            "digits",
            "1.0.0",
            target_name="digits/1.0.0",
            sha256="a" * 64,
            size=1,
            manifest="[skill]",
            now_ms=1,
        )
        core.store.create_group("cams", "kind=camera")
        core.store.create_deployment("digits", "1.0.0", "cams", now_ms=now_ms())
        counted.reads.clear()
        return await asyncio.gather(*(hub.desired(d) for d in devices))

    envelopes = asyncio.run(main())
    assert counted.reads == [len(devices)]
    for device, env in zip(devices, envelopes, strict=True):
        assert env.device_id == device
        if director is None:
            assert env.desired.generation > 0 and env.desired.skills[0].version == "1.0.0"
        else:
            assert _verify(director, env, device, 0) == 1
    if director is not None:  # signed once each; asked again, the stored ones are reused
        assert director.signed == len(devices)
        again = asyncio.run(hub.desired("cam-3"))
        assert again.signed_desired.instruction == envelopes[3].signed_desired.instruction
        assert director.signed == len(devices)
