"""Checking a trusted root before anything relies on it.

A device is given the hub's ``root.json`` once, as the anchor of every later
verification; the hub is given one when its root keys are kept offline. A file
that is not TUF metadata, holds another role, or is not signed by the threshold
of its own root keys can never verify anything, so it is refused at once with a
reason, instead of at the first install. Pure: bytes in, a root or an error out.
"""

from __future__ import annotations

from typing import Any

from securesystemslib.exceptions import UnverifiedSignatureError
from tuf.api.metadata import Metadata, Root
from tuf.api.serialization import DeserializationError

from skills.errors import TrustError

__all__ = ["check_root"]

#: Longest piece of a parser's message quoted in an error, so errors stay one line.
_MAX_DETAIL_CHARS = 160


def check_root(data: bytes, what: str = "trusted root") -> Metadata[Root]:
    """Parse ``data`` as TUF root metadata signed by the threshold of its own root keys.

    Expiry is not checked: a device may start from an old root and walk the
    hub's newer ones, as TUF allows.

    Args:
        data: The content of a ``root.json``.
        what: How errors name the file (``trusted root /etc/edgeskill/root.json``).

    Returns:
        The parsed root metadata.

    Raises:
        TrustError: not TUF metadata, metadata of another role, or not signed by
            the threshold of the root keys it names; the message is one line.
    """
    try:
        md: Metadata[Any] = Metadata.from_bytes(data)
    except DeserializationError as exc:
        raise TrustError(f"{what} is not TUF metadata ({_detail(exc)})") from exc
    signed = md.signed
    if not isinstance(signed, Root):
        raise TrustError(f"{what} holds {signed.type!r} metadata, not a root")
    role = signed.roles[Root.type]
    valid = sum(_signed_by(md, signed, keyid) for keyid in role.keyids)
    if valid < role.threshold:
        raise TrustError(
            f"{what} has {valid} valid signature(s) of its own root keys, "
            f"below its threshold of {role.threshold}"
        )
    root: Metadata[Root] = md
    return root


def _signed_by(md: Metadata[Any], root: Root, keyid: str) -> bool:
    """Whether the root key ``keyid`` signed ``md`` (python-tuf's check, without its logging)."""
    key, signature = root.keys.get(keyid), md.signatures.get(keyid)
    if key is None or signature is None:
        return False
    try:
        key.verify_signature(signature, md.signed_bytes)
    except UnverifiedSignatureError:  # a VerificationError (a garbled signature) is one too
        return False
    return True


def _detail(exc: Exception) -> str:
    """The parser's message on one line, cut to a readable length."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    if len(text) > _MAX_DETAIL_CHARS:
        text = text[: _MAX_DETAIL_CHARS - 3] + "..."
    return text
