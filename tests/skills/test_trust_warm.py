"""``TrustClient`` keeps what it verified between refreshes, and still refuses every attack.

A warm client (one whose last refresh succeeded) neither parses nor verifies its
local metadata again when the hub has nothing new; each attack below is staged
against such a client, after checking that it is warm.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from securesystemslib.signer import CryptoSigner
from tuf.api.metadata import Metadata, MetaFile, Root

from edgeskill.processes import wait_until
from skills.errors import TrustError
from skills.trust import TrustClient, TrustRepository
from skills.trust.ceremony import rotate_online_key
from tests.fakes.hub_fetch import HubFetch
from tests.skills.test_trust import NAME, _add, _client, _key, _link_snapshot, _load, _sign

OTHER = "digits/digits-2.0.0.skill"


@dataclass
class Work:
    """What ngclient parsed (role types) and how many signature checks a delegator made."""

    parsed: list[str] = field(default_factory=list)
    verified: int = 0

    def clear(self) -> None:
        self.parsed.clear()
        self.verified = 0


@pytest.fixture
def work(monkeypatch: pytest.MonkeyPatch) -> Work:
    """Counts every metadata parse and root signature check, still doing them."""
    seen = Work()
    real_parse = Metadata.from_bytes.__func__  # type: ignore[attr-defined]
    real_verify = Root.verify_delegate

    def parse(cls: type[Metadata[Any]], data: bytes, deserializer: Any = None) -> Metadata[Any]:
        md: Metadata[Any] = real_parse(cls, data, deserializer)
        seen.parsed.append(md.signed.type)
        return md

    def verify(self: Root, *args: Any, **kwargs: Any) -> None:
        seen.verified += 1
        real_verify(self, *args, **kwargs)

    monkeypatch.setattr(Metadata, "from_bytes", classmethod(parse))
    monkeypatch.setattr(Root, "verify_delegate", verify)
    return seen


def _warm(tmp_path: Path, repo: TrustRepository, work: Work) -> tuple[TrustClient, HubFetch]:
    """A client that fetched NAME, then fetched it again with nothing verified anew."""
    client, fetch = _client(tmp_path, repo)
    client.fetch_target(NAME)
    work.clear()
    fetch.calls.clear()
    assert client.fetch_target(NAME).read_bytes() == b"v1"
    assert (work.parsed, work.verified) == ([], 0)
    root_version = client.trusted_root_version()
    assert fetch.calls == [f"metadata/{root_version + 1}.root.json", "metadata/timestamp.json"]
    fetch.calls.clear()
    work.clear()
    return client, fetch


def _hub_with_v1(tmp_path: Path) -> TrustRepository:
    repo = TrustRepository.init(tmp_path / "hub")
    _add(tmp_path, repo, NAME, b"v1")
    return repo


def _state(folder: Path) -> dict[str, bytes | str]:
    """Every file of a metadata folder by relative path: its bytes, or a link's target."""
    return {
        str(p.relative_to(folder)): str(p.readlink()) if p.is_symlink() else p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_symlink() or p.is_file()
    }


def test_a_refresh_with_nothing_new_parses_and_verifies_nothing_again(
    tmp_path: Path, work: Work
) -> None:
    repo = _hub_with_v1(tmp_path)
    client, fetch = _warm(tmp_path, repo, work)
    metadata = tmp_path / "agent" / "metadata"
    before = _state(metadata)

    client.refresh()
    client.fetch_target(NAME)
    assert (work.parsed, work.verified) == ([], 0)
    assert fetch.calls == ["metadata/2.root.json", "metadata/timestamp.json"] * 2
    assert _state(metadata) == before

    # An agent restarting on this folder starts from it as ngclient left it.
    restarted = TrustClient(tmp_path / "agent", HubFetch(repo))
    assert restarted.fetch_target(NAME).read_bytes() == b"v1"


def test_a_new_timestamp_verifies_only_the_root_and_itself(tmp_path: Path, work: Work) -> None:
    repo = _hub_with_v1(tmp_path)
    client, _ = _warm(tmp_path, repo, work)

    repo.refresh_timestamp()
    work.clear()  # the hub's own parses
    client.fetch_target(NAME)
    # The updater's own root, and the hub's new timestamp: the local timestamp,
    # snapshot and targets verified by the last refresh are not verified again.
    assert (sorted(work.parsed), work.verified) == (["root", "timestamp"], 2)

    work.clear()
    client.fetch_target(NAME)
    assert (work.parsed, work.verified) == ([], 0)


def test_the_disk_state_is_what_ngclient_alone_leaves(tmp_path: Path) -> None:
    repo = _hub_with_v1(tmp_path)
    warm = TrustClient(tmp_path / "warm", HubFetch(repo), repo.root_json())
    cold = tmp_path / "cold"  # a new client per call: no metadata kept in memory
    TrustClient(cold, HubFetch(repo), repo.root_json()).refresh()
    warm.refresh()
    for change in (None, repo.refresh_timestamp, None, lambda: _add(tmp_path, repo, OTHER, b"2")):
        if change is not None:
            change()
        for _ in range(2):
            assert warm.fetch_target(NAME).read_bytes() == b"v1"
            assert TrustClient(cold, HubFetch(repo)).fetch_target(NAME).read_bytes() == b"v1"
        assert _state(tmp_path / "warm" / "metadata") == _state(cold / "metadata")


def _expire_soon(hub: Path, role: str, when: datetime) -> None:
    """Publish ``role`` (and the chain above it) expiring at ``when``, with the hub's own keys."""
    targets: dict[str, Any] = {}
    if role == "targets":
        data = _sign(hub, _load(hub, "targets"), _key(hub, "targets"), expires=when)
        version = _load(hub, "targets").signed.version
        targets["meta"] = {"targets.json": MetaFile.from_data(version, data, ["sha256"])}
    if role in {"targets", "snapshot"}:
        snapshot = _load(hub, "snapshot")
        expires = when if role == "snapshot" else snapshot.signed.expires
        data = _sign(hub, snapshot, _key(hub, "snapshot"), expires=expires, **targets)
        _link_snapshot(hub, data, snapshot.signed.version)
    else:
        _sign(hub, _load(hub, "timestamp"), _key(hub, "timestamp"), expires=when)


@pytest.mark.parametrize("role", ["timestamp", "snapshot", "targets"])
def test_metadata_expiring_while_nothing_changes_is_a_freeze(
    tmp_path: Path, work: Work, role: str
) -> None:
    repo = _hub_with_v1(tmp_path)
    soon = (datetime.now(UTC) + timedelta(seconds=3)).replace(microsecond=0)
    _expire_soon(tmp_path / "hub", role, soon)
    client, fetch = _warm(tmp_path, repo, work)

    wait_until(lambda: datetime.now(UTC) > soon, 10, f"{role} to expire", interval_s=0.05)
    with pytest.raises(TrustError, match="metadata expired"):
        client.fetch_target(NAME)  # the hub's files did not change
    with pytest.raises(TrustError, match="metadata expired"):
        client.refresh()
    assert fetch.target_calls() == []

    repo.refresh_timestamp()  # renews whatever is past half its life
    assert client.fetch_target(NAME).read_bytes() == b"v1"


def test_rollback_is_refused_by_a_warm_client(tmp_path: Path, work: Work) -> None:
    repo = _hub_with_v1(tmp_path)
    old_timestamp = repo.read("metadata/timestamp.json", 1 << 14)
    _add(tmp_path, repo, OTHER, b"v2")
    client, fetch = _warm(tmp_path, repo, work)

    fetch.override["metadata/timestamp.json"] = old_timestamp
    with pytest.raises(TrustError, match="rollback attack"):
        client.fetch_target(NAME)
    fetch.override.clear()

    _warm_again(client, work)
    hub = tmp_path / "hub"
    _link_snapshot(hub, (hub / "metadata" / "2.snapshot.json").read_bytes(), 2)
    with pytest.raises(TrustError, match=r"rollback attack: .*snapshot version"):
        client.fetch_target(NAME)


def _warm_again(client: TrustClient, work: Work) -> None:
    client.fetch_target(NAME)
    work.clear()
    client.fetch_target(NAME)
    assert (work.parsed, work.verified) == ([], 0)


@pytest.mark.parametrize("signer", ["rogue", "none", "timestamp"])
def test_other_timestamp_bytes_of_the_same_version_are_verified(
    tmp_path: Path, work: Work, signer: str
) -> None:
    repo = _hub_with_v1(tmp_path)
    client, fetch = _warm(tmp_path, repo, work)
    kept = (tmp_path / "agent" / "metadata" / "timestamp.json").read_bytes()
    same_version = _load(tmp_path / "hub", "timestamp")
    same_version.signed.expires += timedelta(hours=1)
    if signer == "rogue":
        same_version.sign(CryptoSigner.generate_ed25519())
    elif signer == "timestamp":
        same_version.sign(_key(tmp_path / "hub", "timestamp"))
    fetch.override["metadata/timestamp.json"] = same_version.to_bytes()

    if signer == "timestamp":  # genuine: ngclient keeps the timestamp it has
        assert client.fetch_target(NAME).read_bytes() == b"v1"
        assert work.parsed.count("timestamp") >= 1
    else:
        with pytest.raises(TrustError, match="signature not trusted"):
            client.fetch_target(NAME)
    assert (tmp_path / "agent" / "metadata" / "timestamp.json").read_bytes() == kept


def test_a_root_rotation_between_fetches_is_followed(tmp_path: Path, work: Work) -> None:
    repo = _hub_with_v1(tmp_path)
    client, fetch = _warm(tmp_path, repo, work)
    stale = repo.read("metadata/timestamp.json", 1 << 14)
    online = repo.online_root_signer()
    assert online is not None

    # Root v2 retires the timestamp key: what the warm client last verified no longer is.
    assert rotate_online_key(repo, "timestamp", [online]) == 2
    fetch.override["metadata/timestamp.json"] = stale
    with pytest.raises(TrustError, match="signature not trusted"):
        client.fetch_target(NAME)
    assert fetch.calls[:2] == ["metadata/2.root.json", "metadata/3.root.json"]

    fetch.override.clear()
    assert client.fetch_target(NAME).read_bytes() == b"v1"
    assert client.trusted_root_version() == 2
    fetch.calls.clear()
    client.fetch_target(NAME)
    assert fetch.calls == ["metadata/3.root.json", "metadata/timestamp.json"]


def test_a_tampered_target_is_refused_by_a_warm_client(tmp_path: Path, work: Work) -> None:
    repo = _hub_with_v1(tmp_path)
    served_path = repo.targets()[0].path
    client, fetch = _warm(tmp_path, repo, work)
    (tmp_path / "hub" / served_path).write_bytes(b"v2")  # same length, other bytes
    (cached,) = (tmp_path / "agent" / "targets").iterdir()
    cached.write_bytes(b"v2")  # so the agent must fetch it again

    with pytest.raises(TrustError, match="hash mismatch"):
        client.fetch_target(NAME)
    assert fetch.target_calls() == [served_path]
    assert (work.parsed, work.verified) == ([], 0)  # the metadata had not changed


def test_metadata_another_client_wrote_is_read_again(tmp_path: Path, work: Work) -> None:
    repo = _hub_with_v1(tmp_path)
    client, fetch = _warm(tmp_path, repo, work)
    stale = repo.read("metadata/timestamp.json", 1 << 14)
    repo.refresh_timestamp()
    TrustClient(tmp_path / "agent", HubFetch(repo)).refresh()  # persists the newer timestamp

    fetch.override["metadata/timestamp.json"] = stale  # what the warm client last saw
    with pytest.raises(TrustError, match="rollback attack"):
        client.fetch_target(NAME)
