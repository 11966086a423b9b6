"""``TrustClient`` fetching ahead: a warm client's upgrade in one hop.

Given the batch form, a warm client guesses from the answers not yet verified
what ngclient will ask for next (snapshot, targets, bundle) and fetches it in
the same batch. Each test runs a batched client beside a plain one: the hub is
asked for the same files in the same order, and a hostile answer fetched ahead
fails exactly as it fails when ngclient asks for it itself.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from skills.errors import FetchError, SkillError
from skills.trust import TrustClient, TrustRepository
from skills.trust._ahead import MAX_GUESSED_TARGET_BYTES, Guess
from tests.fakes.hub_fetch import HubFetch
from tests.skills.test_trust import NAME, _add
from tests.skills.test_trust_batch import OTHER, _hub


def _warm(folder: Path, repo: TrustRepository, *, batched: bool) -> tuple[TrustClient, HubFetch]:
    """A client that has fetched NAME once (so it keeps what it verified)."""
    fetch = HubFetch(repo)
    many = fetch.many if batched else None
    client = TrustClient(folder, fetch, repo.root_json(), fetch_many=many)
    assert client.fetch_target(NAME).read_bytes() == b"v1"
    fetch.trips.clear()
    fetch.calls.clear()
    fetch.hops = 0
    return client, fetch


def _pair(tmp_path: Path, repo: TrustRepository) -> list[tuple[TrustClient, HubFetch]]:
    return [
        _warm(tmp_path / "batched", repo, batched=True),
        _warm(tmp_path / "plain", repo, batched=False),
    ]


def _flat(fetch: HubFetch) -> list[str]:
    return [path for trip in fetch.trips for path in trip]


def test_an_upgrade_of_a_warm_client_is_one_hop_for_the_files_ngclient_asks_for(
    tmp_path: Path,
) -> None:
    repo = _hub(tmp_path)
    (batched, ahead), (plain, single) = _pair(tmp_path, repo)
    _add(tmp_path, repo, OTHER, b"v2")
    for client in (batched, plain):
        assert client.fetch_target(OTHER).read_bytes() == b"v2"
    assert _flat(ahead) == _flat(single)  # every guess was what ngclient asked for
    assert [len(trip) for trip in ahead.trips] == [2, 1, 1, 1]
    assert ahead.trips[-1][0].startswith("targets/digits/")
    assert (ahead.hops, single.hops) == (1, 5)


def test_a_refresh_alone_fetches_the_new_metadata_ahead_and_no_bundle(tmp_path: Path) -> None:
    repo = _hub(tmp_path)
    (batched, ahead), (plain, single) = _pair(tmp_path, repo)
    _add(tmp_path, repo, OTHER, b"v2")
    for client in (batched, plain):
        client.refresh()
    assert _flat(ahead) == _flat(single)
    assert not [path for path in _flat(ahead) if path.startswith("targets/")]
    assert (ahead.hops, single.hops) == (1, 4)


def test_a_bundle_already_cached_is_not_fetched_ahead(tmp_path: Path) -> None:
    repo = _hub(tmp_path)
    (batched, ahead), (plain, single) = _pair(tmp_path, repo)
    _add(tmp_path, repo, OTHER, b"v2")  # new metadata; NAME's bundle is cached already
    for client in (batched, plain):
        assert client.fetch_target(NAME).read_bytes() == b"v1"
    assert _flat(ahead) == _flat(single)
    assert ahead.target_calls() == []
    assert ahead.hops == 1


def test_a_bundle_over_the_guess_cap_waits_for_its_signed_length(tmp_path: Path) -> None:
    repo = _hub(tmp_path)
    (batched, ahead), (plain, single) = _pair(tmp_path, repo)
    big = b"b" * (MAX_GUESSED_TARGET_BYTES + 1)
    _add(tmp_path, repo, OTHER, big)
    for client in (batched, plain):
        assert client.fetch_target(OTHER).read_bytes() == big
    assert _flat(ahead) == _flat(single)
    assert [len(trip) for trip in ahead.trips] == [2, 1, 1, 1]
    assert ahead.hops == 2  # the metadata in one batch, the bundle once verified


def _tamper_json(data: bytes) -> bytes:
    md = json.loads(data)
    md["signed"]["expires"] = "2099-01-01T00:00:00Z"  # the signature no longer covers it
    return json.dumps(md).encode()


@pytest.mark.parametrize(
    ("which", "tamper"),
    [
        ("snapshot", _tamper_json),
        ("targets", _tamper_json),
        ("snapshot", lambda _: b"{not json"),
        ("bundle", lambda data: data[:-1] + b"!"),
        ("bundle", lambda data: data + b"extra"),
    ],
    ids=[
        "snapshot-forged",
        "targets-forged",
        "snapshot-garbage",
        "bundle-altered",
        "bundle-longer",
    ],
)
def test_a_hostile_answer_fetched_ahead_fails_as_it_fails_when_asked_for(
    tmp_path: Path, which: str, tamper: Callable[[bytes], bytes]
) -> None:
    repo = _hub(tmp_path)
    probe, probe_fetch = _warm(tmp_path / "probe", repo, batched=False)
    clients = _pair(tmp_path, repo)
    _add(tmp_path, repo, OTHER, b"v2")
    probe.fetch_target(OTHER)  # learns the paths of this upgrade
    paths = {"snapshot": ".snapshot.json", "targets": ".targets.json", "bundle": "targets/"}
    path = next(p for p in probe_fetch.calls if paths[which] in p)
    forged = tamper(repo.read(path, 1 << 24))
    errors: list[str] = []
    for client, fetch in clients:
        fetch.override[path] = forged
        with pytest.raises((SkillError, FetchError)) as caught:
            client.fetch_target(OTHER)
        errors.append(f"{type(caught.value).__name__}: {caught.value}")
    assert errors[0] == errors[1]
    for _, fetch in clients:  # the hub mends the file: both upgrade
        fetch.override.clear()
    for client, _ in clients:
        assert client.fetch_target(OTHER).read_bytes() == b"v2"


def _guess(**kw: Any) -> Guess:
    base: dict[str, Any] = {
        "timestamp": b"old",
        "snapshot_version": 1,
        "targets_version": 1,
        "consistent": True,
        "target": OTHER,
        "cached_target": None,
        "cap": lambda _path: 1 << 20,
    }
    return Guess(**{**base, **kw})


def _signed(signed: Any) -> bytes:
    return json.dumps({"signed": signed, "signatures": []}).encode()


def _meta(role: str, version: Any) -> bytes:
    return _signed({"meta": {f"{role}.json": {"version": version}}})


SHA = "ab" * 32


def _targets(info: Any, **extra: Any) -> bytes:
    return _signed({"targets": {OTHER: info}, **extra})


def test_a_guess_names_the_files_ngclient_names() -> None:
    guess = _guess()
    assert guess.follow([None, _meta("snapshot", 5)]) == [("metadata/5.snapshot.json", 1 << 20)]
    assert guess.follow([_meta("targets", 7)]) == [("metadata/7.targets.json", 1 << 20)]
    bundle = {"length": 10, "hashes": {"sha256": SHA}}
    assert guess.follow([_targets(bundle)]) == [(f"targets/digits/{SHA}.digits-2.0.0.skill", 10)]
    assert guess.follow([b"v2"]) == []
    assert guess.asked == [
        "metadata/5.snapshot.json", "metadata/7.targets.json",
        f"targets/digits/{SHA}.digits-2.0.0.skill",
    ]  # fmt: skip
    plain = _guess(consistent=False)
    assert plain.follow([None, _meta("snapshot", 5)]) == [("metadata/snapshot.json", 1 << 20)]


@pytest.mark.parametrize(
    "answers",
    [
        [b"{root 2}", _meta("snapshot", 5)],  # a new root: ngclient walks the chain
        [None, b"old"],  # the timestamp it has
        [None, FetchError("down")],
        [None, None],
        [None, b"\xff\xfe"],
        [None, b"[]"],
        [None, _signed([1, 2])],
        [None, _signed({"meta": {}})],
        [None, _meta("snapshot", "5")],
        [None, _meta("snapshot", True)],
        [None, _meta("snapshot", 0)],
        [None, _meta("snapshot", 1)],  # the snapshot it trusts: loaded from disk
        [None, b" " * (300 * 1024) + _meta("snapshot", 5)],  # too large to parse on the loop
        [None, b"[" * 100_000],
    ],
)
def test_a_guess_stops_at_anything_unexpected_after_the_pair(answers: list[Any]) -> None:
    guess = _guess()
    assert guess.follow(answers) == []
    assert guess.follow([_meta("targets", 7)]) == []  # stopped for good
    assert guess.asked == []


@pytest.mark.parametrize(
    ("info", "extra", "cached"),
    [
        ({"length": 10, "hashes": {"sha256": "../../etc/passwd"}}, {}, False),
        ({"length": 10, "hashes": {"sha256": SHA.upper()}}, {}, False),
        ({"length": 10, "hashes": {}}, {}, False),
        ({"length": "10", "hashes": {"sha256": SHA}}, {}, False),
        ({"length": 0, "hashes": {"sha256": SHA}}, {}, False),
        ({"length": MAX_GUESSED_TARGET_BYTES + 1, "hashes": {"sha256": SHA}}, {}, False),
        ({"length": 10, "hashes": {"sha256": SHA}}, {"delegations": {"roles": []}}, False),
        ({"length": 10, "hashes": {"sha256": SHA}}, {}, True),
        (None, {}, False),
    ],
    ids=["traversal", "upper-hex", "no-hash", "text-length", "empty", "too-big", "delegated",
         "cached", "not-listed"],
)  # fmt: skip
def test_a_guess_fetches_no_bundle_it_cannot_name_safely(
    tmp_path: Path, info: Any, extra: dict[str, Any], cached: bool
) -> None:
    copy = tmp_path / "cached"
    if cached:
        copy.write_bytes(b"v2")
    guess = _guess(cached_target=copy)
    assert guess.follow([None, _meta("snapshot", 5)])
    assert guess.follow([_meta("targets", 7)])
    listed = _targets(info, **extra) if info is not None else _signed({"targets": {}})
    assert guess.follow([listed]) == []
    assert not [path for path in guess.asked if path.startswith("targets/")]
