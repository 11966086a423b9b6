"""``TrustClient`` with a batch fetch: the next root and the timestamp in one trip.

Each refresh asks the hub for root N+1 and the timestamp together. The hub is
asked for the same files in the same order as without the batch form, in fewer
trips, and a hub that answers the pair badly meets the errors it met before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from skills.errors import FetchError, TrustError
from skills.trust import TrustClient, TrustLimits, TrustRepository
from skills.trust.ceremony import rotate_online_key
from skills.trust.client import FetchResult, FollowFn
from tests.fakes.hub_fetch import HubFetch
from tests.skills.test_trust import NAME, _add

OTHER = "digits/digits-2.0.0.skill"
ROOT_2 = "metadata/2.root.json"
ROOT_3 = "metadata/3.root.json"
TIMESTAMP = "metadata/timestamp.json"


def _hub(tmp_path: Path) -> TrustRepository:
    repo = TrustRepository.init(tmp_path / "hub")
    _add(tmp_path, repo, NAME, b"v1")
    return repo


def _batched(folder: Path, repo: TrustRepository, **kw: Any) -> tuple[TrustClient, HubFetch]:
    fetch = HubFetch(repo)
    return TrustClient(folder, fetch, repo.root_json(), fetch_many=fetch.many, **kw), fetch


def _plain(folder: Path, repo: TrustRepository, **kw: Any) -> tuple[TrustClient, HubFetch]:
    fetch = HubFetch(repo)
    return TrustClient(folder, fetch, repo.root_json(), **kw), fetch


def _flat(trips: list[list[str]]) -> list[str]:
    return [path for trip in trips for path in trip]


def test_an_upgrade_asks_for_the_same_files_in_one_trip_fewer(tmp_path: Path) -> None:
    repo = _hub(tmp_path)
    batched, batched_fetch = _batched(tmp_path / "batched", repo)
    plain, plain_fetch = _plain(tmp_path / "plain", repo)
    for client, fetch in ((batched, batched_fetch), (plain, plain_fetch)):
        assert client.fetch_target(NAME).read_bytes() == b"v1"  # the first refresh
        fetch.trips.clear()

    _add(tmp_path, repo, OTHER, b"v2")  # a new version: new timestamp, snapshot, targets
    for client in (batched, plain):
        assert client.fetch_target(OTHER).read_bytes() == b"v2"

    assert batched_fetch.trips[0] == [ROOT_2, TIMESTAMP]
    assert all(len(trip) == 1 for trip in batched_fetch.trips[1:])
    assert all(len(trip) == 1 for trip in plain_fetch.trips)
    assert _flat(batched_fetch.trips) == _flat(plain_fetch.trips)
    assert (len(batched_fetch.trips), len(plain_fetch.trips)) == (4, 5)


def test_the_first_refresh_asks_for_the_pair_in_one_trip(tmp_path: Path) -> None:
    repo = _hub(tmp_path)
    client, fetch = _batched(tmp_path / "agent", repo)
    client.refresh()
    assert fetch.trips[0] == [ROOT_2, TIMESTAMP]
    assert len(fetch.trips) == 3  # the pair, the snapshot, the targets


def test_a_refresh_with_nothing_new_is_one_trip(tmp_path: Path) -> None:
    repo = _hub(tmp_path)
    client, fetch = _batched(tmp_path / "agent", repo)
    client.fetch_target(NAME)
    fetch.trips.clear()

    client.refresh()
    assert client.fetch_target(NAME).read_bytes() == b"v1"
    assert fetch.trips == [[ROOT_2, TIMESTAMP]] * 2


def test_a_restarted_client_asks_for_the_root_after_the_one_on_disk(tmp_path: Path) -> None:
    repo = _hub(tmp_path)
    _batched(tmp_path / "agent", repo)[0].refresh()
    online = repo.online_root_signer()
    assert online is not None
    assert rotate_online_key(repo, "timestamp", [online]) == 2
    _batched(tmp_path / "agent", repo)[0].refresh()  # now trusts root 2

    fetch = HubFetch(repo)
    restarted = TrustClient(tmp_path / "agent", fetch, fetch_many=fetch.many)
    assert restarted.fetch_target(NAME).read_bytes() == b"v1"
    assert fetch.trips[0] == [ROOT_3, TIMESTAMP]


@pytest.mark.parametrize("warm", [True, False])
def test_a_root_rotation_is_walked_and_the_timestamp_asked_for_after_it(
    tmp_path: Path, warm: bool
) -> None:
    repo = _hub(tmp_path)
    fetch = HubFetch(repo)

    def many_then_fresh(
        requests: Sequence[tuple[str, int]], follow: FollowFn | None = None
    ) -> list[FetchResult]:
        answers = fetch.many(requests, follow)
        fetch.override.clear()  # the hub serves what it has now from here on
        return answers

    client = TrustClient(tmp_path / "agent", fetch, repo.root_json(), fetch_many=many_then_fresh)
    if warm:
        client.fetch_target(NAME)
        fetch.trips.clear()
    stale = repo.read(TIMESTAMP, 1 << 14)
    online = repo.online_root_signer()
    assert online is not None
    # Root v2 retires the timestamp key. The batch answers with the timestamp the
    # hub served just before it rotated, signed by the retired key; ngclient must
    # be handed the one the hub serves after the walk.
    assert rotate_online_key(repo, "timestamp", [online]) == 2
    fetch.override[TIMESTAMP] = stale

    assert client.fetch_target(NAME).read_bytes() == b"v1"
    assert client.trusted_root_version() == 2
    assert fetch.trips[:3] == [[ROOT_2, TIMESTAMP], [ROOT_3], [TIMESTAMP]]

    fetch.trips.clear()
    client.refresh()
    assert fetch.trips == [[ROOT_3, TIMESTAMP]]


def _oversize(fetch: HubFetch) -> None:
    fetch.override[TIMESTAMP] = b" " * 4097


def _garbage(fetch: HubFetch) -> None:
    fetch.override[TIMESTAMP] = b"{not json"


def _timestamp_missing(fetch: HubFetch) -> None:
    fetch.fail[TIMESTAMP] = FileNotFoundError(TIMESTAMP)


def _timestamp_fails(fetch: HubFetch) -> None:
    fetch.fail[TIMESTAMP] = FetchError("the link broke")


def _root_fails(fetch: HubFetch) -> None:
    fetch.fail[ROOT_2] = FetchError("the link broke")


def _root_oversize(fetch: HubFetch) -> None:
    fetch.override[ROOT_2] = b" " * 8193


FAULTS: dict[str, tuple[Callable[[HubFetch], None], type[Exception], str]] = {
    "oversize timestamp": (_oversize, TrustError, "oversize file"),
    "garbage timestamp": (_garbage, TrustError, "invalid metadata"),
    "no timestamp": (_timestamp_missing, TrustError, "hub is missing a file"),
    "timestamp fetch fails": (_timestamp_fails, FetchError, "the link broke"),
    "root fetch fails": (_root_fails, FetchError, "the link broke"),
    "oversize root": (_root_oversize, TrustError, "oversize file"),
}


def _error(call: Callable[[], object]) -> Exception:
    with pytest.raises((TrustError, FetchError)) as caught:
        call()
    return caught.value


@pytest.mark.parametrize("warm", [True, False])
@pytest.mark.parametrize("fault", FAULTS)
def test_a_bad_answer_in_the_pair_is_the_error_it_was_without_the_batch(
    tmp_path: Path, fault: str, warm: bool
) -> None:
    repo = _hub(tmp_path)
    limits = TrustLimits(max_timestamp_bytes=4096, max_root_bytes=8192)
    break_it, kind, said = FAULTS[fault]
    errors = []
    for make, folder in ((_batched, "batched"), (_plain, "plain")):
        client, fetch = make(tmp_path / folder, repo, limits=limits)
        if warm:
            client.fetch_target(NAME)
        fetch.trips.clear()
        break_it(fetch)
        errors.append(_error(partial(client.fetch_target, NAME)))
        assert len(fetch.trips[0]) == (2 if folder == "batched" else 1)

        fetch.override.clear()
        fetch.fail.clear()
        assert client.fetch_target(NAME).read_bytes() == b"v1"  # and recovers
    batched_error, plain_error = errors
    assert isinstance(batched_error, kind)
    assert said in str(batched_error)
    assert (type(batched_error), str(batched_error)) == (type(plain_error), str(plain_error))


@pytest.mark.parametrize("warm", [True, False])
def test_a_batch_that_cannot_be_asked_is_the_fetch_error_it_was(tmp_path: Path, warm: bool) -> None:
    repo = _hub(tmp_path)
    fetch = HubFetch(repo)
    down = [False]

    def single(path: str, cap: int) -> bytes:
        if down[0]:
            raise FetchError("not connected to the hub")
        return fetch(path, cap)

    def many(
        requests: Sequence[tuple[str, int]], follow: FollowFn | None = None
    ) -> list[FetchResult]:
        if down[0]:
            raise FetchError("not connected to the hub")
        return fetch.many(requests, follow)

    batched = TrustClient(tmp_path / "batched", single, repo.root_json(), fetch_many=many)
    plain = TrustClient(tmp_path / "plain", single, repo.root_json())
    errors = []
    for client in (batched, plain):
        if warm:
            client.fetch_target(NAME)
        down[0] = True
        errors.append(_error(partial(client.fetch_target, NAME)))
        down[0] = False
    assert isinstance(errors[0], FetchError)
    assert "not connected to the hub" in str(errors[0])
    assert str(errors[0]) == str(errors[1])


def test_a_batch_answering_the_wrong_number_of_files_is_a_fetch_error(tmp_path: Path) -> None:
    repo = _hub(tmp_path)
    fetch = HubFetch(repo)

    def short(
        requests: Sequence[tuple[str, int]], follow: FollowFn | None = None
    ) -> list[FetchResult]:
        return fetch.many(requests, follow)[:1]

    client = TrustClient(tmp_path / "agent", fetch, repo.root_json(), fetch_many=short)
    with pytest.raises(FetchError, match="asked for 2 files, answered 1"):
        client.refresh()


def test_each_file_of_the_pair_is_asked_for_under_its_own_cap(tmp_path: Path) -> None:
    repo = _hub(tmp_path)
    fetch = HubFetch(repo)
    asked: list[tuple[str, int]] = []

    def many(
        requests: Sequence[tuple[str, int]], follow: FollowFn | None = None
    ) -> list[FetchResult]:
        asked.extend(requests)
        return fetch.many(requests, follow)

    limits = TrustLimits(max_timestamp_bytes=4096, max_root_bytes=8192)
    TrustClient(tmp_path / "agent", fetch, repo.root_json(), limits, fetch_many=many).refresh()
    assert asked == [(ROOT_2, 8192), (TIMESTAMP, 4096)]
