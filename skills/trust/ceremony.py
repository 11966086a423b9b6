"""The key ceremony: root keys kept offline, threshold signatures, renewal and rotation.

The root role says which keys may sign everything else, so its keys are the
ones to keep off the hub: on separate media, each held by another person,
with a threshold (say 2 of 3) so no single lost or stolen key decides. The
hub keeps only the online keys (targets, snapshot, timestamp) it needs to
publish. A new root is signed by a threshold of the old root's keys *and* of
its own, so a device that trusts version N can walk to N+1 and no further
without the people who hold the keys.

Every function takes the repository's writer lock, checks the signatures with
python-tuf before anything is written, and writes ``<v>.root.json`` before
``root.json``; a refused ceremony changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.serialization import load_pem_private_key
from securesystemslib.signer import CryptoSigner
from tuf.api.exceptions import UnsignedMetadataError
from tuf.api.metadata import Metadata, Root

from skills.errors import TrustError
from skills.trust._files import atomic_write
from skills.trust.repository import ONLINE_ROLES, TrustRepository

__all__ = [
    "generate_root_keys",
    "load_signers",
    "renew_root",
    "rotate_online_key",
    "rotate_root_keys",
]

_MAX_KEY_BYTES = 64 * 1024


def generate_root_keys(folder: Path, count: int) -> list[Path]:
    """Make ``count`` new ed25519 root keys as ``root-<n>.pem`` (mode 0600) in ``folder``.

    Args:
        folder: Where the keys go (created 0700); move them offline afterwards.
        count: How many keys, 1..9.

    Returns:
        The key files.

    Raises:
        TrustError: A bad count, or the folder already holds root keys.
        OSError: The folder cannot be written.
    """
    if not 1 <= count <= 9:
        raise TrustError(f"between 1 and 9 root keys, not {count}")
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    if any(folder.glob("root-*.pem")):
        raise TrustError(f"{folder} already holds root keys; refusing to overwrite them")
    paths = []
    for n in range(1, count + 1):
        path = folder / f"root-{n}.pem"
        atomic_write(path, CryptoSigner.generate_ed25519().private_bytes, mode=0o600)
        paths.append(path)
    return paths


def load_signers(paths: Sequence[Path]) -> list[CryptoSigner]:
    """Load private keys (unencrypted PKCS8 PEM, as :func:`generate_root_keys` writes).

    Raises:
        TrustError: A file is missing, too large or not a usable private key.
    """
    signers = []
    for path in paths:
        try:
            with path.open("rb") as handle:
                data = handle.read(_MAX_KEY_BYTES + 1)
            if len(data) > _MAX_KEY_BYTES:
                raise TrustError(f"{path} is larger than {_MAX_KEY_BYTES} bytes")
            signers.append(CryptoSigner(load_pem_private_key(data, None)))
        except (OSError, ValueError, TypeError) as exc:
            raise TrustError(f"cannot load the key {path}: {exc}") from exc
    return signers


def renew_root(repo: TrustRepository, signers: Sequence[CryptoSigner]) -> int:
    """Publish the same root with a fresh expiry (do it yearly, before it runs out).

    Args:
        repo: The repository.
        signers: At least a threshold of the current root keys.

    Returns:
        The new root version.

    Raises:
        TrustError: The keys do not reach the root's threshold, or the repository is unusable.
        OSError: The repository cannot be written.
    """
    with repo.locked():
        old = repo.metadata("root")
        new: Metadata[Root] = Metadata.from_bytes(old.to_bytes())
        return _publish_root(repo, old, new, signers)


def rotate_root_keys(
    repo: TrustRepository,
    old_signers: Sequence[CryptoSigner],
    new_signers: Sequence[CryptoSigner],
    threshold: int,
) -> int:
    """Replace every root key by ``new_signers`` with a new ``threshold``.

    The new root is signed by the old keys (a threshold of them) and by all
    the new ones, so devices that trust the old root accept it.

    Returns:
        The new root version.

    Raises:
        TrustError: Too few old keys, a threshold that the new keys cannot meet,
            or the repository is unusable.
        OSError: The repository cannot be written.
    """
    if not 1 <= threshold <= len(new_signers):
        raise TrustError(f"a root threshold of {threshold} needs 1..{len(new_signers)} new keys")
    with repo.locked():
        old = repo.metadata("root")
        new: Metadata[Root] = Metadata.from_bytes(old.to_bytes())
        for keyid in list(new.signed.roles["root"].keyids):
            new.signed.revoke_key(keyid, "root")
        for signer in new_signers:
            new.signed.add_key(signer.public_key, "root")
        new.signed.roles["root"].threshold = threshold
        version = _publish_root(repo, old, new, [*old_signers, *new_signers])
        repo.drop_key("root")  # an online root key, if there was one, is retired now
        return version


def rotate_online_key(
    repo: TrustRepository, role: str, root_signers: Sequence[CryptoSigner]
) -> int:
    """Give ``role`` (targets, snapshot or timestamp) a new online key; retire the old one.

    The root that names the new key is published first, then the role's
    metadata is signed again with it (and the chain above it), so clients that
    update their root on the next refresh accept the new signatures.

    Returns:
        The new root version.

    Raises:
        TrustError: An unknown role, root keys below the threshold, or an unusable repository.
        OSError: The repository cannot be written.
    """
    if role not in ONLINE_ROLES:
        raise TrustError(f"{role!r} has no online key; roles: {', '.join(ONLINE_ROLES)}")
    signer = CryptoSigner.generate_ed25519()
    with repo.locked():
        old = repo.metadata("root")
        new: Metadata[Root] = Metadata.from_bytes(old.to_bytes())
        for keyid in list(new.signed.roles[role].keyids):
            new.signed.revoke_key(keyid, role)
        new.signed.add_key(signer.public_key, role)
        version = _publish_root(repo, old, new, root_signers)
        repo.write_key(role, signer)
        repo.republish(role)
    return version


def _publish_root(
    repo: TrustRepository,
    old: Metadata[Any],
    new: Metadata[Root],
    signers: Sequence[CryptoSigner],
) -> int:
    """Bump, sign with every relevant key, verify against old and new root, write."""
    new.signed.version = old.signed.version + 1
    new.signed.expires = repo.expires("root")
    wanted = set(old.signed.roles["root"].keyids) | set(new.signed.roles["root"].keyids)
    new.signatures.clear()
    for signer in {s.public_key.keyid: s for s in signers}.values():
        if signer.public_key.keyid not in wanted:
            raise TrustError(f"key {signer.public_key.keyid[:12]} is not a root key")
        new.sign(signer, append=True)
    try:
        old.signed.verify_delegate("root", new.signed_bytes, new.signatures)
    except UnsignedMetadataError as exc:
        raise TrustError(f"the current root's threshold is not met: {exc}") from exc
    try:
        new.signed.verify_delegate("root", new.signed_bytes, new.signatures)
    except UnsignedMetadataError as exc:
        raise TrustError(f"the new root's threshold is not met: {exc}") from exc
    repo.write_root(new)
    return new.signed.version
