"""The agent's side of TUF: verify every hub file through ``tuf.ngclient``.

The client does no networking itself: it is given fetch functions that go over
the agent's hub connection (:mod:`skills.trust._fetcher`). Given also a batch form
(:class:`FetchManyFn`), a refresh asks in one trip for the two files ngclient asks
for first, the next root and the timestamp, and, when the timestamp is new, goes
on in the same batch to the files ngclient will ask for next, guessed from the
answers not yet verified (:mod:`skills.trust._ahead`): the snapshot, the targets
and the bundle. ngclient is handed each answer when it asks for that very file,
and verifies everything in its own order, as it verifies any download.

``Updater`` is synchronous and refreshes once per instance. The client keeps
the updater of its last refresh, and with it the verified metadata
(:mod:`skills.trust._warm`): a refresh that finds the root, the hub's timestamp
and the files on disk unchanged, and nothing expired, reuses it instead of
parsing and verifying every local file again; any other refresh builds a new
updater. Call it from a worker thread.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from urllib import parse

from tuf.api import exceptions as tuf_errors
from tuf.api.metadata import Metadata, Root, TargetFile
from tuf.ngclient import Updater, UpdaterConfig

from skills.errors import FetchError, SkillError, TrustError
from skills.trust._ahead import Guess
from skills.trust._fetcher import (
    ROOT_SUFFIX,
    SCHEME,
    TIMESTAMP,
    FetchFn,
    FetchManyFn,
    FetchResult,
    FollowFn,
    HubFetcher,
    TrustLimits,
)
from skills.trust._files import stage_copy
from skills.trust._names import check_target_name
from skills.trust._warm import Verified, VerifiedLoads, disk_mark
from skills.trust.offer import MetadataOffer

__all__ = ["FetchFn", "FetchManyFn", "FetchResult", "FollowFn", "TrustClient", "TrustLimits"]

#: An offer not used within this long is dropped: the hub has newer files by then.
OFFER_TTL_S = 120.0

_FOREIGN_ROOT_HINT = (
    "the hub's TUF metadata is not signed by the keys in the trusted root "
    "(is the trusted root this hub's root.json?)"
)


class TrustClient:
    """Fetches targets from the hub, verified against TUF metadata.

    ``state_dir/metadata`` holds the trusted metadata, ``state_dir/targets``
    the verified downloads. Calls are serialised: ngclient does not support two
    updaters on one metadata folder at a time.
    """

    def __init__(
        self,
        state_dir: Path,
        fetch: FetchFn,
        trusted_root: bytes | None = None,
        limits: TrustLimits | None = None,
        *,
        fetch_many: FetchManyFn | None = None,
    ) -> None:
        """Prepare the state folder.

        Args:
            state_dir: The agent's TUF state folder (made if absent).
            fetch: Fetches a hub file; see :data:`FetchFn`.
            trusted_root: Root metadata to trust on first use; ignored once the
                state folder has a root of its own (which may be newer).
            limits: Download caps; the defaults of :class:`TrustLimits` if None.
            fetch_many: Fetches several hub files in one trip (see :data:`FetchManyFn`);
                without it every file is a trip of its own.

        Raises:
            TrustError: Neither the state folder nor ``trusted_root`` has a root,
                or ``trusted_root`` is over the root cap.
            OSError: The state folder cannot be created.
        """
        self._limits = limits if limits is not None else TrustLimits()
        self._metadata_dir = Path(state_dir) / "metadata"
        self._targets_dir = Path(state_dir) / "targets"
        self._verified_dir = Path(state_dir) / "verified"
        self._fetcher = HubFetcher(fetch, self._limits, fetch_many)
        self._bootstrap = trusted_root
        self._lock = threading.Lock()
        self._verified: Verified | None = None
        #: When (monotonic s) a refresh, with or without a download, last verified the chain.
        self._verified_at: float | None = None
        #: The hub's last offer (see :meth:`offer`) and when it came.
        self._offered: tuple[MetadataOffer, float] | None = None
        #: The root version of the offer the running download was handed.
        self._offer_root: int | None = None
        if trusted_root is not None and len(trusted_root) > self._limits.max_root_bytes:
            raise TrustError(f"trusted root is over the cap of {self._limits.max_root_bytes} bytes")
        if trusted_root is None and not self._root_path.exists():
            raise TrustError(f"no trusted root: none given and none in {self._metadata_dir}")
        self._metadata_dir.mkdir(parents=True, exist_ok=True)
        self._targets_dir.mkdir(parents=True, exist_ok=True)
        self._verified_dir.mkdir(mode=0o700, exist_ok=True)

    @property
    def _root_path(self) -> Path:
        return self._metadata_dir / "root.json"

    def fetch_target(self, name: str) -> Path:
        """Refresh the metadata and return a verified local copy of target ``name``.

        A cached copy is used when its length and hashes still match the
        signed metadata; otherwise the target is downloaded and verified.

        Args:
            name: The target name, such as ``digits/digits-1.0.0.skill``.

        Returns:
            A private copy of the verified file under ``state_dir/verified``, hashed
            again as it was copied; install from it (it is replaced by the next fetch
            of the same target).

        Raises:
            TrustError: Verification failed (rollback, freeze, untrusted signature,
                hash or length mismatch, oversize or invalid metadata), the hub lacks
                a file the metadata lists, the target is unknown, or the verified file
                changed before it could be copied.
            FetchError: The fetch function failed (transport or hub trouble).
            OSError: The local state folder cannot be read or written.
        """
        check_target_name(name)
        with self._lock:
            offered, self._offered = self._offered, None
            if offered is not None and time.monotonic() - offered[1] <= OFFER_TTL_S:
                try:
                    return self._fetch_verified(name, offered[0])
                except (tuf_errors.RepositoryError, tuf_errors.DownloadError, TrustError):
                    pass  # a stale or bad offer: the hub is asked, as without one
                finally:
                    self._fetcher.answered.clear()
            try:
                return self._fetch_verified(name)
            except (tuf_errors.RepositoryError, tuf_errors.DownloadError) as exc:
                raise _translate(name, exc, first_contact=self._first_contact()) from exc
            finally:
                self._fetcher.answered.clear()

    def offer(self, offer: MetadataOffer) -> None:
        """Keep the metadata the hub sent with a desired state, for the next download.

        :meth:`fetch_target` hands its files to ngclient when it asks for those paths
        (verified as any download), and takes the hub's newest root version as the
        hub's answer to "root N+1" when it trusts root N already. Each file over its
        role's cap is left out. The offer is used once, within :data:`OFFER_TTL_S`;
        a download that fails with it is made again, asking the hub. Safe to call
        from any thread.
        """
        files = {
            path: data
            for path, data in offer.files.items()
            if path.startswith("metadata/") and len(data) <= self._fetcher.cap(path)
        }
        self._offered = (MetadataOffer(offer.root_version, files), time.monotonic())

    def refresh(self) -> None:
        """Refresh the metadata chain without fetching a target.

        Run periodically, this is how a device notices a hub that froze or
        replayed its metadata (an expired timestamp, an older version) even
        while nothing new is deployed.

        Raises:
            TrustError: Verification failed (expired, rollback, bad signature, invalid).
            FetchError: The fetch function failed (transport or hub trouble).
            OSError: The local state folder cannot be read or written.
        """
        with self._lock:
            try:
                self._refresh()
            except (tuf_errors.RepositoryError, tuf_errors.DownloadError) as exc:
                raise _translate("metadata", exc, first_contact=self._first_contact()) from exc

    def verified_age_s(self) -> float | None:
        """Seconds since a refresh last verified the hub's metadata chain (None: never).

        A download verifies the chain as the periodic :meth:`refresh` does, so an
        agent that just installed a bundle need not refresh again for a while.
        """
        at = self._verified_at
        return None if at is None else time.monotonic() - at

    def _first_contact(self) -> bool:
        """True until the hub's timestamp has verified once against the trusted root."""
        return not (self._metadata_dir / "timestamp.json").exists()

    def trusted_root_version(self) -> int:
        """Return the version of the root this client currently trusts.

        Raises:
            TrustError: The trusted root is unreadable.
        """
        with self._lock:
            try:
                data = self._root_path.read_bytes()
            except FileNotFoundError:
                data = self._bootstrap or b""
            except OSError as exc:
                raise TrustError(f"cannot read the trusted root: {exc}") from exc
        try:
            root: Metadata[Root] = Metadata.from_bytes(data)
        except tuf_errors.RepositoryError as exc:
            raise TrustError(f"trusted root is invalid: {exc}") from exc
        if root.signed.type != Root.type:
            raise TrustError(f"trusted root holds {root.signed.type!r} metadata")
        return root.signed.version

    def _refresh(self, target: str | None = None, offer: MetadataOffer | None = None) -> Updater:
        """Refresh the metadata; return an updater holding what is now trusted.

        What was kept is dropped first and kept again only by a refresh that
        succeeds, so after any failure the next refresh is ngclient's own, from disk.
        ``target``, the bundle about to be fetched, may be fetched ahead with the
        metadata; it stays in the fetcher's answers for the download. The files of
        ``offer`` are ngclient's answers for their paths.
        """
        kept, self._verified = self._verified, None
        self._fetcher.start_call()
        self._offer_root = None
        if offer is not None:
            self._fetcher.answered.update(offer.files)
            self._offer_root = offer.root_version
        try:
            if kept is not None and self._unchanged(kept, target):
                self._verified, self._verified_at = kept, time.monotonic()
                return kept.updater
            loads = kept.loads.next() if kept is not None else VerifiedLoads()
            updater = self._updater()
            # The updater parsed the root it starts from; python-tuf 7.0.1 (pinned in
            # pyproject) keeps it in its TrustedMetadataSet, so no second parse.
            self._ask_ahead(updater._trusted_set.root.version)
            loads.install(updater)
            updater.refresh()
            self._verified_at = time.monotonic()
            disk = disk_mark(self._metadata_dir)
            timestamp = self._fetcher.last_timestamp
            if disk is not None and timestamp is not None:
                self._verified = Verified.capture(updater, timestamp, disk, loads)
            return updater
        finally:
            self._fetcher.forget_metadata()

    def _unchanged(self, kept: Verified, target: str | None) -> bool:
        """Whether ngclient's refresh now would keep ``kept`` as it is, writing nothing.

        It asks the hub for the next root and the timestamp, as ngclient's would,
        and, when the timestamp is new, what the full refresh will ask for after it
        (see :class:`~skills.trust._ahead.Guess`); the answers are kept for the full
        refresh when the result is False.

        Raises:
            DownloadError: The hub could not be asked (ngclient would fail the same way).
            OSError: The state folder cannot be examined.
        """
        if (
            not kept.final_at(datetime.now(UTC))
            or disk_mark(self._metadata_dir) != kept.disk
            or not self._ask_ahead(kept.root.version, self._guess(kept, target))
        ):
            return False
        # The spec's client workflow looks for root N+1 on every refresh (5.3), so
        # a rotation, or a revoked key, is never missed while nothing else changed.
        if self._fetcher.get(f"metadata/{kept.next_root_version}{ROOT_SUFFIX}") is not None:
            return False
        return self._fetcher.get(TIMESTAMP) == kept.timestamp_bytes

    def _ask_ahead(self, root_version: int, guess: Guess | None = None) -> bool:
        """Ask the hub in one trip for the files a refresh from root ``root_version`` asks first.

        Those are root N+1 and, when the hub has none, the timestamp. Neither
        answer is verified against the other, so asking for both at once changes
        when the bytes arrive, not what ngclient verifies or in what order.
        Nothing is asked when this call has asked the hub already (its answers
        are ngclient's), or without a batch fetch. With ``guess``, the batch goes on
        to the files it guesses ngclient will ask for next.

        Returns:
            False, asking nothing, when ``root_history`` holds root N+1: ngclient
            takes that one from disk and asks the hub for N+2 instead.
        """
        next_root = f"{root_version + 1}{ROOT_SUFFIX}"
        if (self._metadata_dir / "root_history" / next_root).exists():
            return False
        if self._offer_root == root_version:  # the hub's newest root is the one trusted
            self._fetcher.answered[f"metadata/{next_root}"] = None
        self._offer_root = None
        if not self._fetcher.answered:
            self._fetcher.prefetch((f"metadata/{next_root}", TIMESTAMP), guess)
        return True

    def _guess(self, kept: Verified, target: str | None) -> Guess:
        """A guide for fetching ahead from what ``kept`` trusts, towards ``target``."""
        cached = None if target is None else self._targets_dir / parse.quote(target, "")
        return Guess(
            timestamp=kept.timestamp_bytes,
            snapshot_version=kept.snapshot.version,
            targets_version=kept.targets.version,
            consistent=bool(kept.root.consistent_snapshot),
            target=target,
            cached_target=cached,  # where ngclient keeps it (its _generate_target_file_path)
            cap=self._fetcher.cap,
        )

    def _fetch_verified(self, name: str, offer: MetadataOffer | None = None) -> Path:
        updater = self._refresh(name, offer)
        info: TargetFile | None = updater.get_targetinfo(name)
        if info is None:
            raise TrustError(f"unknown target {name!r}: not in the signed targets metadata")
        if info.length > self._limits.max_target_bytes:
            raise TrustError(
                f"target {name!r} is {info.length} bytes, over the cap of "
                f"{self._limits.max_target_bytes}"
            )
        cached = updater.find_cached_target(info)
        if cached is None:
            self._fetcher.target_cap = info.length
            cached = updater.download_target(info)
        return self._private_copy(name, Path(cached), info)

    def _private_copy(self, name: str, cached: Path, info: TargetFile) -> Path:
        """Copy a verified target into a private file, hashing the copy, and check it again.

        The caller installs from the copy, so the bytes it unpacks are the bytes
        checked here: a file swapped after ngclient verified it (as in RAUC's
        CVE-2020-25860) is refused instead of installed.
        """
        for old in self._verified_dir.glob(f"{_copy_prefix(name)}*"):
            old.unlink(missing_ok=True)  # the previous copy of this target
        staged, sha256, length = stage_copy(cached, self._verified_dir, info.length)
        if length != info.length or sha256 != info.hashes.get("sha256"):
            staged.unlink(missing_ok=True)
            raise TrustError(f"target {name!r} changed after it was verified; refusing it")
        final = self._verified_dir / f"{_copy_prefix(name)}{sha256[:16]}"
        staged.replace(final)
        return final

    def _updater(self) -> Updater:
        # Once the state folder has a root it is the anchor: it may be newer
        # than the bootstrap root after a rotation.
        bootstrap = None if self._root_path.exists() else self._bootstrap
        config = UpdaterConfig(
            root_max_length=self._limits.max_root_bytes,
            timestamp_max_length=self._limits.max_timestamp_bytes,
            snapshot_max_length=self._limits.max_snapshot_bytes,
            targets_max_length=self._limits.max_targets_bytes,
        )
        return Updater(
            str(self._metadata_dir),
            f"{SCHEME}metadata/",
            str(self._targets_dir),
            f"{SCHEME}targets/",
            self._fetcher,
            config,
            bootstrap=bootstrap,
        )


def _copy_prefix(name: str) -> str:
    return name.replace("/", "__") + "."


def _translate(name: str, exc: Exception, *, first_contact: bool = False) -> SkillError:
    """Turn a python-tuf error into ours, saying what went wrong.

    On ``first_contact`` (nothing from this hub has verified yet) a signature
    that does not verify most often means a trusted root of another hub, so the
    message says so.
    """
    if isinstance(exc, tuf_errors.DownloadError) and isinstance(exc.__cause__, FetchError):
        return FetchError(f"fetching {name!r}: {exc.__cause__}")
    kinds: list[tuple[type[Exception], str]] = [
        (tuf_errors.BadVersionNumberError, "rollback attack"),
        (tuf_errors.ExpiredMetadataError, "metadata expired (freeze attack or stale hub)"),
        (tuf_errors.UnsignedMetadataError, "signature not trusted"),
        (tuf_errors.LengthOrHashMismatchError, "hash mismatch (tampered or corrupt file)"),
        (tuf_errors.DownloadLengthMismatchError, "oversize file"),
        (tuf_errors.DownloadHTTPError, "hub is missing a file"),
        (tuf_errors.RepositoryError, "invalid metadata"),
        (tuf_errors.DownloadError, "download failed"),
    ]
    what = next(label for kind, label in kinds if isinstance(exc, kind))
    if first_contact and isinstance(exc, tuf_errors.UnsignedMetadataError):
        what = f"{what}: {_FOREIGN_ROOT_HINT}"
    return TrustError(f"{what}: {exc} (fetching {name!r})")
