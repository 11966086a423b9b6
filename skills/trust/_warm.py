"""What the last refresh verified, kept so a refresh that finds nothing new costs little.

ngclient's ``Updater`` refreshes once per instance, and each refresh starts by
parsing and verifying every local metadata file again. :class:`Verified` keeps
the updater of the last refresh that succeeded, with the timestamp bytes the hub
served it and a mark of the files it left on disk. The client may skip a new
updater's refresh only when ngclient's would load exactly what is kept and
change nothing: the files on disk are the ones it left, no newer root exists
(locally or on the hub), the hub serves byte for byte the same timestamp, and
every role is still final at the current time (:meth:`Verified.final_at`).
Anything else, the client runs ngclient's full refresh; :class:`VerifiedLoads`
spares that refresh parsing and verifying again the local files the last one
verified (the root it starts from excepted), while every other check is made.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from securesystemslib.signer import Signature
from tuf.api.metadata import Root, Signed, Snapshot, Targets, Timestamp
from tuf.ngclient import Updater

__all__ = ["DiskMark", "Verified", "VerifiedLoads", "disk_mark"]

_Role = TypeVar("_Role", bound=Signed)
_Loaded = tuple[Any, bytes, dict[str, Signature]]
_LoadKey = tuple[str, str | None, bytes]

_FILES = ("root.json", "timestamp.json", "snapshot.json", "targets.json")

DiskMark = tuple[tuple[int, int, int, int, int], ...]
"""Identity of the top-level metadata files ngclient reads at the start of a refresh."""


def disk_mark(metadata_dir: Path) -> DiskMark | None:
    """Mark the files a refresh would load (``root.json`` through its link); None if one is missing.

    ngclient replaces a file it writes (a new inode), so an unchanged mark means
    the very files left by the last refresh.

    Raises:
        OSError: A file cannot be examined for another reason than being absent.
    """
    marks = []
    for name in _FILES:
        try:
            st = (metadata_dir / name).stat()
        except FileNotFoundError:
            return None
        marks.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(marks)


@dataclass(frozen=True)
class Verified:
    """The trusted top-level metadata of a refresh that succeeded, and its updater.

    Attributes:
        updater: The updater that refreshed; its target look-ups and downloads
            rely on nothing but this metadata.
        timestamp_bytes: The timestamp the hub served that refresh, verified by it.
        disk: :func:`disk_mark` right after that refresh.
        root: The trusted root.
        timestamp: The trusted timestamp (the local one when the hub's had the same version).
        snapshot: The trusted snapshot.
        targets: The trusted top-level targets.
    """

    updater: Updater
    timestamp_bytes: bytes
    disk: DiskMark
    root: Root
    timestamp: Timestamp
    snapshot: Snapshot
    targets: Targets
    loads: VerifiedLoads

    @classmethod
    def capture(
        cls, updater: Updater, timestamp_bytes: bytes, disk: DiskMark, loads: VerifiedLoads
    ) -> Verified | None:
        """Keep what ``updater`` verified in the refresh it just completed (with ``loads``).

        Returns:
            None when the targets delegate: delegated roles are loaded at look-up
            time, against the updater's own clock, so each refresh needs a new updater.
        """
        # python-tuf has no public accessor for the verified top-level roles; the
        # updater's TrustedMetadataSet holds them (tuf is pinned in pyproject).
        trusted = updater._trusted_set
        if trusted.targets.delegations is not None:
            return None
        return cls(
            updater,
            timestamp_bytes,
            disk,
            trusted.root,
            trusted.timestamp,
            trusted.snapshot,
            trusted.targets,
            loads,
        )

    @property
    def next_root_version(self) -> int:
        """The root version each refresh must look for (TUF client workflow, 5.3)."""
        return self.root.version + 1

    def final_at(self, now: datetime) -> bool:
        """Whether ngclient, refreshing at ``now`` from the same files and timestamp, keeps all.

        These are the checks ``TrustedMetadataSet`` makes on every refresh, also
        when nothing changed: root, timestamp, snapshot and targets unexpired,
        and the snapshot the one the timestamp names. The signatures, hashes and
        versions checked when these were verified depend only on bytes the
        caller has seen unchanged.
        """
        roles = (self.root, self.timestamp, self.snapshot, self.targets)
        if any(role.is_expired(now) for role in roles):
            return False
        return self.snapshot.version == self.timestamp.snapshot_meta.version


@dataclass
class VerifiedLoads:
    """Remembers ngclient's parse-and-verify results of one refresh, for the next one.

    ``TrustedMetadataSet`` turns bytes into a role through ``_load_data(role, data,
    delegator, role_name)``: a parse, a type check and the delegator's signature
    check, a pure function of its arguments. :meth:`install` wraps it in a new
    updater so that bytes the previous refresh loaded, under an equal delegator
    (same keys, roles and thresholds), give the previous result without being
    parsed and verified again. Whatever it raised is never remembered, and the
    set's own checks around it (versions, rollback, expiry at its own clock,
    hashes against snapshot and timestamp) all run as usual.

    Attributes:
        previous: The results of the last refresh that succeeded.
        seen: The results of this refresh, for the next.
    """

    previous: dict[_LoadKey, tuple[Signed | None, _Loaded]] = field(default_factory=dict)
    seen: dict[_LoadKey, tuple[Signed | None, _Loaded]] = field(default_factory=dict)

    def install(self, updater: Updater) -> None:
        """Route ``updater``'s loads of new metadata through this memo."""
        # Internal to python-tuf 7.0.1 (pinned in pyproject): the updater builds
        # its TrustedMetadataSet itself and offers no hook for this step.
        trusted = updater._trusted_set
        load = trusted._load_data

        def load_once(
            role: type[_Role],
            data: bytes,
            delegator: Root | Targets | None = None,
            role_name: str | None = None,
        ) -> tuple[_Role, bytes, dict[str, Signature]]:
            key = (role.type, role_name, data)
            hit = self.previous.get(key)
            if hit is not None and delegator is not None and hit[0] == delegator:
                result = hit[1]
            else:
                result = load(role, data, delegator, role_name)
            self.seen[key] = (delegator, result)
            return result  # type: ignore[no-any-return]

        trusted._load_data = load_once

    def next(self) -> VerifiedLoads:
        """The memo for the refresh after this one."""
        return VerifiedLoads(previous=self.seen)
