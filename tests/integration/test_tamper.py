"""Tampered bundles and metadata are refused while the installed version keeps running."""

from __future__ import annotations

import json
import shutil

from securesystemslib.signer import CryptoSigner
from tuf.api.metadata import Metadata

from tests.support import wait_until

CAMERAS = ["kind=camera"]


def _running_v1(cluster) -> None:
    cluster.start_agent("cam-1", CAMERAS)
    cluster.deploy("1.0.0")
    cluster.wait_state("cam-1", "1.0.0", "running")


def _assert_still_v1(cluster) -> None:
    assert cluster.active_version("cam-1") == "1.0.0"
    pid_file_free = cluster.fleet.procs["cam-1"].poll() is None
    assert pid_file_free, "the agent died instead of refusing"


def _assert_reported(cluster, reason: str) -> None:
    """The refusal reached the hub as a security event of the device."""

    def reported() -> bool:
        events = cluster.hub.store.security_events("cam-1", limit=100)
        return any((e.kind, e.reason) == ("install-refused", reason) for e in events)

    wait_until(reported, 30, f"the hub to store install-refused/{reason}")


def test_bundle_changed_after_signing_is_refused(cluster) -> None:
    _running_v1(cluster)
    served = next((cluster.home / "trust" / "targets").rglob("*digits-2.0.0.skill"))
    data = bytearray(served.read_bytes())
    data[len(data) // 2] ^= 0x01
    served.write_bytes(bytes(data))

    cluster.deploy("2.0.0")
    error = cluster.wait_state("cam-1", "1.0.0", "failed")
    assert "hash mismatch" in error.lower()
    _assert_still_v1(cluster)
    _assert_reported(cluster, "trust")


def test_metadata_signed_by_untrusted_key_is_refused(cluster) -> None:
    _running_v1(cluster)
    meta = cluster.home / "trust" / "metadata"
    timestamp = Metadata.from_file(str(meta / "timestamp.json"))
    timestamp.signed.version += 1
    rogue = CryptoSigner.generate_ed25519()
    timestamp.signatures.clear()
    timestamp.sign(rogue)
    timestamp.to_file(str(meta / "timestamp.json"))

    cluster.deploy("2.0.0")
    error = cluster.wait_state("cam-1", "1.0.0", "failed")
    assert "signature not trusted" in error.lower()
    _assert_still_v1(cluster)
    _assert_reported(cluster, "trust")


def test_replayed_old_metadata_is_refused_then_recovers(cluster) -> None:
    _running_v1(cluster)
    meta = cluster.home / "trust" / "metadata"
    old_timestamp = meta.parent / "timestamp-old.json"
    shutil.copyfile(meta / "timestamp.json", old_timestamp)
    # The hub signs something new, so the device sees a newer timestamp...
    cluster.hub.trust.refresh_timestamp()
    cluster.deploy("3.0.0")
    cluster.wait_state("cam-1", "3.0.0", "running")
    current = (meta / "timestamp.json").read_bytes()
    # ...then an attacker replays the older, validly signed copy.
    shutil.copyfile(old_timestamp, meta / "timestamp.json")
    assert (
        json.loads(old_timestamp.read_text())["signed"]["version"]
        < json.loads(current)["signed"]["version"]
    )

    cluster.deploy("2.0.0")
    error = cluster.wait_state("cam-1", "3.0.0", "failed")
    assert "rollback" in error.lower() or "version" in error.lower()
    assert cluster.active_version("cam-1") == "3.0.0"

    # Once the hub serves its real metadata again, the order goes through.
    (meta / "timestamp.json").write_bytes(current)
    cluster.wait_state("cam-1", "2.0.0", "running", timeout_s=90)
