"""The hub's TUF repository: one folder of keys, signed metadata and targets.

Only the python-tuf metadata API is used here; serving the files is the hub's
job (:meth:`TrustRepository.open_file` / :meth:`TrustRepository.read`).

Layout of ``root_dir``::

    keys/{root,targets,snapshot,timestamp}.pem   ed25519, PKCS8 PEM, 0600 (folder 0700)
    metadata/1.root.json root.json <v>.targets.json targets.json
             <v>.snapshot.json snapshot.json timestamp.json
    targets/<dirs>/<sha256>.<basename>           consistent-snapshot target files
    expiry.json                                  metadata lifetimes in days
    .lock                                        serialises writers across processes
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.serialization import load_pem_private_key
from securesystemslib.signer import CryptoSigner
from tuf.api.exceptions import RepositoryError
from tuf.api.metadata import Metadata, MetaFile, Root, Snapshot, TargetFile, Targets, Timestamp

from skills.errors import TrustError
from skills.trust._files import atomic_write, clean_leftovers, exclusive_lock, stage_copy
from skills.trust._names import check_target_name, served_path
from skills.trust._served import ServedFiles, ServedFolder

__all__ = [
    "DEFAULT_EXPIRY_DAYS",
    "MAX_TARGET_BYTES",
    "ONLINE_ROLES",
    "TargetRef",
    "TrustRepository",
]

ONLINE_ROLES = ("targets", "snapshot", "timestamp")
DEFAULT_EXPIRY_DAYS = {"root": 365, "targets": 90, "snapshot": 7, "timestamp": 1}
MAX_TARGET_BYTES = 512 * 1024 * 1024
_MAX_EXPIRY_DAYS = 3650
_MAX_METADATA_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class TargetRef:
    """One signed target as the repository serves it.

    Attributes:
        name: The TUF target name, such as ``digits/digits-1.0.0.skill``.
        length: Size in bytes.
        sha256: Hex SHA-256 of the content.
        path: Where the hub serves it, such as ``targets/digits/<sha256>.digits-1.0.0.skill``.
    """

    name: str
    length: int
    sha256: str
    path: str


class TrustRepository(ServedFiles):
    """A TUF repository in one folder, safe to share between hub processes.

    Create one with :meth:`init` or :meth:`open`; every method re-reads the
    metadata from disk, so several processes can use the same folder.
    """

    def __init__(self, root_dir: Path, expiry_days: dict[str, int]) -> None:
        """Bind to ``root_dir``; use :meth:`init` or :meth:`open` instead.

        Args:
            root_dir: The repository folder.
            expiry_days: Metadata lifetime in days per role.
        """
        self._dir = Path(root_dir)
        self._served = ServedFolder(self._dir)
        self._meta = self._dir / "metadata"
        self._keys = self._dir / "keys"
        self._expiry = dict(expiry_days)
        #: Called with the name of each step of a publication as it completes; the
        #: crash tests use it to stop a publishing process at a known step.
        self.on_step: Callable[[str], None] = _no_step

    @classmethod
    def init(
        cls,
        root_dir: Path,
        *,
        expiry_days: dict[str, int] | None = None,
        root_signers: list[CryptoSigner] | None = None,
        root_threshold: int = 1,
    ) -> TrustRepository:
        """Create keys and version-1 metadata for a new repository.

        Args:
            root_dir: The folder to create the repository in (made if absent).
            expiry_days: Lifetimes in days overriding :data:`DEFAULT_EXPIRY_DAYS`.
            root_signers: Root keys kept outside the repository (offline); without
                them a root key is made and kept online in ``keys/root.pem``.
            root_threshold: How many root keys must sign a new root.

        Returns:
            The new repository.

        Raises:
            TrustError: ``root_dir`` already holds a repository, an expiry is invalid,
                or the threshold does not fit the root keys.
            OSError: The folder cannot be written.
        """
        expiry = _check_expiry(expiry_days)
        count = len(root_signers) if root_signers else 1
        if not 1 <= root_threshold <= count:
            raise TrustError(f"a root threshold of {root_threshold} needs 1..{count} root keys")
        Path(root_dir).mkdir(parents=True, exist_ok=True)
        repo = cls(root_dir, expiry)
        with exclusive_lock(repo._dir / ".lock"):
            if (repo._meta / "root.json").exists() or (repo._meta / "1.root.json").exists():
                raise TrustError(f"{repo._meta} already has a root; refusing to re-initialise")
            repo._meta.mkdir(exist_ok=True)
            (repo._dir / "targets").mkdir(exist_ok=True)
            roles = ONLINE_ROLES if root_signers else ("root", *ONLINE_ROLES)
            signers = repo._create_keys(roles)
            atomic_write(repo._dir / "expiry.json", json.dumps(expiry).encode())
            repo._write_initial_metadata(signers, root_signers or [signers["root"]], root_threshold)
        return repo

    @classmethod
    def open(cls, root_dir: Path) -> TrustRepository:
        """Open an existing repository.

        Args:
            root_dir: The folder :meth:`init` created.

        Returns:
            The repository.

        Raises:
            TrustError: There is no repository there, or its settings are unreadable.
        """
        root_dir = Path(root_dir)
        if not (root_dir / "metadata" / "root.json").is_file():
            raise TrustError(f"no TUF repository at {root_dir}")
        try:
            saved = json.loads((root_dir / "expiry.json").read_text())
        except FileNotFoundError:
            saved = {}
        except (OSError, ValueError) as exc:
            raise TrustError(f"unreadable {root_dir / 'expiry.json'}: {exc}") from exc
        return cls(root_dir, _check_expiry(saved if isinstance(saved, dict) else None))

    def add_target(self, name: str, source: Path) -> TargetRef:
        """Sign ``source`` into the repository as target ``name``.

        Publishes new targets, snapshot and timestamp versions. Targets are
        immutable: re-adding a name with the same content publishes nothing new,
        but completes a publication that a killed process left half done.

        Args:
            name: The target name (relative, ``[A-Za-z0-9._/-]``, at most 200 characters).
            source: The file to publish (at most :data:`MAX_TARGET_BYTES`).

        Returns:
            The published target.

        Raises:
            TrustError: Bad name, the name exists with other content, the source is
                too large, or the repository's keys or metadata are unusable.
            OSError: ``source`` cannot be read or the repository cannot be written.
        """
        check_target_name(name)
        staged, sha256, length = stage_copy(Path(source), self._dir, MAX_TARGET_BYTES)
        try:
            self.on_step("staged")
            with exclusive_lock(self._dir / ".lock"):
                self._repair()
                targets = self._load("targets")
                ref = TargetRef(name, length, sha256, served_path(name, sha256))
                known = targets.signed.targets.get(name)
                if known is not None and known.hashes.get("sha256") != sha256:
                    raise TrustError(f"target {name!r} exists with other content; it is immutable")
                final = self._dir / ref.path
                final.parent.mkdir(parents=True, exist_ok=True)
                staged.replace(final)
                self.on_step("target")
                if known is None:
                    targets.signed.targets[name] = TargetFile(length, {"sha256": sha256}, name)
                    self._publish(targets, bump_snapshot=True)
                return ref
        finally:
            staged.unlink(missing_ok=True)

    def repair(self) -> list[str]:
        """Finish what a killed publisher left: complete the metadata chain, drop leftovers.

        Returns:
            What was done, one line per fix (empty when the repository was whole).

        Raises:
            TrustError: The repository's keys or metadata are unusable.
            OSError: The repository cannot be written.
        """
        with exclusive_lock(self._dir / ".lock"):
            return self._repair()

    def refresh_timestamp(self) -> None:
        """Publish a new timestamp; also renew snapshot or targets past half their life.

        Raises:
            TrustError: The repository's keys or metadata are unusable.
            OSError: The repository cannot be written.
        """
        with exclusive_lock(self._dir / ".lock"):
            self._repair()
            targets = self._load("targets")
            renew_targets = self._past_half_life(targets.signed)
            renew_snapshot = self._past_half_life(self._load("snapshot").signed)
            self._publish(targets if renew_targets else None, bump_snapshot=renew_snapshot)

    def root_json(self) -> bytes:
        """Return the current trusted root metadata, for bootstrapping agents.

        Raises:
            TrustError: The root is missing or too large.
        """
        try:
            return self.read("metadata/root.json", _MAX_METADATA_BYTES)
        except FileNotFoundError as exc:
            raise TrustError(f"no root metadata in {self._meta}") from exc

    def targets(self) -> list[TargetRef]:
        """List the signed targets, sorted by name.

        Raises:
            TrustError: The targets metadata is unusable.
        """
        listed = self._load("targets").signed.targets
        return [
            TargetRef(name, tf.length, tf.hashes["sha256"], served_path(name, tf.hashes["sha256"]))
            for name, tf in sorted(listed.items())
        ]

    # --- for the key ceremony (skills.trust.ceremony) ---------------------------------

    def locked(self) -> contextlib.AbstractContextManager[None]:
        """The repository's writer lock, held across processes."""
        return exclusive_lock(self._dir / ".lock")

    def metadata(self, role: str) -> Metadata[Any]:
        """The current metadata of ``role``, as published.

        Raises:
            TrustError: It is missing, too large or invalid.
        """
        return self._load(role)

    def expires(self, role: str) -> datetime:
        """When metadata of ``role`` signed now would expire."""
        return self._expires(role)

    def republish(self, role: str) -> None:
        """Sign ``role`` again with its current key, and the chain above it (lock held).

        Raises:
            TrustError: The keys or metadata are unusable.
            OSError: The repository cannot be written.
        """
        if role == "targets":
            self._publish(self._load("targets"), bump_snapshot=True)
        else:
            self._publish(None, bump_snapshot=role == "snapshot")

    def online_root_signer(self) -> CryptoSigner | None:
        """The root key kept in the repository, when the root is not offline.

        Raises:
            TrustError: The key file exists but is unusable or not trusted by the root.
        """
        if not (self._keys / "root.pem").exists():
            return None
        return self._signer("root")

    # --- writing -------------------------------------------------------------------

    def _repair(self) -> list[str]:
        """Roll a half-written publication forward (caller holds the lock).

        A publication writes targets, then snapshot, then timestamp. Killed in
        between, ``targets.json`` is newer than what the snapshot lists (or the
        snapshot newer than what the timestamp lists); clients keep seeing the
        old, consistent state, and re-signing the rest of the chain completes it.
        """
        done = [f"removed leftover {p}" for p in clean_leftovers(self._dir, self._meta)]
        targets = self._load("targets")
        snapshot = self._load("snapshot")
        listed = snapshot.signed.meta.get("targets.json")
        if listed is None or listed.version != targets.signed.version:
            self._publish_chain(snapshot, targets)
            done.append(f"completed the publication of targets v{targets.signed.version}")
        elif self._load("timestamp").signed.snapshot_meta.version != snapshot.signed.version:
            self._publish(None, bump_snapshot=True)
            done.append(f"completed the publication of snapshot v{snapshot.signed.version}")
        return done

    def _publish_chain(self, snapshot: Metadata[Any], targets: Metadata[Any]) -> None:
        """List the targets already on disk in a new snapshot and timestamp."""
        snapshot.signed.meta["targets.json"] = MetaFile.from_data(
            targets.signed.version, self._read_meta("targets"), ["sha256"]
        )
        timestamp = self._load("timestamp")
        snapshot_bytes = self._renew(snapshot)
        timestamp.signed.snapshot_meta = MetaFile.from_data(
            snapshot.signed.version, snapshot_bytes, ["sha256"]
        )
        self._renew(timestamp)

    def _publish(self, targets: Metadata[Any] | None, *, bump_snapshot: bool) -> None:
        """Sign and write the chain targets -> snapshot -> timestamp (caller holds the lock).

        Versioned files go first and timestamp.json last, so a reader never
        sees a timestamp pointing at a snapshot that is not on disk yet.
        """
        snapshot = self._load("snapshot")
        timestamp = self._load("timestamp")
        if targets is not None:
            targets_bytes = self._renew(targets)
            snapshot.signed.meta["targets.json"] = MetaFile.from_data(
                targets.signed.version, targets_bytes, ["sha256"]
            )
            bump_snapshot = True
        if bump_snapshot:
            snapshot_bytes = self._renew(snapshot)
            timestamp.signed.snapshot_meta = MetaFile.from_data(
                snapshot.signed.version, snapshot_bytes, ["sha256"]
            )
        self._renew(timestamp)

    def _renew(self, md: Metadata[Any]) -> bytes:
        role = md.signed.type
        md.signed.version += 1
        md.signed.expires = self._expires(role)
        return self._sign_and_write(md, self._signer(role))

    def _sign_and_write(self, md: Metadata[Any], signer: CryptoSigner) -> bytes:
        role = md.signed.type
        md.sign(signer)
        data = md.to_bytes()
        if role != "timestamp":
            atomic_write(self._meta / f"{md.signed.version}.{role}.json", data)
            self.on_step(f"{md.signed.version}.{role}.json")
        atomic_write(self._meta / f"{role}.json", data)
        self.on_step(f"{role}.json")
        return data

    def _create_keys(self, roles: tuple[str, ...]) -> dict[str, CryptoSigner]:
        self._keys.mkdir(mode=0o700, exist_ok=True)
        self._keys.chmod(0o700)
        signers = {}
        for role in roles:
            signer = CryptoSigner.generate_ed25519()
            self.write_key(role, signer)
            signers[role] = signer
        return signers

    def write_key(self, role: str, signer: CryptoSigner) -> None:
        """Keep ``signer`` as the online key of ``role`` (``keys/<role>.pem``, mode 0600).

        Raises:
            OSError: The key folder cannot be written.
        """
        atomic_write(self._keys / f"{role}.pem", signer.private_bytes, mode=0o600)

    def drop_key(self, role: str) -> None:
        """Delete the online key file of ``role`` (after it was retired from the root).

        Raises:
            OSError: The key folder cannot be written.
        """
        (self._keys / f"{role}.pem").unlink(missing_ok=True)

    def write_root(self, root: Metadata[Root]) -> None:
        """Publish signed root metadata as ``<version>.root.json`` and ``root.json``.

        The caller checked the signatures (see :mod:`skills.trust.ceremony`).

        Raises:
            OSError: The metadata folder cannot be written.
        """
        data = root.to_bytes()
        atomic_write(self._meta / f"{root.signed.version}.root.json", data)
        atomic_write(self._meta / "root.json", data)

    def _write_initial_metadata(
        self, signers: dict[str, CryptoSigner], root_signers: list[CryptoSigner], threshold: int
    ) -> None:
        root = Root(expires=self._expires("root"), consistent_snapshot=True)
        for role in ONLINE_ROLES:
            root.add_key(signers[role].public_key, role)
        for signer in root_signers:
            root.add_key(signer.public_key, "root")
        root.roles["root"].threshold = threshold
        targets = self._sign_and_write(
            Metadata(Targets(expires=self._expires("targets"))), signers["targets"]
        )
        snapshot = self._sign_and_write(
            Metadata(
                Snapshot(
                    expires=self._expires("snapshot"),
                    meta={"targets.json": MetaFile.from_data(1, targets, ["sha256"])},
                )
            ),
            signers["snapshot"],
        )
        self._sign_and_write(
            Metadata(
                Timestamp(
                    expires=self._expires("timestamp"),
                    snapshot_meta=MetaFile.from_data(1, snapshot, ["sha256"]),
                )
            ),
            signers["timestamp"],
        )
        # root.json last: its presence is what marks the repository as complete.
        root_md = Metadata(root)
        for signer in root_signers:
            root_md.sign(signer, append=True)
        self.write_root(root_md)

    # --- reading -------------------------------------------------------------------

    def _read_meta(self, role: str) -> bytes:
        path = self._meta / f"{role}.json"
        try:
            with path.open("rb") as handle:
                data = handle.read(_MAX_METADATA_BYTES + 1)
        except FileNotFoundError as exc:
            raise TrustError(f"repository has no {path.name}") from exc
        if len(data) > _MAX_METADATA_BYTES:
            raise TrustError(f"{path.name} is larger than {_MAX_METADATA_BYTES} bytes")
        return data

    def _load(self, role: str) -> Metadata[Any]:
        path = self._meta / f"{role}.json"
        data = self._read_meta(role)
        try:
            md: Metadata[Any] = Metadata.from_bytes(data)
        except RepositoryError as exc:
            raise TrustError(f"repository {path.name} is invalid: {exc}") from exc
        if md.signed.type != role:
            raise TrustError(f"{path.name} holds {md.signed.type!r} metadata")
        return md

    def _signer(self, role: str) -> CryptoSigner:
        path = self._keys / f"{role}.pem"
        try:
            private_key = load_pem_private_key(path.read_bytes(), None)
            signer = CryptoSigner(private_key)
        except (OSError, ValueError, TypeError) as exc:
            raise TrustError(f"cannot load the {role} key from {path}: {exc}") from exc
        root: Root = self._load("root").signed
        if signer.public_key.keyid not in root.roles[role].keyids:
            raise TrustError(f"{path} is not a {role} key the root trusts")
        return signer

    def _expires(self, role: str) -> datetime:
        return datetime.now(UTC) + timedelta(days=self._expiry[role])

    def _past_half_life(self, signed: Targets | Snapshot) -> bool:
        left = signed.expires - datetime.now(UTC)
        return left < timedelta(days=self._expiry[signed.type]) / 2


def _no_step(_step: str) -> None:
    """The default :attr:`TrustRepository.on_step`: nothing."""


def _check_expiry(expiry_days: dict[str, int] | None) -> dict[str, int]:
    merged = dict(DEFAULT_EXPIRY_DAYS)
    for role, days in (expiry_days or {}).items():
        if role not in DEFAULT_EXPIRY_DAYS:
            raise TrustError(f"unknown role {role!r} in expiry_days")
        if not isinstance(days, int) or isinstance(days, bool):
            raise TrustError(f"expiry for {role} must be whole days, got {days!r}")
        if not 1 <= days <= _MAX_EXPIRY_DAYS:
            raise TrustError(f"expiry for {role} must be 1..{_MAX_EXPIRY_DAYS} days")
        merged[role] = days
    return merged
