"""The agent's view of a hub for trust tests: reads a TrustRepository on disk.

It records every path asked for, and every trip to the hub (a single fetch, or
one batch of :meth:`HubFetch.many`); ``override`` lets a test serve other bytes
for a path (a replayed, frozen or forged file) as a hostile mirror would, and
``fail`` makes the fetch of a path raise (``FileNotFoundError``, ``FetchError``).
"""

from __future__ import annotations

from collections.abc import Sequence

from skills.errors import FetchError, TrustError
from skills.trust import TrustRepository
from skills.trust.client import FollowFn


class HubFetch:
    """The agent's view of the hub: reads the repository, records every path asked for."""

    def __init__(self, repo: TrustRepository) -> None:
        self.repo = repo
        self.calls: list[str] = []
        self.trips: list[list[str]] = []
        #: Calls from the client's thread (a fetch, or a batch of trips): its hops.
        self.hops = 0
        self.override: dict[str, bytes] = {}
        self.fail: dict[str, Exception] = {}

    def __call__(self, path: str, cap: int) -> bytes:
        self.hops += 1
        self.trips.append([path])
        return self._answer(path, cap)

    def many(
        self, requests: Sequence[tuple[str, int]], follow: FollowFn | None = None
    ) -> list[bytes | FetchError | None]:
        """The batch form: every request in one trip, each answered as a single fetch is.

        With ``follow``, the trips it asks for after each one, recorded as trips too.
        """
        self.hops += 1
        answers: list[bytes | FetchError | None] = []
        while requests:
            trip = self._trip(requests)
            answers += trip
            requests = list(follow(trip)) if follow is not None else []
        return answers

    def _trip(self, requests: Sequence[tuple[str, int]]) -> list[bytes | FetchError | None]:
        self.trips.append([path for path, _ in requests])
        answers: list[bytes | FetchError | None] = []
        for path, cap in requests:
            try:
                answers.append(self._answer(path, cap))
            except FileNotFoundError:
                answers.append(None)
            except FetchError as exc:
                answers.append(exc)
        return answers

    def _answer(self, path: str, cap: int) -> bytes:
        self.calls.append(path)
        if path in self.fail:
            raise self.fail[path]
        if path in self.override:
            return self.override[path]
        try:
            return self.repo.read(path, cap)
        except TrustError as exc:
            raise FetchError(str(exc)) from exc

    def target_calls(self) -> list[str]:
        return [c for c in self.calls if c.startswith("targets/")]
