"""The client's network side: the fetch functions it is given, and ngclient's hook onto them.

The client does no networking itself. It is given a plain fetch function that
goes over the agent's hub connection, and optionally a batch form that fetches
several files in one trip; :class:`HubFetcher` adapts them to ngclient's
``FetcherInterface`` under the ``edgeskill:///`` URL scheme. Answers fetched
ahead of ngclient's asking are kept and handed over once, when it asks for
that very path; ngclient verifies them as it verifies any download.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Protocol

from tuf.api import exceptions as tuf_errors
from tuf.ngclient import FetcherInterface

from skills.errors import FetchError

__all__ = [
    "ROOT_SUFFIX",
    "SCHEME",
    "TIMESTAMP",
    "FetchFn",
    "FetchManyFn",
    "FetchResult",
    "FollowFn",
    "Followed",
    "HubFetcher",
    "TrustLimits",
]

FetchFn = Callable[[str, int], bytes]
"""``(path, max_bytes) -> bytes`` for paths like ``metadata/timestamp.json`` or
``targets/...``; raises ``FileNotFoundError`` when the hub has no such file and
:class:`~skills.errors.FetchError` on any other failure."""

FetchResult = bytes | FetchError | None
"""One answer of a :data:`FetchManyFn`: the file, None when the hub has no such file,
or the :class:`~skills.errors.FetchError` a :data:`FetchFn` would have raised."""

FollowFn = Callable[[Sequence[FetchResult]], Sequence[tuple[str, int]]]
"""Given one trip's answers, the requests of the next trip (none: the batch ends).
Called where the fetches run (the agent's event loop): quick, and never raising."""


class Followed(Protocol):
    """A batch's guide: :meth:`follow` after each trip, and the paths it asked for."""

    asked: list[str]

    def follow(self, answers: Sequence[FetchResult]) -> list[tuple[str, int]]:
        """The next trip's requests after ``answers``; none ends the batch."""


class FetchManyFn(Protocol):
    """Fetches several hub files together, in one trip.

    ``fetch_many([(path, max_bytes), ...], follow=None) -> [answer, ...]``: each file
    capped and answered (:data:`FetchResult`) as :data:`FetchFn` would. With
    ``follow``, each trip's answers are given to it and the requests it returns
    make another trip, until it returns none; the answers of every trip come back
    in the order asked. Raises :class:`~skills.errors.FetchError` when none could
    be asked.
    """

    def __call__(
        self, requests: Sequence[tuple[str, int]], follow: FollowFn | None = None
    ) -> Sequence[FetchResult]: ...


SCHEME = "edgeskill:///"
TIMESTAMP = "metadata/timestamp.json"
ROOT_SUFFIX = ".root.json"
_NOT_FOUND = 404
_KIB = 1024
_MIB = 1024 * 1024


@dataclass(frozen=True)
class TrustLimits:
    """Caps on what the client downloads, in bytes.

    Attributes:
        max_root_bytes: One root metadata file.
        max_timestamp_bytes: The timestamp metadata.
        max_snapshot_bytes: One snapshot metadata file.
        max_targets_bytes: One targets metadata file.
        max_target_bytes: One target file (a skill bundle).
    """

    max_root_bytes: int = 512 * _KIB
    max_timestamp_bytes: int = 16 * _KIB
    max_snapshot_bytes: int = 2 * _MIB
    max_targets_bytes: int = 16 * _MIB
    max_target_bytes: int = 512 * _MIB

    def __post_init__(self) -> None:
        """Refuse caps that are not positive whole numbers.

        Raises:
            ValueError: A cap is not a positive int.
        """
        for field in fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{field.name} must be a positive int, got {value!r}")


class HubFetcher(FetcherInterface):
    """ngclient's network hook, backed by the agent's fetch function."""

    def __init__(
        self, fetch: FetchFn, limits: TrustLimits, fetch_many: FetchManyFn | None = None
    ) -> None:
        self._fetch_fn = fetch
        self._fetch_many = fetch_many
        self._limits = limits
        # Lowered to the signed length before a target download, so a hostile
        # hub cannot make us hold more than the metadata promised.
        self.target_cap = limits.max_target_bytes
        # The hub's answers already fetched in this refresh (None: it has no such
        # file; an error: the fetch failed), each handed to ngclient once instead
        # of asked for again.
        self.answered: dict[str, FetchResult] = {}
        self.last_timestamp: bytes | None = None

    def start_call(self) -> None:
        """Forget the previous call's target cap and answers."""
        self.target_cap = self._limits.max_target_bytes
        self.answered.clear()
        self.last_timestamp = None

    def get(self, path: str) -> bytes | None:
        """Fetch ``path`` and remember the answer; None when the hub has no such file.

        Raises:
            DownloadError: Any other failure, as ngclient would see it.
        """
        try:
            data = self.download_bytes(f"{SCHEME}{path}", self.cap(path))
        except tuf_errors.DownloadHTTPError as exc:
            if exc.status_code != _NOT_FOUND:
                raise
            self.answered[path] = None
            return None
        self.answered[path] = data
        return data

    def prefetch(self, paths: Sequence[str], follow: Followed | None = None) -> None:
        """Fetch ``paths`` in one trip, each under its own cap, for ngclient to be handed.

        With ``follow``, the batch goes on to the files it asks for after each trip
        (their paths in ``follow.asked``). Does nothing without a batch fetch
        function. A failure is kept as the answer of each of ``paths``, raised when
        that path is asked for, as a fetch of it alone would have raised it; a
        followed file without an answer is left for ngclient to fetch.
        """
        if self._fetch_many is None:
            return
        requests = [(path, self.cap(path)) for path in paths]
        try:
            if follow is None:
                answers = list(self._fetch_many(requests))
            else:
                answers = list(self._fetch_many(requests, follow.follow))
        except FetchError as exc:
            answers = [exc] * len(paths)
        asked = [*paths, *(follow.asked if follow is not None else ())]
        if len(answers) == len(asked):
            self.answered.update(zip(asked, answers, strict=True))
        elif len(answers) == len(paths):
            self.answered.update(zip(paths, answers, strict=True))
        else:
            failed = FetchError(f"asked for {len(asked)} files, answered {len(answers)}")
            self.answered.update(dict.fromkeys(paths, failed))

    def forget_metadata(self) -> None:
        """Drop the metadata answers not handed out; a bundle fetched ahead is kept."""
        for path in [p for p in self.answered if not p.startswith("targets/")]:
            del self.answered[path]

    def cap(self, path: str) -> int:
        """The download cap of ``path``: its role's, or the target cap."""
        if path.startswith("targets/"):
            return self.target_cap
        role = path.removesuffix(".json").rsplit(".", 1)[-1].rsplit("/", 1)[-1]
        caps = {
            "root": self._limits.max_root_bytes,
            "timestamp": self._limits.max_timestamp_bytes,
            "snapshot": self._limits.max_snapshot_bytes,
        }
        return caps.get(role, self._limits.max_targets_bytes)

    # Deliberately not a generator: errors must surface inside fetch(), which
    # wraps anything that is not a DownloadError.
    def _fetch(self, url: str) -> Iterator[bytes]:
        if not url.startswith(SCHEME):
            raise tuf_errors.DownloadError(f"unexpected URL {url!r}")
        path = url.removeprefix(SCHEME)
        cap = self.cap(path)
        if path in self.answered:
            data = self.answered.pop(path)
            if isinstance(data, FetchError):
                raise data
        else:
            try:
                data = self._fetch_fn(path, cap)
            except FileNotFoundError:
                data = None
        if data is None:
            # ngclient ends the root-rotation walk on a 403/404.
            raise tuf_errors.DownloadHTTPError(f"hub has no {path}", _NOT_FOUND)
        if len(data) > cap:
            raise tuf_errors.DownloadLengthMismatchError(
                f"hub sent {len(data)} bytes for {path}, over the cap of {cap}"
            )
        if path == TIMESTAMP:
            self.last_timestamp = data
        elif path.startswith("metadata/") and path.endswith(ROOT_SUFFIX):
            # A new root: ngclient now walks the chain on before it asks for the
            # timestamp, so one fetched beside this root may predate what the walk
            # ends at; it is asked for again after the walk.
            self.answered.pop(TIMESTAMP, None)
        return iter((data,))
