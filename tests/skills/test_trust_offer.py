"""The hub's metadata sent beside a desired state: an upgrade asks only for its bundle.

The offer is read from the real repository (:func:`read_offer`) and handed to a
:class:`TrustClient` as the agent hands it on. ngclient verifies every offered file
as a download, so an offer that is stale, forged, or from before a root rotation
changes how many trips a download makes, never what is trusted.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import skills.trust.client as client_module
from skills.trust import TrustClient, TrustRepository
from skills.trust.ceremony import rotate_online_key
from skills.trust.offer import MetadataOffer, from_message, offer_message, read_offer
from tests.fakes.hub_fetch import HubFetch
from tests.skills.test_trust import NAME, _add
from tests.skills.test_trust_batch import OTHER, TIMESTAMP, _hub


def _client(folder: Path, repo: TrustRepository) -> tuple[TrustClient, HubFetch]:
    fetch = HubFetch(repo)
    return TrustClient(folder, fetch, repo.root_json(), fetch_many=fetch.many), fetch


def _offer(repo: TrustRepository) -> MetadataOffer:
    offer = read_offer(repo.read)
    assert offer is not None
    return offer


def _trusts_the_hubs_timestamp(client_dir: Path, repo: TrustRepository) -> bool:
    """Whether the timestamp the client verified and kept is the hub's current one."""
    kept = json.loads((client_dir / "metadata" / "timestamp.json").read_bytes())["signed"]
    return bool(kept["version"] == repo.metadata("timestamp").signed.version)


def test_the_offer_is_the_newest_root_and_the_chain_the_timestamp_names(tmp_path: Path) -> None:
    repo = _hub(tmp_path)
    offer = _offer(repo)
    assert offer.root_version == 1
    assert sorted(offer.files) == ["metadata/2.snapshot.json", "metadata/2.targets.json", TIMESTAMP]
    for path, data in offer.files.items():
        assert data == repo.read(path, 1 << 20)
    # What travels beside a desired state comes back as it went.
    assert from_message(offer_message(offer)) == offer


def test_an_upgrade_with_the_offer_asks_the_hub_only_for_its_bundle(tmp_path: Path) -> None:
    repo = _hub(tmp_path)
    client, fetch = _client(tmp_path / "agent", repo)
    assert client.fetch_target(NAME).read_bytes() == b"v1"  # no offer: the whole chain
    assert len(fetch.trips) == 4
    fetch.trips.clear()

    _add(tmp_path, repo, OTHER, b"v2")
    client.offer(_offer(repo))
    assert client.fetch_target(OTHER).read_bytes() == b"v2"
    assert len(fetch.trips) == 1 and fetch.trips[0][0].startswith("targets/")
    # What ngclient verified and kept is the hub's chain, as after a fetch.
    assert _trusts_the_hubs_timestamp(tmp_path / "agent", repo)


def test_a_first_download_with_the_offer_is_one_trip(tmp_path: Path) -> None:
    repo = _hub(tmp_path)
    client, fetch = _client(tmp_path / "agent", repo)
    client.offer(_offer(repo))
    assert client.fetch_target(NAME).read_bytes() == b"v1"
    assert fetch.trips == [fetch.target_calls()]


def test_an_offer_is_used_once(tmp_path: Path) -> None:
    repo = _hub(tmp_path)
    client, fetch = _client(tmp_path / "agent", repo)
    client.offer(_offer(repo))
    client.fetch_target(NAME)
    fetch.trips.clear()
    _add(tmp_path, repo, OTHER, b"v2")
    assert client.fetch_target(OTHER).read_bytes() == b"v2"
    assert fetch.trips[0] == ["metadata/2.root.json", TIMESTAMP]  # asked, as without one


def test_a_stale_offer_falls_back_to_asking_the_hub(tmp_path: Path) -> None:
    repo = _hub(tmp_path)
    stale = _offer(repo)  # read before two more versions were published
    _add(tmp_path, repo, OTHER, b"v2")
    client, fetch = _client(tmp_path / "agent", repo)
    client.fetch_target(OTHER)  # the device already trusts a newer timestamp
    _add(tmp_path, repo, "digits/digits-3.0.0.skill", b"v3")
    fetch.trips.clear()

    client.offer(stale)  # a retained desired state, read long after it was sent
    assert client.fetch_target("digits/digits-3.0.0.skill").read_bytes() == b"v3"
    assert ["metadata/2.root.json", TIMESTAMP] in fetch.trips
    assert _trusts_the_hubs_timestamp(tmp_path / "agent", repo)


def test_a_forged_offer_is_refused_and_the_hubs_files_are_trusted(tmp_path: Path) -> None:
    repo = _hub(tmp_path)
    client, fetch = _client(tmp_path / "agent", repo)
    client.fetch_target(NAME)
    _add(tmp_path, repo, OTHER, b"v2")
    offer = _offer(repo)
    targets_path = next(p for p in offer.files if p.endswith(".targets.json"))
    forged = json.loads(offer.files[targets_path])
    forged["signed"]["targets"][OTHER]["length"] += (
        1  # breaks the snapshot's hash, and the signature
    )
    files = {**offer.files, targets_path: json.dumps(forged).encode()}
    fetch.trips.clear()

    client.offer(MetadataOffer(offer.root_version, files))
    assert client.fetch_target(OTHER).read_bytes() == b"v2"
    assert targets_path in fetch.calls  # asked again, from the hub
    kept = (tmp_path / "agent" / "metadata" / "targets.json").read_bytes()
    assert kept == repo.read(targets_path, 1 << 20)


@pytest.mark.parametrize("offer_after_rotation", [True, False])
def test_a_root_rotation_is_never_missed_with_an_offer(
    tmp_path: Path, offer_after_rotation: bool
) -> None:
    repo = _hub(tmp_path)
    client, fetch = _client(tmp_path / "agent", repo)
    client.fetch_target(NAME)
    before = _offer(repo)
    online = repo.online_root_signer()
    assert online is not None
    assert rotate_online_key(repo, "timestamp", [online]) == 2
    _add(tmp_path, repo, OTHER, b"v2")
    fetch.trips.clear()

    # Read after the rotation, the offer names root 2, so root 2 is asked for; read
    # before it, it claims root 1 is the newest (the timestamp it carries is signed
    # by the retired key): refused, and the hub is asked.
    client.offer(_offer(repo) if offer_after_rotation else before)
    assert client.fetch_target(OTHER).read_bytes() == b"v2"
    assert "metadata/2.root.json" in fetch.calls
    assert client.trusted_root_version() == 2


def test_an_offer_not_used_in_time_is_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = _hub(tmp_path)
    client, fetch = _client(tmp_path / "agent", repo)
    monkeypatch.setattr(client_module, "OFFER_TTL_S", -1.0)
    client.offer(_offer(repo))
    client.fetch_target(NAME)
    assert len(fetch.trips) == 4  # the whole chain, asked for


def test_no_offer_past_its_cap_or_from_a_broken_repository(tmp_path: Path) -> None:
    repo = _hub(tmp_path)
    size = sum(len(d) for d in _offer(repo).files.values())
    assert read_offer(repo.read, max_bytes=size - 1) is None
    assert read_offer(repo.read, max_bytes=size) is not None
    (tmp_path / "hub" / "metadata" / "timestamp.json").write_text("{}")
    assert read_offer(repo.read) is None
