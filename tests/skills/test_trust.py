"""The hub's TUF repository and the agent's verifying client, end to end on disk.

The client's fetch function reads straight from a TrustRepository in tmp_path;
attacks are staged by re-signing metadata with the repository's own keys (a
compromised online key) or with a key the root does not trust.
"""

from __future__ import annotations

import stat
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from securesystemslib.signer import CryptoSigner
from tuf.api.metadata import Metadata, MetaFile, TargetFile

import skills.trust.client as client_module
from skills.errors import FetchError, TrustError
from skills.trust import TrustClient, TrustLimits, TrustRepository
from tests.fakes.hub_fetch import HubFetch

NAME = "digits/digits-1.0.0.skill"


def _hub(tmp_path: Path) -> TrustRepository:
    return TrustRepository.init(tmp_path / "hub")


def _add(tmp_path: Path, repo: TrustRepository, name: str, data: bytes) -> None:
    source = tmp_path / "src-extra"
    source.write_bytes(data)
    repo.add_target(name, source)


def _client(tmp_path: Path, repo: TrustRepository, **kw: Any) -> tuple[TrustClient, HubFetch]:
    fetch = HubFetch(repo)
    return TrustClient(tmp_path / "agent", fetch, repo.root_json(), **kw), fetch


def _key(hub: Path, role: str) -> CryptoSigner:
    return CryptoSigner(load_pem_private_key((hub / "keys" / f"{role}.pem").read_bytes(), None))


def _load(hub: Path, role: str) -> Metadata[Any]:
    return Metadata.from_bytes((hub / "metadata" / f"{role}.json").read_bytes())


def _sign(hub: Path, md: Metadata[Any], signer: CryptoSigner, **changes: Any) -> bytes:
    """Bump, change, sign and write ``md`` the way the hub would publish it."""
    md.signed.version += 1
    for key, value in changes.items():
        setattr(md.signed, key, value)
    md.sign(signer)
    data = md.to_bytes()
    role = md.signed.type
    if role != "timestamp":
        (hub / "metadata" / f"{md.signed.version}.{role}.json").write_bytes(data)
    (hub / "metadata" / f"{role}.json").write_bytes(data)
    return data


def _link_snapshot(hub: Path, snapshot_bytes: bytes, version: int) -> None:
    """Publish a timestamp (with the real timestamp key) pointing at snapshot ``version``."""
    meta = MetaFile.from_data(version, snapshot_bytes, ["sha256"])
    _sign(hub, _load(hub, "timestamp"), _key(hub, "timestamp"), snapshot_meta=meta)


def test_fetch_verifies_and_then_uses_the_cache(tmp_path: Path) -> None:
    repo = _hub(tmp_path)
    _add(tmp_path, repo, "digits/other.skill", b"other")
    _add(tmp_path, repo, NAME, b"bundle bytes" * 100)
    client, fetch = _client(tmp_path, repo)

    first = client.fetch_target(NAME)
    assert first.read_bytes() == b"bundle bytes" * 100
    assert first.is_relative_to(tmp_path / "agent" / "verified")  # a private, re-hashed copy
    assert fetch.target_calls() == [repo.targets()[0].path]

    fetch.calls.clear()
    assert client.fetch_target(NAME) == first
    assert fetch.target_calls() == []
    assert "metadata/timestamp.json" in fetch.calls
    assert client.trusted_root_version() == 1


def test_tampered_target_is_refused(tmp_path: Path) -> None:
    repo = _hub(tmp_path)
    _add(tmp_path, repo, NAME, b"genuine bundle")
    served = tmp_path / "hub" / repo.targets()[0].path
    data = bytearray(served.read_bytes())
    data[3] ^= 0x01
    served.write_bytes(bytes(data))
    client, _ = _client(tmp_path, repo)

    with pytest.raises(TrustError, match="hash mismatch"):
        client.fetch_target(NAME)
    assert list((tmp_path / "agent" / "targets").iterdir()) == []


@pytest.mark.parametrize("role", ["targets", "snapshot"])
def test_metadata_signed_by_an_untrusted_key_is_refused(tmp_path: Path, role: str) -> None:
    repo = _hub(tmp_path)
    _add(tmp_path, repo, NAME, b"genuine bundle")
    client, _ = _client(tmp_path, repo)
    client.fetch_target(NAME)
    hub, rogue = tmp_path / "hub", CryptoSigner.generate_ed25519()

    evil = tmp_path / "evil"
    evil.write_bytes(b"evil bundle")
    targets = _load(hub, "targets")
    targets.signed.targets["evil.skill"] = TargetFile.from_file("evil.skill", str(evil))
    t_bytes = _sign(hub, targets, rogue if role == "targets" else _key(hub, "targets"))
    snapshot = _load(hub, "snapshot")
    snapshot.signed.meta["targets.json"] = MetaFile.from_data(
        targets.signed.version, t_bytes, ["sha256"]
    )
    s_bytes = _sign(hub, snapshot, rogue if role == "snapshot" else _key(hub, "snapshot"))
    _link_snapshot(hub, s_bytes, snapshot.signed.version)

    with pytest.raises(TrustError, match="signature not trusted"):
        client.fetch_target("evil.skill")


def test_older_timestamp_is_a_rollback(tmp_path: Path) -> None:
    repo = _hub(tmp_path)
    _add(tmp_path, repo, NAME, b"v1")
    old_timestamp = repo.read("metadata/timestamp.json", 1 << 14)  # version 2
    _add(tmp_path, repo, "digits/digits-2.0.0.skill", b"v2")  # timestamp version 3
    client, fetch = _client(tmp_path, repo)
    client.fetch_target(NAME)

    fetch.override["metadata/timestamp.json"] = old_timestamp
    with pytest.raises(TrustError, match=r"rollback attack: .*timestamp version 2 must be >= 3"):
        client.fetch_target(NAME)


def test_timestamp_pointing_at_an_older_snapshot_is_a_rollback(tmp_path: Path) -> None:
    repo = _hub(tmp_path)
    _add(tmp_path, repo, NAME, b"v1")
    _add(tmp_path, repo, "digits/digits-2.0.0.skill", b"v2")
    client, _ = _client(tmp_path, repo)
    client.fetch_target(NAME)  # has seen snapshot version 3

    hub = tmp_path / "hub"
    _link_snapshot(hub, (hub / "metadata" / "2.snapshot.json").read_bytes(), 2)
    with pytest.raises(TrustError, match=r"rollback attack: .*snapshot version"):
        client.fetch_target(NAME)


def test_replayed_snapshot_file_is_refused(tmp_path: Path) -> None:
    repo = _hub(tmp_path)
    _add(tmp_path, repo, NAME, b"v1")
    client, fetch = _client(tmp_path, repo)
    client.fetch_target(NAME)
    _add(tmp_path, repo, "digits/digits-2.0.0.skill", b"v2")  # snapshot version 3

    fetch.override["metadata/3.snapshot.json"] = repo.read("metadata/2.snapshot.json", 1 << 20)
    with pytest.raises(TrustError, match="hash mismatch"):
        client.fetch_target("digits/digits-2.0.0.skill")


def test_expired_timestamp_is_a_freeze(tmp_path: Path) -> None:
    repo = _hub(tmp_path)
    _add(tmp_path, repo, NAME, b"v1")
    hub = tmp_path / "hub"
    past = datetime.now(UTC) - timedelta(hours=1)
    _sign(hub, _load(hub, "timestamp"), _key(hub, "timestamp"), expires=past)
    client, fetch = _client(tmp_path, repo)

    with pytest.raises(TrustError, match="metadata expired"):
        client.fetch_target(NAME)
    assert fetch.target_calls() == []

    repo.refresh_timestamp()  # the hub resumes re-signing: the agent recovers
    assert client.fetch_target(NAME).read_bytes() == b"v1"


def test_redeploying_an_older_target_still_verifies(tmp_path: Path) -> None:
    repo = _hub(tmp_path)
    _add(tmp_path, repo, NAME, b"version one")
    _add(tmp_path, repo, "digits/digits-2.0.0.skill", b"version two")
    client, _ = _client(tmp_path, repo)

    assert client.fetch_target("digits/digits-2.0.0.skill").read_bytes() == b"version two"
    assert client.fetch_target(NAME).read_bytes() == b"version one"


def test_refreshed_timestamp_is_accepted(tmp_path: Path) -> None:
    repo = _hub(tmp_path)
    _add(tmp_path, repo, NAME, b"v1")
    client, _ = _client(tmp_path, repo)
    client.fetch_target(NAME)
    before = _load(tmp_path / "hub", "timestamp").signed.version

    repo.refresh_timestamp()
    assert _load(tmp_path / "hub", "timestamp").signed.version == before + 1
    assert client.fetch_target(NAME).read_bytes() == b"v1"


def test_refresh_renews_a_snapshot_past_half_its_life(tmp_path: Path) -> None:
    repo = TrustRepository.init(tmp_path / "hub", expiry_days={"snapshot": 2, "timestamp": 3})
    _add(tmp_path, repo, NAME, b"v1")
    hub = tmp_path / "hub"
    soon = datetime.now(UTC) + timedelta(hours=20)
    snapshot = _load(hub, "snapshot")
    _link_snapshot(hub, _sign(hub, snapshot, _key(hub, "snapshot"), expires=soon), 3)

    TrustRepository.open(hub).refresh_timestamp()
    renewed = _load(hub, "snapshot").signed
    assert renewed.version == 4
    assert renewed.expires > datetime.now(UTC) + timedelta(hours=47)
    timestamp = _load(hub, "timestamp").signed
    assert timestamp.snapshot_meta.version == 4
    assert timestamp.expires > datetime.now(UTC) + timedelta(hours=71)  # kept from init
    client, _ = _client(tmp_path, repo)
    assert client.fetch_target(NAME).read_bytes() == b"v1"


@pytest.mark.parametrize(
    "expiry", [{"snapshot": 0}, {"timestamp": 1.5}, {"mirror": 1}, {"root": 100_000}]
)
def test_bad_expiry_is_refused(tmp_path: Path, expiry: Any) -> None:
    with pytest.raises(TrustError, match=r"expiry|role"):
        TrustRepository.init(tmp_path / "hub", expiry_days=expiry)
    assert not (tmp_path / "hub" / "metadata" / "root.json").exists()


def test_keys_are_private_and_init_refuses_an_existing_repository(tmp_path: Path) -> None:
    _hub(tmp_path)
    keys = tmp_path / "hub" / "keys"
    assert stat.S_IMODE(keys.stat().st_mode) == 0o700
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in keys.iterdir()}
    assert modes == dict.fromkeys(
        ["root.pem", "targets.pem", "snapshot.pem", "timestamp.pem"], 0o600
    )
    root_before = (tmp_path / "hub" / "metadata" / "root.json").read_bytes()

    with pytest.raises(TrustError, match="already has a root"):
        TrustRepository.init(tmp_path / "hub")
    assert (tmp_path / "hub" / "metadata" / "root.json").read_bytes() == root_before
    with pytest.raises(TrustError, match="no TUF repository"):
        TrustRepository.open(tmp_path / "elsewhere")


@pytest.mark.parametrize(
    "name",
    ["", "/abs.skill", "../up.skill", "a/../b.skill", "a//b.skill", "a/./b.skill", "sp ace",
     "back\\slash", "x" * 201, "a/"],
)  # fmt: skip
def test_bad_target_names_are_refused(tmp_path: Path, name: str) -> None:
    repo = _hub(tmp_path)
    source = tmp_path / "src"
    source.write_bytes(b"data")
    with pytest.raises(TrustError, match="bad target name"):
        repo.add_target(name, source)
    assert _load(tmp_path / "hub", "targets").signed.version == 1
    client, _ = _client(tmp_path, repo)
    with pytest.raises(TrustError, match="bad target name"):
        client.fetch_target(name)


def test_targets_are_immutable(tmp_path: Path) -> None:
    repo = _hub(tmp_path)
    source = tmp_path / "src"
    source.write_bytes(b"first")
    ref = repo.add_target(NAME, source)
    assert repo.add_target(NAME, source) == ref
    assert _load(tmp_path / "hub", "targets").signed.version == 2

    source.write_bytes(b"other")
    with pytest.raises(TrustError, match="immutable"):
        repo.add_target(NAME, source)
    assert repo.targets() == [ref]
    assert repo.read(ref.path, 100) == b"first"
    assert [p.name for p in (tmp_path / "hub").glob(".stage-*")] == []


def test_oversize_metadata_is_refused(tmp_path: Path) -> None:
    repo = _hub(tmp_path)
    _add(tmp_path, repo, NAME, b"v1")
    client, fetch = _client(tmp_path, repo, limits=TrustLimits(max_timestamp_bytes=4096))
    fetch.override["metadata/timestamp.json"] = b" " * 4097

    with pytest.raises(TrustError, match="oversize"):
        client.fetch_target(NAME)


def test_unknown_target_and_missing_root(tmp_path: Path) -> None:
    repo = _hub(tmp_path)
    client, _ = _client(tmp_path, repo)
    with pytest.raises(TrustError, match="unknown target"):
        client.fetch_target("nope.skill")
    with pytest.raises(TrustError, match="no trusted root"):
        TrustClient(tmp_path / "other-agent", HubFetch(repo))
    # Once bootstrapped, the state folder's own root is enough.
    assert TrustClient(tmp_path / "agent", HubFetch(repo)).trusted_root_version() == 1


def test_transport_failure_is_a_fetch_error(tmp_path: Path) -> None:
    repo = _hub(tmp_path)

    def broken(path: str, cap: int) -> bytes:
        raise FetchError("hub unreachable")

    client = TrustClient(tmp_path / "agent", broken, repo.root_json())
    with pytest.raises(FetchError, match="hub unreachable"):
        client.fetch_target(NAME)


@pytest.mark.parametrize(
    "path",
    ["keys/root.pem", "metadata/../keys/root.pem", "targets/../keys/root.pem", "/etc/passwd",
     "metadata/sub/x.json", "expiry.json", "targets/link/root.pem", "metadata/"],
)  # fmt: skip
def test_repository_serves_nothing_outside_metadata_and_targets(tmp_path: Path, path: str) -> None:
    repo = _hub(tmp_path)
    (tmp_path / "hub" / "targets" / "link").symlink_to(tmp_path / "hub" / "keys")
    with pytest.raises(TrustError, match="repository path"):
        repo.open_file(path)


def test_repository_missing_file_and_read_cap(tmp_path: Path) -> None:
    repo = _hub(tmp_path)
    with pytest.raises(FileNotFoundError):
        repo.open_file("metadata/9.root.json")
    with pytest.raises(FileNotFoundError):
        repo.open_file("targets/nothing.skill")
    with pytest.raises(TrustError, match="cap"):
        repo.read("metadata/root.json", 10)


def test_concurrent_adds_all_land(tmp_path: Path) -> None:
    repo = _hub(tmp_path)
    sources = []
    for i in range(8):
        sources.append(tmp_path / f"s{i}")
        sources[-1].write_bytes(f"bundle {i}".encode())
    with ThreadPoolExecutor(4) as pool:
        # Separate instances, as separate hub processes would have.
        list(
            pool.map(
                lambda i: TrustRepository.open(tmp_path / "hub").add_target(
                    f"s/{i}.skill", sources[i]
                ),
                range(8),
            )
        )
    assert [t.name for t in repo.targets()] == [f"s/{i}.skill" for i in range(8)]
    assert _load(tmp_path / "hub", "timestamp").signed.version == 9
    client, _ = _client(tmp_path, repo)
    assert client.fetch_target("s/5.skill").read_bytes() == b"bundle 5"


def test_a_target_swapped_after_verification_is_not_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # RAUC's CVE-2020-25860: the bundle was checked, then opened again for install.
    # Here the verified file is swapped in the moment between ngclient's check and
    # the private copy the agent installs from; the copy is hashed and refused.
    repo = _hub(tmp_path)
    _add(tmp_path, repo, NAME, b"genuine bundle")
    client, _ = _client(tmp_path, repo)
    real_copy = client_module.stage_copy

    def swap_then_copy(source: Path, folder: Path, max_bytes: int) -> tuple[Path, str, int]:
        source.write_bytes(b"evil bundle!!!")  # same length, other bytes
        return real_copy(source, folder, max_bytes)

    monkeypatch.setattr(client_module, "stage_copy", swap_then_copy)
    with pytest.raises(TrustError, match="changed after it was verified"):
        client.fetch_target(NAME)
    assert list((tmp_path / "agent" / "verified").iterdir()) == []

    monkeypatch.undo()  # the swapped cache fails ngclient's own check and is fetched again
    assert client.fetch_target(NAME).read_bytes() == b"genuine bundle"
