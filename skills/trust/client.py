"""The agent's side of TUF: verify every hub file through ``tuf.ngclient``.

The client does no networking itself. It is given a plain fetch function that
goes over the agent's hub connection; :class:`_HubFetcher` adapts it to
ngclient's ``FetcherInterface`` under the ``edgeskill:///`` URL scheme.

``Updater`` is synchronous and refreshes once per instance, so each
:meth:`TrustClient.fetch_target` builds a new one; call it from a worker thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path

from tuf.api import exceptions as tuf_errors
from tuf.api.metadata import Metadata, Root, TargetFile
from tuf.ngclient import FetcherInterface, Updater, UpdaterConfig

from skills.errors import FetchError, SkillError, TrustError
from skills.trust._files import stage_copy
from skills.trust._names import check_target_name

__all__ = ["FetchFn", "TrustClient", "TrustLimits"]

FetchFn = Callable[[str, int], bytes]
"""``(path, max_bytes) -> bytes`` for paths like ``metadata/timestamp.json`` or
``targets/...``; raises ``FileNotFoundError`` when the hub has no such file and
:class:`~skills.errors.FetchError` on any other failure."""

_SCHEME = "edgeskill:///"
_FOREIGN_ROOT_HINT = (
    "the hub's TUF metadata is not signed by the keys in the trusted root "
    "(is the trusted root this hub's root.json?)"
)
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


class _HubFetcher(FetcherInterface):
    """ngclient's network hook, backed by the agent's fetch function."""

    def __init__(self, fetch: FetchFn, limits: TrustLimits) -> None:
        self._fetch_fn = fetch
        self._limits = limits
        # Lowered to the signed length before a target download, so a hostile
        # hub cannot make us hold more than the metadata promised.
        self.target_cap = limits.max_target_bytes

    def _cap(self, path: str) -> int:
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
        if not url.startswith(_SCHEME):
            raise tuf_errors.DownloadError(f"unexpected URL {url!r}")
        path = url.removeprefix(_SCHEME)
        cap = self._cap(path)
        try:
            data = self._fetch_fn(path, cap)
        except FileNotFoundError as exc:
            # ngclient ends the root-rotation walk on a 403/404.
            raise tuf_errors.DownloadHTTPError(f"hub has no {path}", 404) from exc
        if len(data) > cap:
            raise tuf_errors.DownloadLengthMismatchError(
                f"hub sent {len(data)} bytes for {path}, over the cap of {cap}"
            )
        return iter((data,))


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
    ) -> None:
        """Prepare the state folder.

        Args:
            state_dir: The agent's TUF state folder (made if absent).
            fetch: Fetches a hub file; see :data:`FetchFn`.
            trusted_root: Root metadata to trust on first use; ignored once the
                state folder has a root of its own (which may be newer).
            limits: Download caps; the defaults of :class:`TrustLimits` if None.

        Raises:
            TrustError: Neither the state folder nor ``trusted_root`` has a root,
                or ``trusted_root`` is over the root cap.
            OSError: The state folder cannot be created.
        """
        self._limits = limits if limits is not None else TrustLimits()
        self._metadata_dir = Path(state_dir) / "metadata"
        self._targets_dir = Path(state_dir) / "targets"
        self._verified_dir = Path(state_dir) / "verified"
        self._fetch = fetch
        self._bootstrap = trusted_root
        self._lock = threading.Lock()
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
            fetcher = _HubFetcher(self._fetch, self._limits)
            try:
                return self._fetch_verified(name, fetcher)
            except (tuf_errors.RepositoryError, tuf_errors.DownloadError) as exc:
                raise _translate(name, exc, first_contact=self._first_contact()) from exc

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
            fetcher = _HubFetcher(self._fetch, self._limits)
            try:
                self._updater(fetcher).refresh()
            except (tuf_errors.RepositoryError, tuf_errors.DownloadError) as exc:
                raise _translate("metadata", exc, first_contact=self._first_contact()) from exc

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

    def _fetch_verified(self, name: str, fetcher: _HubFetcher) -> Path:
        updater = self._updater(fetcher)
        updater.refresh()
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
            fetcher.target_cap = info.length
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

    def _updater(self, fetcher: _HubFetcher) -> Updater:
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
            f"{_SCHEME}metadata/",
            str(self._targets_dir),
            f"{_SCHEME}targets/",
            fetcher,
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
