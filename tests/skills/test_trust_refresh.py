"""``TrustClient.refresh``: a device notices a frozen or replaying hub without a deployment."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from securesystemslib.signer import CryptoSigner
from tuf.api.metadata import Metadata

from skills.errors import TrustError
from skills.trust import TrustClient, TrustRepository
from tests.fakes.hub_fetch import HubFetch
from tests.support import wait_until


def _client(tmp_path: Path, repo: TrustRepository, override: dict[str, bytes]) -> TrustClient:
    fetch = HubFetch(repo)
    fetch.override = override
    return TrustClient(tmp_path / "agent", fetch, repo.root_json())


def _expired_timestamp(hub: Path) -> bytes:
    md: Metadata[Any] = Metadata.from_bytes((hub / "metadata" / "timestamp.json").read_bytes())
    md.signed.version += 1
    md.signed.expires = datetime.now(UTC) - timedelta(minutes=1)
    key = load_pem_private_key((hub / "keys" / "timestamp.pem").read_bytes(), None)
    md.sign(CryptoSigner(key))
    return md.to_bytes()


def test_refresh_notices_a_frozen_hub_and_recovers_when_it_resumes(tmp_path: Path) -> None:
    repo = TrustRepository.init(tmp_path / "hub")
    override: dict[str, bytes] = {}
    agent = _client(tmp_path, repo, override)
    agent.refresh()  # a healthy hub: nothing to say

    override["metadata/timestamp.json"] = _expired_timestamp(tmp_path / "hub")
    with pytest.raises(TrustError, match="metadata expired"):
        agent.refresh()

    override.clear()
    repo.refresh_timestamp()
    agent.refresh()


def test_refresh_notices_replayed_older_metadata(tmp_path: Path) -> None:
    repo = TrustRepository.init(tmp_path / "hub")
    override: dict[str, bytes] = {}
    agent = _client(tmp_path, repo, override)
    old = repo.read("metadata/timestamp.json", 1 << 14)
    repo.refresh_timestamp()
    agent.refresh()

    override["metadata/timestamp.json"] = old
    with pytest.raises(TrustError, match="rollback attack"):
        agent.refresh()


def _aged(agent: TrustClient, seconds: float) -> float:
    """Wait until the chain's last verification is ``seconds`` old; its age then."""
    wait_until(lambda: (agent.verified_age_s() or 0.0) >= seconds, 10, f"an age of {seconds} s")
    age = agent.verified_age_s()
    assert age is not None
    return age


def test_the_chains_age_counts_from_its_last_verification_by_a_refresh_or_a_download(
    tmp_path: Path,
) -> None:
    repo = TrustRepository.init(tmp_path / "hub")
    bundle = tmp_path / "digits-1.0.0.skill"
    bundle.write_bytes(b"a bundle")
    repo.add_target("digits/digits-1.0.0.skill", bundle)
    override: dict[str, bytes] = {}
    agent = _client(tmp_path, repo, override)
    assert agent.verified_age_s() is None  # nothing verified yet: a refresh is due

    agent.refresh()
    old = _aged(agent, 0.5)
    agent.refresh()  # nothing new at the hub: verified again all the same
    assert (agent.verified_age_s() or old) < old

    # A download verifies the chain too (here a new timestamp, snapshot and targets).
    old = _aged(agent, 0.5)
    repo.refresh_timestamp()
    agent.fetch_target("digits/digits-1.0.0.skill")
    assert (agent.verified_age_s() or old) < old

    # A refresh that fails verifies nothing: the age goes on from the last good one.
    old = _aged(agent, 0.5)
    override["metadata/timestamp.json"] = _expired_timestamp(tmp_path / "hub")
    with pytest.raises(TrustError, match="metadata expired"):
        agent.refresh()
    assert (agent.verified_age_s() or 0.0) >= old
