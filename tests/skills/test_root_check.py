"""A trusted root is checked before anything relies on it, and a foreign one is named as such.

Roots are made by the project's own ceremony (offline root keys, a threshold),
then damaged the ways a person or an attacker would: signatures stripped, the
root re-signed by a key it does not name, its content changed after signing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from securesystemslib.signer import CryptoSigner
from tuf.api.metadata import Metadata

from skills.errors import TrustError
from skills.trust import TrustClient, TrustRepository
from skills.trust.ceremony import generate_root_keys, load_signers
from skills.trust.root_check import check_root
from tests.fakes.hub_fetch import HubFetch


def _repo(folder: Path, keys: int = 1, threshold: int = 1) -> TrustRepository:
    if keys == 1:
        return TrustRepository.init(folder)
    signers = load_signers(generate_root_keys(folder.parent / f"{folder.name}-keys", keys))
    return TrustRepository.init(folder, root_signers=signers, root_threshold=threshold)


def _root(repo: TrustRepository) -> Metadata[Any]:
    return Metadata.from_bytes(repo.root_json())


def _one_line_error(data: bytes) -> str:
    with pytest.raises(TrustError) as caught:
        check_root(data, "trusted root x.json")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("trusted root x.json ")
    return message


def test_a_root_signed_by_its_threshold_is_accepted(tmp_path: Path) -> None:
    one = check_root(_repo(tmp_path / "one").root_json())
    assert one.signed.version == 1
    two_of_three = check_root(_repo(tmp_path / "two", keys=3, threshold=2).root_json())
    assert two_of_three.signed.roles["root"].threshold == 2
    assert len(two_of_three.signatures) == 3


def test_a_root_below_its_threshold_is_refused(tmp_path: Path) -> None:
    root = _root(_repo(tmp_path / "repo", keys=3, threshold=2))
    for keyid in list(root.signatures)[1:]:
        del root.signatures[keyid]
    message = _one_line_error(root.to_bytes())
    assert "1 valid signature(s)" in message and "threshold of 2" in message


def test_a_root_re_signed_by_a_key_it_does_not_name_is_refused(tmp_path: Path) -> None:
    root = _root(_repo(tmp_path / "repo"))
    root.signatures.clear()
    root.sign(CryptoSigner.generate_ed25519())
    assert "0 valid signature(s)" in _one_line_error(root.to_bytes())


def test_a_root_changed_after_signing_is_refused(tmp_path: Path) -> None:
    root = _root(_repo(tmp_path / "repo"))
    root.signed.version += 1  # the signatures cover version 1
    assert "0 valid signature(s)" in _one_line_error(root.to_bytes())


def test_a_garbled_signature_counts_as_none(tmp_path: Path) -> None:
    doc = json.loads(_repo(tmp_path / "repo").root_json())
    doc["signatures"][0]["sig"] = "not hex at all"
    assert "0 valid signature(s)" in _one_line_error(json.dumps(doc).encode())


@pytest.mark.parametrize(
    "data",
    [b"", b"{not json", b'{"signed": {}, "signatures": []}', b"[1, 2, 3]", b"\xff\xfe\x00"],
    ids=["empty", "corrupt", "not-tuf", "a-list", "binary"],
)
def test_what_is_not_tuf_metadata_is_refused(data: bytes) -> None:
    assert "is not TUF metadata" in _one_line_error(data)


def test_metadata_of_another_role_is_refused(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "repo")
    timestamp = repo.read("metadata/timestamp.json", 1 << 20)
    assert "holds 'timestamp' metadata, not a root" in _one_line_error(timestamp)


def test_a_root_of_another_hub_is_named_at_the_first_refresh(tmp_path: Path) -> None:
    ours, theirs = _repo(tmp_path / "ours"), _repo(tmp_path / "theirs")
    client = TrustClient(tmp_path / "agent", HubFetch(theirs), trusted_root=ours.root_json())
    with pytest.raises(TrustError) as caught:
        client.refresh()
    message = str(caught.value)
    assert message.startswith("signature not trusted: the hub's TUF metadata is not signed by")
    assert "is the trusted root this hub's root.json?" in message
    assert "timestamp was signed by 0/1 keys" in message


def test_a_forged_timestamp_after_first_contact_is_not_blamed_on_the_root(
    tmp_path: Path,
) -> None:
    repo = _repo(tmp_path / "repo")
    fetch = HubFetch(repo)
    client = TrustClient(tmp_path / "agent", fetch, trusted_root=repo.root_json())
    client.refresh()  # this hub's metadata verified once
    forged: Metadata[Any] = Metadata.from_bytes(repo.read("metadata/timestamp.json", 1 << 20))
    forged.signed.version += 1
    forged.signatures.clear()
    forged.sign(CryptoSigner.generate_ed25519())
    fetch.override["metadata/timestamp.json"] = forged.to_bytes()
    with pytest.raises(TrustError, match="signature not trusted") as caught:
        client.refresh()
    assert "this hub's root.json" not in str(caught.value)
