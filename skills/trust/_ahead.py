"""Guessing the files a refresh will ask for next, from answers not yet verified.

An upgrade refreshes the metadata chain and downloads one bundle: next root,
timestamp, snapshot, targets, bundle, each asked for only once the one before
it is verified. Each is a round trip to the hub and, from the client's worker
thread, a hop to the event loop and back. Where the fetches run, a
:class:`Guess` reads each answer as ngclient will read it once verified (the
snapshot version the timestamp names, the targets version the snapshot names,
the bundle's hash and length) and asks for that file in the same batch. The
answers are only handed to ngclient when it asks for those very paths, and it
verifies them as any download; a wrong guess costs a wasted fetch, never trust.

Guessing stops at anything unexpected: a next root (ngclient walks the chain),
the timestamp it already has, a file it would load from disk (the version it
trusts already, a bundle already cached), delegated targets, an answer that is
not what was expected, a file too large to parse on the event loop, or a bundle
over :data:`MAX_GUESSED_TARGET_BYTES` (held before the metadata promising its
length is verified).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skills.trust._fetcher import FetchResult

__all__ = ["MAX_GUESSED_TARGET_BYTES", "Guess", "meta_version", "metadata_path"]

#: Largest bundle fetched on a guess: held before its signed length is known.
MAX_GUESSED_TARGET_BYTES = 1024 * 1024
#: Largest metadata file parsed where the fetches run (the agent's event loop).
_MAX_PARSED_BYTES = 256 * 1024
_HASH = re.compile(r"[0-9a-f]{32,128}")
_GUESS_ERRORS = (ValueError, TypeError, KeyError, AttributeError, RecursionError)


@dataclass
class Guess:
    """What a warm client trusts now, and the bundle it is about to fetch.

    Attributes:
        timestamp: The timestamp bytes the last refresh verified.
        snapshot_version: The version of the snapshot it trusts.
        targets_version: The version of the top-level targets it trusts.
        consistent: Whether the trusted root uses consistent snapshots.
        target: The target the caller will download, or None (a refresh alone).
        cached_target: Where ngclient keeps a verified copy of ``target``.
        cap: The download cap of a metadata path.
        asked: The paths asked for on a guess, in order.
    """

    timestamp: bytes
    snapshot_version: int
    targets_version: int
    consistent: bool
    target: str | None
    cached_target: Path | None
    cap: Callable[[str], int]
    asked: list[str] = field(default_factory=list)
    _stopped: bool = False

    def follow(self, answers: Sequence[FetchResult]) -> list[tuple[str, int]]:
        """The next trip's request after ``answers``, the answers of the last; none ends it."""
        request = None
        if not self._stopped:
            try:
                request = self._next(len(self.asked), answers)  # one guess per trip so far
            except _GUESS_ERRORS:
                request = None
        if request is None:
            self._stopped = True
            return []
        self.asked.append(request[0])
        return [request]

    def _next(self, step: int, answers: Sequence[FetchResult]) -> tuple[str, int] | None:
        if step == 0:  # [root N+1, timestamp]
            if len(answers) != 2 or answers[0] is not None or answers[1] == self.timestamp:
                return None
            meta = _signed(answers[1])["meta"]["snapshot.json"]
            return self._metadata("snapshot", meta_version(meta), self.snapshot_version)
        if step == 1:  # [snapshot]
            meta = _signed(answers[0])["meta"]["targets.json"]
            return self._metadata("targets", meta_version(meta), self.targets_version)
        if step == 2 and self.target is not None:  # [targets]
            return self._bundle(_signed(answers[0]))
        return None

    def _metadata(self, role: str, version: int, trusted: int) -> tuple[str, int] | None:
        """The role's file at ``version``; None when ngclient would keep the trusted one."""
        if version <= trusted:
            return None
        path = metadata_path(role, version, consistent=self.consistent)
        return path, self.cap(path)

    def _bundle(self, targets: dict[str, Any]) -> tuple[str, int] | None:
        if targets.get("delegations") is not None or self.target is None:
            return None
        info = targets["targets"][self.target]
        length, hashes = info["length"], info["hashes"]
        if type(length) is not int or not 0 < length <= MAX_GUESSED_TARGET_BYTES:
            return None
        if self.cached_target is not None and self.cached_target.exists():
            return None  # ngclient checks the cached copy first
        path = self.target
        if self.consistent:
            first = next(iter(hashes.values()), None)
            if not isinstance(first, str) or _HASH.fullmatch(first) is None:
                return None
            folder, slash, base = path.rpartition("/")
            path = f"{folder}{slash}{first}.{base}"
        return f"targets/{path}", length


def metadata_path(role: str, version: int, *, consistent: bool) -> str:
    """The fetch path of ``role``'s metadata at ``version`` (its version's file if consistent)."""
    return f"metadata/{version}.{role}.json" if consistent else f"metadata/{role}.json"


def _signed(answer: FetchResult) -> dict[str, Any]:
    if not isinstance(answer, bytes) or len(answer) > _MAX_PARSED_BYTES:
        raise ValueError("no answer to read")
    signed = json.loads(answer)["signed"]
    if not isinstance(signed, dict):
        raise TypeError("not metadata")
    return signed


def meta_version(meta: dict[str, Any]) -> int:
    """The version a ``meta`` entry names; ValueError when it is not a positive int."""
    version = meta["version"]
    if type(version) is not int or version < 1:
        raise ValueError("not a version")
    return version
