"""The key ceremony: offline root keys with a threshold, renewal, rotation — seen by a device.

Each test keeps an agent's TUF client that trusts the first root and checks
that it walks through the ceremony (or refuses what it must refuse).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from securesystemslib.signer import CryptoSigner
from tuf.api.metadata import Metadata

from skills.errors import TrustError
from skills.trust import TrustClient, TrustRepository
from skills.trust.ceremony import (
    generate_root_keys,
    load_signers,
    renew_root,
    rotate_online_key,
    rotate_root_keys,
)
from tests.fakes.hub_fetch import HubFetch


def _push(tmp_path: Path, repo: TrustRepository, name: str, data: bytes) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    repo.add_target(name, src)


@pytest.fixture
def offline(tmp_path: Path) -> tuple[TrustRepository, list[CryptoSigner]]:
    keys = load_signers(generate_root_keys(tmp_path / "offline", 3))
    repo = TrustRepository.init(tmp_path / "hub", root_signers=keys, root_threshold=2)
    return repo, keys


def test_an_offline_root_is_not_kept_by_the_hub(
    tmp_path: Path, offline: tuple[TrustRepository, list[CryptoSigner]]
) -> None:
    repo, keys = offline
    assert sorted(p.name for p in (tmp_path / "hub" / "keys").iterdir()) == [
        "snapshot.pem",
        "targets.pem",
        "timestamp.pem",
    ]
    root = repo.metadata("root").signed
    assert root.roles["root"].threshold == 2
    assert set(root.roles["root"].keyids) == {k.public_key.keyid for k in keys}
    assert repo.online_root_signer() is None
    _push(tmp_path, repo, "a/a-1.skill", b"one")
    agent = TrustClient(tmp_path / "agent", HubFetch(repo), repo.root_json())
    assert agent.fetch_target("a/a-1.skill").read_bytes() == b"one"


def test_renewing_the_root_needs_the_threshold_and_devices_follow(
    tmp_path: Path, offline: tuple[TrustRepository, list[CryptoSigner]]
) -> None:
    repo, keys = offline
    agent = TrustClient(tmp_path / "agent", HubFetch(repo), repo.root_json())
    before = repo.metadata("root").signed.expires

    with pytest.raises(TrustError, match="threshold is not met"):
        renew_root(repo, keys[:1])
    with pytest.raises(TrustError, match="threshold is not met"):
        renew_root(repo, [keys[0], keys[0]])  # one key twice is still one key
    assert repo.metadata("root").signed.version == 1  # refused: nothing written

    assert renew_root(repo, keys[1:]) == 2
    assert repo.metadata("root").signed.expires >= before
    _push(tmp_path, repo, "a/a-1.skill", b"one")
    assert agent.fetch_target("a/a-1.skill").read_bytes() == b"one"
    assert agent.trusted_root_version() == 2


def test_a_device_walks_through_a_root_key_rotation(
    tmp_path: Path, offline: tuple[TrustRepository, list[CryptoSigner]]
) -> None:
    repo, old_keys = offline
    agent = TrustClient(tmp_path / "agent", HubFetch(repo), repo.root_json())
    _push(tmp_path, repo, "a/a-1.skill", b"one")
    assert agent.fetch_target("a/a-1.skill").read_bytes() == b"one"

    new_keys = load_signers(generate_root_keys(tmp_path / "offline-2", 2))
    assert rotate_root_keys(repo, old_keys[:2], new_keys, threshold=2) == 2
    _push(tmp_path, repo, "a/a-2.skill", b"two")

    assert agent.fetch_target("a/a-2.skill").read_bytes() == b"two"
    assert agent.trusted_root_version() == 2
    # The retired keys can no longer make a root, even all three together.
    with pytest.raises(TrustError, match="is not a root key"):
        renew_root(repo, old_keys)
    assert renew_root(repo, new_keys) == 3


def test_rotating_the_online_root_away_retires_its_key_file(tmp_path: Path) -> None:
    repo = TrustRepository.init(tmp_path / "hub")
    agent = TrustClient(tmp_path / "agent", HubFetch(repo), repo.root_json())
    online = repo.online_root_signer()
    assert online is not None
    new_keys = load_signers(generate_root_keys(tmp_path / "offline", 3))

    rotate_root_keys(repo, [online], new_keys, threshold=2)

    assert not (tmp_path / "hub" / "keys" / "root.pem").exists()
    assert repo.online_root_signer() is None
    _push(tmp_path, repo, "a/a-1.skill", b"one")
    assert agent.fetch_target("a/a-1.skill").read_bytes() == b"one"
    assert agent.trusted_root_version() == 2


def test_a_rotated_targets_key_is_followed_and_the_old_one_refused(
    tmp_path: Path, offline: tuple[TrustRepository, list[CryptoSigner]]
) -> None:
    repo, keys = offline
    hub = tmp_path / "hub"
    agent = TrustClient(tmp_path / "agent", HubFetch(repo), repo.root_json())
    _push(tmp_path, repo, "a/a-1.skill", b"one")
    agent.fetch_target("a/a-1.skill")
    old_targets_key = (hub / "keys" / "targets.pem").read_bytes()

    rotate_online_key(repo, "targets", keys[:2])
    _push(tmp_path, repo, "a/a-2.skill", b"two")
    assert agent.fetch_target("a/a-2.skill").read_bytes() == b"two"
    assert (hub / "keys" / "targets.pem").read_bytes() != old_targets_key

    # Whoever kept the old targets key signs a new target list: the device refuses it.
    (hub / "keys" / "targets.pem").write_bytes(old_targets_key)
    with pytest.raises(TrustError, match="not a targets key the root trusts"):
        _push(tmp_path, repo, "a/a-3.skill", b"three")


def test_a_root_with_one_signature_duplicated_does_not_reach_the_threshold(
    tmp_path: Path, offline: tuple[TrustRepository, list[CryptoSigner]]
) -> None:
    repo, keys = offline
    agent = TrustClient(tmp_path / "agent", HubFetch(repo), repo.root_json())
    # An attacker holding one root key signs root v2 (giving itself a new targets key)
    # and repeats its signature to fake the 2-of-3 threshold.
    forged: Metadata = repo.metadata("root")  # type: ignore[type-arg]
    forged.signed.version = 2
    forged.signed.add_key(CryptoSigner.generate_ed25519().public_key, "targets")
    forged.sign(keys[0])
    doc = json.loads(forged.to_bytes())
    doc["signatures"] = doc["signatures"] * 2
    data = json.dumps(doc).encode()
    meta = tmp_path / "hub" / "metadata"
    (meta / "2.root.json").write_bytes(data)

    with pytest.raises(TrustError):
        agent.fetch_target("a/a-1.skill")
    assert agent.trusted_root_version() == 1


def test_unknown_roles_and_bad_thresholds_are_refused(
    tmp_path: Path, offline: tuple[TrustRepository, list[CryptoSigner]]
) -> None:
    repo, keys = offline
    with pytest.raises(TrustError, match="has no online key"):
        rotate_online_key(repo, "root", keys)
    with pytest.raises(TrustError, match=r"needs 1\.\.2 new keys"):
        rotate_root_keys(repo, keys, keys[:2], threshold=3)
    with pytest.raises(TrustError, match=r"needs 1\.\.3 root keys"):
        TrustRepository.init(tmp_path / "other", root_signers=keys, root_threshold=4)
    with pytest.raises(TrustError, match="already holds root keys"):
        generate_root_keys(tmp_path / "offline", 1)
