"""A 60 s broker outage: every telemetry window reaches the hub store exactly once.

The test runs its own Mosquitto (persistence on, in tmp_path) so it can stop it;
the system broker is left alone. Agents keep producing telemetry from a looping
replay source while the broker is down, one of them is restarted in the middle
of the outage, and afterwards every agent is stopped (SIGTERM flushes its last
window into the outbox) and started once more without a source to drain.

Each agent numbers its telemetry windows 1, 2, 3, ... in ``metrics["seq"]`` and
stores the last number in its outbox, in the commit of that window. If the stored
seq values of a device are exactly 1..N, where N is that stored number, nothing was lost
(no gap) and nothing was stored twice (no repeat) - across the outage, the
restart, resends after lost acks and the final drain.
"""

from __future__ import annotations

import getpass
import signal
import sqlite3
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from cloud.hub import Hub
from cloud.service import FleetService
from converters.digits import load_digits_data
from protos.envelope import now_ms
from tests.support import Fleet, agent_args, free_port, wait_for_port, wait_until
from tests.support.skillkit import write_holdout

DEVICES = ["cam-1", "cam-2", "cam-3"]
LABELS = ["kind=camera"]
OUTAGE_S = 60.0


class OwnBroker:
    """A Mosquitto of this test's own, on a free port, with persistence in ``folder``."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.conf = folder / "mosquitto.conf"
        self.conf.write_text(
            # Started as root, Mosquitto would switch to a user that cannot write here.
            f"user {getpass.getuser()}\n"
            f"listener {self.port} 127.0.0.1\n"
            "allow_anonymous true\n"
            "persistence true\n"
            f"persistence_location {folder}/\n"
            f"log_dest file {folder / 'mosquitto.log'}\n"
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(["mosquitto", "-c", str(self.conf)])
        wait_for_port(self.port, 10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # Mosquitto saves its sessions on the way out
            self.proc.wait(10)
        self.proc = None


def _seq_file(work: Path, device_id: str) -> int:
    """The last telemetry seq the device numbered, as its outbox keeps it."""
    conn = sqlite3.connect(work / "agents" / device_id / "outbox.db", timeout=10)
    try:
        row = conn.execute("SELECT value FROM counters WHERE name = 'telemetry.seq'").fetchone()
        return int(row[0]) if row else 0
    finally:
        conn.close()


def _outbox_size(work: Path, device_id: str) -> int:
    conn = sqlite3.connect(work / "agents" / device_id / "outbox.db", timeout=10)
    try:
        return int(conn.execute("SELECT COUNT(*) FROM entries").fetchone()[0])
    finally:
        conn.close()


def _stored_seqs(hub: Hub, device_id: str) -> list[int]:
    return [int(r.metrics["seq"]) for r in hub.store.telemetry_for(device_id)]


@pytest.mark.slow
def test_broker_outage_loses_and_duplicates_no_telemetry(tmp_path: Path, bundles) -> None:
    broker = OwnBroker(tmp_path / "broker")
    broker.start()
    url = f"mqtt://127.0.0.1:{broker.port}/es-outage?session_expiry=3600&keepalive=5"
    grpc_port = free_port()
    hub = Hub.init(tmp_path / "hub", grpc_bind=f"127.0.0.1:{grpc_port}", insecure=True)
    FleetService(hub).skills.publish(bundles.v1)
    hub.store.create_group("cameras", "kind=camera")
    source = tmp_path / "source.npz"
    write_holdout(load_digits_data(), source, limit=100)
    root = tmp_path / "hub" / "trust" / "metadata" / "root.json"
    fleet = Fleet(tmp_path / "logs")

    def start(device_id: str, with_source: bool = True) -> None:
        state = tmp_path / "agents" / device_id
        args = agent_args(url, device_id, LABELS, state, root, source if with_source else None)
        args += ["--insecure"]  # the system broker has no TLS; the outbox is under test here
        if with_source:
            args += ["--source-loop", "--source-rate", "20", "--telemetry-window", "0.5"]
        fleet.start(device_id, args)

    try:
        fleet.start("hub", ["hub", "serve", "--home", str(tmp_path / "hub"), "--mqtt", url])
        wait_for_port(grpc_port)
        for device_id in DEVICES:
            start(device_id)
        wait_until(lambda: len(hub.store.list_devices()) == len(DEVICES), 30, "three devices")
        hub.store.create_deployment("digits", "1.0.0", "cameras", now_ms=now_ms())
        for device_id in DEVICES:
            wait_until(
                lambda d=device_id: len(_stored_seqs(hub, d)) >= 3, 60, f"telemetry of {device_id}"
            )

        broker.stop()
        down_at = time.monotonic()
        before = {d: _seq_file(tmp_path, d) for d in DEVICES}

        def offline(n: int) -> bool:
            return all(_seq_file(tmp_path, d) - before[d] >= n for d in DEVICES)

        wait_until(lambda: offline(10), 60, "ten windows made offline by every agent")
        fleet.stop("cam-2")  # SIGTERM: the agent flushes its window into the outbox
        start("cam-2")
        # The scenario is an outage of OUTAGE_S: the broker stays down that long on purpose,
        # and until every agent (cam-2 after its restart too) has made 40 windows offline.
        wait_until(
            lambda: time.monotonic() - down_at >= OUTAGE_S and offline(40),
            OUTAGE_S + 60,
            "the outage to last its time with 40 windows made offline by every agent",
        )
        during = {d: _seq_file(tmp_path, d) - before[d] for d in DEVICES}
        broker.start()

        for device_id in DEVICES:  # the windows made offline arrive
            target = before[device_id] + during[device_id]
            wait_until(
                lambda d=device_id, t=target: len(_stored_seqs(hub, d)) >= t,
                60,
                f"{device_id} to catch up",
            )
        for device_id in DEVICES:
            fleet.stop(device_id)
            start(device_id, with_source=False)  # no source: nothing new, only the drain
        final = {d: _seq_file(tmp_path, d) for d in DEVICES}
        for device_id in DEVICES:
            wait_until(
                lambda d=device_id: len(_stored_seqs(hub, d)) >= final[d],
                60,
                f"{device_id} to drain",
            )
        # Once an agent's outbox is empty the hub has acknowledged every window, so nothing
        # is left to resend; copies published before an ack reach the hub before that ack
        # (the broker keeps each session's order), so no duplicate can land after this.
        for device_id in DEVICES:
            wait_until(
                lambda d=device_id: _outbox_size(tmp_path, d) == 0,
                60,
                f"{device_id}'s outbox to be acknowledged",
            )

        for device_id in DEVICES:
            seqs = _stored_seqs(hub, device_id)
            repeats = {s: n for s, n in Counter(seqs).items() if n > 1}
            missing = sorted(set(range(1, final[device_id] + 1)) - set(seqs))
            assert not repeats, f"{device_id}: stored twice: {repeats}"
            assert not missing, f"{device_id}: lost: {missing[:20]}"
            assert sorted(seqs) == list(range(1, final[device_id] + 1))
    finally:
        fleet.stop_all()
        broker.stop()
        hub.close()
