"""The injectable agent: parts from outside, durable sends, and skill events counted.

These run real :class:`Agent` objects on the test's event loop with a real outbox
and installs; the transport is a recording fake (an interface), and the skill is
either a fake launcher's or a real sandboxed control process.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import edge_agent.agent as agent_module
from edge_agent.agent import Agent
from edge_agent.config import AgentConfig
from edge_agent.errors import TransportError
from edge_agent.installs import InstallStore
from edge_agent.outbox import Outbox
from edge_agent.sandbox.launcher import SkillLauncher, make_launcher
from edge_agent.transport import AgentTransport
from edge_agent.workload import ReplaySource
from protos import decode_envelope, kind_of, make_envelope, pb
from protos.envelope import now_ms
from skills.trust.director import DirectorKey, Instruction
from skills.trust.offer import MetadataOffer
from tests.fakes.fake_launcher import PROFILE, FakeLauncher
from tests.support import async_wait_until
from tests.support.skillkit import build_skill

EMITTER_TOML = """
[skill]
name = "emitter"
version = "1.0.0"
entrypoint = "emitter_skill:EmitterSkill"

[resources]
memory_mb = 512
startup_timeout_s = 30.0

[config]
events_per_item = "0"
fail_every = "0"
"""

EMITTER_CODE = """
from skills.sdk import Skill


class EmitterSkill(Skill):
    def setup(self, ctx):
        self._ctx = ctx
        self._per_item = int(ctx.config["events_per_item"])
        self._fail_every = int(ctx.config["fail_every"])
        self._seen = 0

    def process(self, item):
        self._seen += 1
        if self._fail_every and self._seen % self._fail_every == 0:
            raise ValueError("a bad frame")
        for i in range(self._per_item):
            self._ctx.emit({"kind": "seen", "n": i})
        return {"label": 0}
"""


def _committed_ids(db: Path) -> set[str]:
    conn = sqlite3.connect(db)
    try:
        return {row[0] for row in conn.execute("SELECT msg_id FROM entries")}
    finally:
        conn.close()


class RecordingTransport(AgentTransport):
    """Records what the agent sends and notes anything sent before its outbox commit."""

    def __init__(self, outbox_db: Path) -> None:
        self.outbox_db = outbox_db
        self.sent: list[pb.Envelope] = []
        #: Each envelope sent, with when (monotonic seconds).
        self.sent_times: list[tuple[float, pb.Envelope]] = []
        self.sent_uncommitted: list[str] = []
        self.inbox: asyncio.Queue[pb.Envelope] = asyncio.Queue()

    async def connect(self, register: pb.Envelope) -> None:
        await self.inbox.put(make_envelope("hub", welcome=pb.Welcome(heartbeat_s=60)))

    async def send(self, env: pb.Envelope) -> None:
        if kind_of(env) != "heartbeat" and env.id not in _committed_ids(self.outbox_db):
            self.sent_uncommitted.append(env.id)
        self.sent.append(env)
        self.sent_times.append((time.monotonic(), env))

    async def receive(self) -> pb.Envelope:
        return await self.inbox.get()

    async def _fetch(self, path: str, offset: int, max_bytes: int) -> AsyncIterator[bytes]:
        raise TransportError("this fake serves no files")
        yield b""  # pragma: no cover - makes this an async generator

    async def close(self) -> None:
        return None


class OfflineTransport(RecordingTransport):
    """A hub that cannot be reached."""

    async def connect(self, register: pb.Envelope) -> None:
        raise TransportError("hub unreachable")


def _config(tmp_path: Path, **overrides: object) -> AgentConfig:
    settings: dict[str, object] = {
        "hub_url": "grpc://127.0.0.1:9",
        "device_id": "cam-1",
        "state_dir": tmp_path / "agent",
        "telemetry_window_s": 0.2,
        "reconcile_interval_s": 0.5,
    }
    settings.update(overrides)
    return AgentConfig(**settings)  # type: ignore[arg-type]


def _agent(
    config: AgentConfig,
    transport: AgentTransport,
    launcher: SkillLauncher,
    fetch_target: object = Path,
    source: ReplaySource | None = None,
    offer_metadata: Callable[[MetadataOffer], object] | None = None,
) -> Agent:
    state = config.state_dir
    state.mkdir(parents=True, exist_ok=True)
    return Agent(
        config,
        profile=PROFILE,
        outbox=Outbox(state / "outbox.db"),
        installs=InstallStore(state / "installs"),
        fetch_target=fetch_target,  # type: ignore[arg-type]
        launcher=launcher,
        transport_factory=lambda: transport,
        source=source,
        offer_metadata=offer_metadata,
    )


def _trust_director(config: AgentConfig) -> DirectorKey:
    """A director key whose public half the agent trusts (as enrolment leaves it)."""
    key = DirectorKey.generate()
    identity = config.state_dir / "identity"
    identity.mkdir(parents=True, exist_ok=True)
    (identity / "director.pub").write_bytes(key.public_pem)
    return key


def _sign(
    key: DirectorKey, device: str, counter: int, desired: pb.DesiredState, ttl_ms: int = 60_000
) -> bytes:
    inst = Instruction(device, counter, now_ms() + ttl_ms, desired.SerializeToString())
    return key.sign(inst).to_bytes()


def _signed_env(data: bytes) -> pb.Envelope:
    return make_envelope("hub", signed_desired=pb.SignedDesired(instruction=data))


def _telemetry(entries: list[bytes]) -> list[pb.Telemetry]:
    envs = [decode_envelope(p) for p in entries]
    return [e.telemetry for e in envs if kind_of(e) == "telemetry"]


def test_nothing_is_sent_before_it_is_committed_and_only_the_hubs_ack_releases_it(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path)
    transport = RecordingTransport(config.state_dir / "outbox.db")
    agent = _agent(config, transport, FakeLauncher())
    count = 60

    def sent_ids() -> set[str]:
        return {e.id for e in transport.sent if kind_of(e) != "heartbeat"}

    async def main() -> None:
        stop = asyncio.Event()
        running = asyncio.create_task(agent.run(stop))
        await async_wait_until(lambda: agent.transport is not None, 10, "the session")
        envs = [
            make_envelope("cam-1", telemetry=pb.Telemetry(skill="s", version="1", inferences=i))
            for i in range(count)
        ]
        await asyncio.gather(*(agent.enqueue(e) for e in envs))
        wanted = {e.id for e in envs}
        await async_wait_until(lambda: wanted <= sent_ids(), 10, "every message sent")
        # Sent is not released: everything waits for the hub's acknowledgement.
        assert wanted <= _committed_ids(config.state_dir / "outbox.db")
        await transport.inbox.put(make_envelope("hub", ack=pb.Ack(ids=sorted(sent_ids()))))
        await async_wait_until(lambda: len(agent.outbox) == 0, 10, "the acks to release all")
        stop.set()
        await running

    asyncio.run(main())
    assert transport.sent_uncommitted == []
    assert agent.outbox.commits < count  # the concurrent puts were batched


@pytest.mark.slow
def test_events_and_failed_items_of_a_skill_are_counted_in_its_telemetry(
    tmp_path: Path,
) -> None:
    src = tmp_path / "emitter-src"
    (src / "control").mkdir(parents=True)
    (src / "skill.toml").write_text(EMITTER_TOML)
    (src / "control" / "emitter_skill.py").write_text(EMITTER_CODE)
    bundle = build_skill(src, "1.0.0", [], tmp_path / "dist")
    per_item, items, fail_every = 3, 25, 5

    config = _config(tmp_path)
    config.state_dir.mkdir(parents=True)
    spec = pb.SkillSpec(
        name="emitter",
        version="1.0.0",
        target_name="emitter/emitter-1.0.0.skill",
        config={"events_per_item": str(per_item), "fail_every": str(fail_every)},
    )
    desired = pb.DesiredState(generation=1, skills=[spec])
    # The instruction a signed desired state left behind on an earlier run.
    key = _trust_director(config)
    signed = _sign(key, "cam-1", 1, desired)
    (config.state_dir / "director").mkdir()
    (config.state_dir / "director" / "instruction.bin").write_bytes(signed)
    source = ReplaySource(x=np.zeros((items, 8, 8), dtype=np.float32), y=None)
    launcher = make_launcher(PROFILE.targets, PROFILE.precisions, tmp_path / "logs")
    transport = OfflineTransport(config.state_dir / "outbox.db")
    agent = _agent(config, transport, launcher, lambda _name: bundle, source)

    def stored() -> list[pb.Telemetry]:
        return _telemetry([e.payload for e in agent.outbox.pending(limit=1000)])

    async def main() -> None:
        stop = asyncio.Event()
        running = asyncio.create_task(agent.run(stop))
        await async_wait_until(
            lambda: sum(t.inferences for t in stored()) == items, 60, "every item's telemetry"
        )
        stop.set()
        await running

    asyncio.run(main())
    with Outbox(config.state_dir / "outbox.db") as box:
        windows = _telemetry([e.payload for e in box.pending(limit=1000)])
    assert {(t.skill, t.version) for t in windows} == {("emitter", "1.0.0")}
    assert sum(t.inferences for t in windows) == items  # a failed item is an inference too
    failed = items // fail_every
    assert sum(t.errors for t in windows) == failed  # and the skill served on after each
    assert sum(t.metrics["events"] for t in windows) == per_item * (items - failed)


def test_only_the_directors_instructions_for_this_device_are_followed(tmp_path: Path) -> None:
    config = _config(tmp_path, reconcile_interval_s=60.0)
    key = _trust_director(config)
    transport = RecordingTransport(config.state_dir / "outbox.db")
    agent = _agent(config, transport, FakeLauncher())
    old = pb.DesiredState(generation=1)
    new = pb.DesiredState(generation=2)
    genuine_1, genuine_2 = _sign(key, "cam-1", 1, old), _sign(key, "cam-1", 2, new)
    attacks = [
        ("unsigned", make_envelope("hub", desired=pb.DesiredState(generation=2**62))),
        ("unknown-key", _signed_env(_sign(DirectorKey.generate(), "cam-1", 9, old))),
        ("foreign", _signed_env(_sign(key, "cam-2", 9, old))),
        ("expired", _signed_env(_sign(key, "cam-1", 9, old, ttl_ms=-1))),
        ("reordered", _signed_env(genuine_1)),
        ("replayed", _signed_env(_sign(key, "cam-1", 2, old))),
        ("bad-signature", _signed_env(genuine_2[:-1] + bytes([genuine_2[-1] ^ 1]))),
        ("malformed", _signed_env(b"ESDI1" + bytes(100))),
    ]

    def reported() -> dict[tuple[str, str], int]:
        events = [decode_envelope(e.payload) for e in agent.outbox.pending(limit=1000)]
        counts: dict[tuple[str, str], int] = {}
        for env in events:
            if kind_of(env) == "security_event":
                key_ = (env.security_event.kind, env.security_event.reason)
                counts[key_] = counts.get(key_, 0) + env.security_event.count
        return counts

    async def main() -> None:
        stop = asyncio.Event()
        running = asyncio.create_task(agent.run(stop))
        await transport.inbox.put(_signed_env(genuine_1))
        await async_wait_until(lambda: agent.gate.last_counter == 1, 10, "the first instruction")
        await transport.inbox.put(_signed_env(genuine_1))  # a retained copy: ignored quietly
        await transport.inbox.put(_signed_env(genuine_2))
        await async_wait_until(lambda: agent.gate.last_counter == 2, 10, "the second instruction")
        for _, env in attacks:
            await transport.inbox.put(env)
        expected = {("desired-refused", reason): 1 for reason, _ in attacks}
        await async_wait_until(lambda: reported() == expected, 10, "every refusal reported")
        stop.set()
        await running

    asyncio.run(main())
    assert agent.desired == new
    assert dict(agent.security.totals) == {("desired-refused", r): 1 for r, _ in attacks}
    # A restart keeps the replay protection.
    again = _agent(config, transport, FakeLauncher())
    assert (again.gate.last_counter, again.desired) == (2, new)
    again.outbox.close()


def test_only_an_accepted_desired_states_metadata_goes_to_the_trust_client(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path, reconcile_interval_s=60.0)
    key = _trust_director(config)
    transport = RecordingTransport(config.state_dir / "outbox.db")
    offers: list[MetadataOffer] = []
    agent = _agent(config, transport, FakeLauncher(), offer_metadata=offers.append)
    metadata = pb.MetadataOffer(
        root_version=1, files=[pb.MetadataFile(path="metadata/timestamp.json", data=b"{}")]
    )

    def offered(env: pb.Envelope) -> pb.Envelope:
        env.metadata.CopyFrom(metadata)
        return env

    genuine = _sign(key, "cam-1", 1, pb.DesiredState(generation=1))
    forged = offered(make_envelope("hub", desired=pb.DesiredState(generation=5)))

    async def main() -> None:
        stop = asyncio.Event()
        running = asyncio.create_task(agent.run(stop))
        await transport.inbox.put(forged)  # unsigned: refused, and its metadata with it
        await transport.inbox.put(offered(_signed_env(genuine)))
        await async_wait_until(lambda: agent.gate.last_counter == 1, 10, "the instruction")
        await transport.inbox.put(offered(_signed_env(genuine)))  # a retained copy: ignored
        await transport.inbox.put(forged)  # after the copy: once counted, the copy was read
        refused = ("desired-refused", "unsigned")
        await async_wait_until(lambda: agent.security.totals[refused] == 2, 10, "two refusals")
        stop.set()
        await running

    asyncio.run(main())
    assert offers == [MetadataOffer(1, {"metadata/timestamp.json": b"{}"})]


def test_a_module_that_swallows_its_cancellation_does_not_hang_the_stop(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(agent_module, "_STOP_GRACE_S", 0.3)
    ended: list[str] = []

    async def stubborn() -> None:
        while True:  # as Python 3.11's wait_for could: the cancellation is lost
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                continue

    async def polite() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            ended.append("polite")

    async def scenario() -> list[asyncio.Task[None]]:
        tasks = [asyncio.create_task(stubborn(), name="stubborn"), asyncio.create_task(polite())]
        await asyncio.sleep(0)
        await agent_module._cancel_all(tasks)
        left = [t for t in tasks if not t.done()]
        for task in left:  # let the test's loop close
            task.get_coro().close()
        return left

    left = asyncio.run(scenario())
    assert [t.get_name() for t in left] == ["stubborn"]
    assert ended == ["polite"]
    assert "agent module stubborn did not stop within 0.3 s" in caplog.text
    assert "in stubborn" in caplog.text


def test_a_quiet_agent_skips_its_outbox_read_and_still_resends_what_was_not_acked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(agent_module, "_QUIET_FLUSH_RECHECK_S", 0.2)  # quiet wakes, quickly
    config = _config(tmp_path, ack_timeout_s=1.0)
    transport = RecordingTransport(config.state_dir / "outbox.db")
    agent = _agent(config, transport, FakeLauncher())
    reads: list[int] = []
    read_pending = agent.outbox.pending

    def counted(limit: int = 100) -> list[Any]:
        reads.append(limit)
        return read_pending(limit)

    agent.outbox.pending = counted  # type: ignore[method-assign]

    def times_sent(msg_id: str) -> int:
        return sum(e.id == msg_id for e in transport.sent)

    async def ack_everything_sent() -> None:
        # Acked as sent, again while more comes (its reports follow its session's start).
        for _ in range(20):
            ids = sorted({e.id for e in transport.sent if kind_of(e) != "heartbeat"})
            await transport.inbox.put(make_envelope("hub", ack=pb.Ack(ids=ids)))
            with contextlib.suppress(TimeoutError):
                await async_wait_until(lambda: len(agent.outbox) == 0, 1, "the acks")
                return
        raise AssertionError("the outbox never emptied")

    async def quiet_wakes_read_nothing() -> None:
        for _ in range(20):
            await ack_everything_sent()
            before = len(reads)
            wanted = agent.flushes_skipped + 2

            def quiet_or_busy(wanted: int = wanted) -> bool:
                return agent.flushes_skipped >= wanted or len(agent.outbox) > 0

            await async_wait_until(quiet_or_busy, 10, "quiet wakes")
            if len(agent.outbox) == 0:  # two quiet wakes and nothing new: nothing was read
                assert len(reads) == before
                return
        raise AssertionError("the agent never went quiet")

    async def main() -> None:
        stop = asyncio.Event()
        running = asyncio.create_task(agent.run(stop))
        await async_wait_until(lambda: len(transport.sent) > 0, 10, "the first report")
        # Nothing waits for an ack and nothing is left: a quiet wake reads nothing.
        await quiet_wakes_read_nothing()
        # A new entry still leaves at once, handed over by the writer that committed it
        # (not read back), and unacked it goes again after ack_timeout_s, read from the outbox.
        reads_before = len(reads)
        env = make_envelope("cam-1", telemetry=pb.Telemetry(skill="s", version="1"))
        await agent.enqueue(env)
        await async_wait_until(lambda: times_sent(env.id) == 1, 5, "the entry sent")
        assert len(reads) == reads_before
        await async_wait_until(lambda: times_sent(env.id) == 2, 10, "the resend after the timeout")
        assert len(reads) > reads_before
        await ack_everything_sent()
        stop.set()
        await running

    asyncio.run(main())


def test_an_entry_awaiting_its_ack_wakes_the_flush_loop_only_when_it_is_overdue(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path, ack_timeout_s=4.0)
    transport = RecordingTransport(config.state_dir / "outbox.db")
    agent = _agent(config, transport, FakeLauncher())
    passes: list[float] = []
    flush = agent._flush

    async def counted(link: Any) -> None:
        passes.append(time.monotonic())
        await flush(link)

    agent._flush = counted  # type: ignore[method-assign]

    def sent_at(msg_id: str) -> list[float]:
        return [t for t, e in transport.sent_times if e.id == msg_id]

    async def main() -> tuple[list[float], list[float]]:
        stop = asyncio.Event()
        running = asyncio.create_task(agent.run(stop))
        await async_wait_until(lambda: len(transport.sent) > 0, 10, "the first report")
        for _ in range(20):  # the session's reports, acked until none is left
            ids = sorted({e.id for e in transport.sent if kind_of(e) != "heartbeat"})
            await transport.inbox.put(make_envelope("hub", ack=pb.Ack(ids=ids)))
            with contextlib.suppress(TimeoutError):
                await async_wait_until(lambda: not agent._in_flight, 1, "the acks")
                break
        env = make_envelope("cam-1", telemetry=pb.Telemetry(skill="s", version="1"))
        await agent.enqueue(env)
        await async_wait_until(lambda: len(sent_at(env.id)) == 2, 10, "the resend")
        stop.set()
        await running
        return sent_at(env.id), passes

    (first, again), passes = asyncio.run(main())
    assert again - first >= 4.0  # resent once overdue, not before
    # Between the send and the resend the loop slept: its one pass there is the one
    # that resent (two if the timer woke it a hair early), not one every second.
    assert 1 <= sum(first < t < again for t in passes) <= 2


class _Answers:
    """A stand-in control process that notes the thread each input was answered on."""

    def __init__(self, inline: bool) -> None:
        self.answers_inline = inline
        self.threads: list[int] = []

    def process(self, item: object) -> tuple[dict[str, int], float]:
        self.threads.append(threading.get_ident())
        return {"label": 0}, 1.0

    def drain_events(self) -> list[dict[str, object]]:
        return []


def test_only_a_stand_in_that_never_blocks_is_answered_on_the_loop(tmp_path: Path) -> None:
    config = _config(tmp_path)
    agent = _agent(config, RecordingTransport(config.state_dir / "outbox.db"), FakeLauncher())
    source = ReplaySource(x=np.zeros((3, 8, 8), dtype=np.float32), y=None)
    inline, piped = _Answers(inline=True), _Answers(inline=False)

    async def main() -> int:
        await agent._feed(("s", "1"), inline, source)  # type: ignore[arg-type]
        await agent._feed(("s", "2"), piped, source)  # type: ignore[arg-type]
        return threading.get_ident()

    loop_thread = asyncio.run(main())
    assert inline.threads == [loop_thread] * 3
    assert len(piped.threads) == 3 and loop_thread not in piped.threads
    assert agent.windows[("s", "1")].inferences == agent.windows[("s", "2")].inferences == 3
    agent.outbox.close()


def test_a_fetch_that_outlasts_its_pass_is_activated_when_it_ends_not_at_the_next_tick(
    tmp_path: Path,
) -> None:
    """A bundle still downloading when the pass stops waiting for it (the reconciler's
    ``supervise_s``) starts as soon as it arrives, not at the periodic reconcile."""
    src = tmp_path / "emitter-src"
    (src / "control").mkdir(parents=True)
    (src / "skill.toml").write_text(EMITTER_TOML)
    (src / "control" / "emitter_skill.py").write_text(EMITTER_CODE)
    bundle = build_skill(src, "1.0.0", [], tmp_path / "dist")
    # The periodic pass is far beyond the test's deadline: only the fetch's end can wake it.
    config = _config(tmp_path, insecure=True, reconcile_interval_s=600.0)
    transport = RecordingTransport(config.state_dir / "outbox.db")
    released = threading.Event()

    def slow_fetch(target: str) -> Path:
        assert target == "emitter/1.0.0"
        if not released.wait(30):
            raise TimeoutError("the test never released the fetch")
        return bundle

    agent = _agent(config, transport, FakeLauncher(), fetch_target=slow_fetch)
    agent.reconciler.supervise_s = 0.05
    desired = pb.DesiredState(generation=1)
    desired.skills.add(name="emitter", version="1.0.0", target_name="emitter/1.0.0")

    def state() -> str:
        s = agent.reconciler.states.get("emitter")
        return f"{s.state} {s.version}" if s else ""

    async def main() -> None:
        stop = asyncio.Event()
        running = asyncio.create_task(agent.run(stop))
        await transport.inbox.put(make_envelope("hub", desired=desired))
        await async_wait_until(lambda: state() == "installing ", 10, "the fetch to start")
        # The pass gave up waiting and reported: the reconcile loop now sleeps.
        await async_wait_until(lambda: not agent._report_due, 10, "the pass to return")
        assert not agent._wake_reconcile.is_set()
        released.set()
        await async_wait_until(lambda: state() == "running 1.0.0", 10, "the version to start")
        stop.set()
        await running

    asyncio.run(main())
