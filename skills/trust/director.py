"""Signed desired state: the director's per-device instruction (Uptane's director role).

TUF metadata says *what a bundle is*; the director says *what this device must
run now*. The hub signs each device's desired state with its director key,
bound to the device id, a counter that only grows, and an expiry. The agent
accepts an instruction only when all of these hold, so a message injected on
the broker, replayed from the past, meant for another device or held back
until it is stale changes nothing.

This module is pure: bytes and keys in, an instruction or an
:class:`InstructionError` (with a ``reason`` for counting) out.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from skills.errors import TrustError

__all__ = [
    "MAX_INSTRUCTION_BYTES",
    "DirectorKey",
    "DirectorVerifier",
    "Instruction",
    "InstructionError",
    "SignedInstruction",
]

MAX_INSTRUCTION_BYTES = 256 * 1024
_MAGIC = b"ESDI1"  # EdgeSkill director instruction, format 1
_HEADER = struct.Struct(">5sQqHHI")  # magic, counter, expires_ms, len(device), len(key), len(body)
_SIG_BYTES = 64
_MAX_DEVICE_ID = 128
_KEY_ID_CHARS = 16


class InstructionError(TrustError):
    """An instruction the agent must not follow; ``reason`` names why, for counting."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason


@dataclass(frozen=True)
class Instruction:
    """What the director signs: this device, this desired state, in this order, until then."""

    device_id: str
    counter: int
    expires_ms: int
    payload: bytes

    def signed_bytes(self, key_id: str) -> bytes:
        """The exact bytes the signature covers (everything but the signature).

        Raises:
            InstructionError: a field is out of range.
        """
        device = self.device_id.encode("utf-8")
        key = key_id.encode("ascii")
        if not 0 < len(device) <= _MAX_DEVICE_ID or not 0 <= self.counter < 2**63:
            raise InstructionError("malformed", "device id or counter out of range")
        if len(self.payload) > MAX_INSTRUCTION_BYTES:
            raise InstructionError("oversized", f"payload over {MAX_INSTRUCTION_BYTES} bytes")
        header = _HEADER.pack(
            _MAGIC, self.counter, self.expires_ms, len(device), len(key), len(self.payload)
        )
        return header + device + key + self.payload


@dataclass(frozen=True)
class SignedInstruction:
    """An instruction with the director's signature, as it travels."""

    instruction: Instruction
    key_id: str
    signature: bytes

    def to_bytes(self) -> bytes:
        """Serialise: the signed bytes followed by the 64-byte signature.

        Raises:
            InstructionError: a field is out of range.
        """
        return self.instruction.signed_bytes(self.key_id) + self.signature

    @classmethod
    def from_bytes(cls, data: bytes) -> SignedInstruction:
        """Parse what :meth:`to_bytes` wrote; nothing is trusted yet.

        Raises:
            InstructionError: ``unsigned``/``malformed``/``oversized`` input.
        """
        if not data:
            raise InstructionError("unsigned", "no signed instruction")
        if len(data) > MAX_INSTRUCTION_BYTES + 1024:
            raise InstructionError("oversized", f"{len(data)} bytes")
        if len(data) < _HEADER.size + _SIG_BYTES:
            raise InstructionError("malformed", "too short")
        magic, counter, expires, n_dev, n_key, n_body = _HEADER.unpack_from(data)
        if magic != _MAGIC:
            raise InstructionError("malformed", "not a director instruction")
        end = _HEADER.size + n_dev + n_key + n_body
        if end + _SIG_BYTES != len(data) or n_key != _KEY_ID_CHARS:
            raise InstructionError("malformed", "lengths do not add up")
        start = _HEADER.size
        try:
            device = data[start : start + n_dev].decode("utf-8")
            key_id = data[start + n_dev : start + n_dev + n_key].decode("ascii")
        except UnicodeDecodeError as exc:
            raise InstructionError("malformed", "device or key id is not text") from exc
        body = data[start + n_dev + n_key : end]
        return cls(Instruction(device, counter, expires, body), key_id, data[end:])


class DirectorKey:
    """The hub's director signing key (ed25519)."""

    def __init__(self, private: Ed25519PrivateKey) -> None:
        self._private = private
        self.public_pem = private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        self.key_id = key_id_of(self.public_pem)

    @classmethod
    def generate(cls) -> DirectorKey:
        """A new random key."""
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_pem(cls, data: bytes) -> DirectorKey:
        """Load a PKCS8 PEM private key.

        Raises:
            TrustError: not an unencrypted ed25519 private key.
        """
        try:
            key = serialization.load_pem_private_key(data, None)
        except (ValueError, TypeError) as exc:
            raise TrustError(f"not a director key: {exc}") from exc
        if not isinstance(key, Ed25519PrivateKey):
            raise TrustError("the director key must be ed25519")
        return cls(key)

    def private_pem(self) -> bytes:
        """The private key as unencrypted PKCS8 PEM (store it 0600)."""
        return self._private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    def sign(self, instruction: Instruction) -> SignedInstruction:
        """Sign ``instruction``.

        Raises:
            InstructionError: a field is out of range.
        """
        signature = self._private.sign(instruction.signed_bytes(self.key_id))
        return SignedInstruction(instruction, self.key_id, signature)


def key_id_of(public_pem: bytes) -> str:
    """A short, stable name for a public key: 16 hex characters of its SHA-256."""
    return hashlib.sha256(public_pem).hexdigest()[:_KEY_ID_CHARS]


class DirectorVerifier:
    """What the agent checks before it follows an instruction."""

    def __init__(self, public_pems: Iterable[bytes]) -> None:
        """Trust the given director public keys (more than one during a rotation).

        Raises:
            TrustError: a key is not an ed25519 public key.
        """
        self._keys: dict[str, Ed25519PublicKey] = {}
        for pem in public_pems:
            try:
                key = serialization.load_pem_public_key(pem)
            except ValueError as exc:
                raise TrustError(f"not a director public key: {exc}") from exc
            if not isinstance(key, Ed25519PublicKey):
                raise TrustError("director public keys must be ed25519")
            self._keys[key_id_of(pem)] = key
        if not self._keys:
            raise TrustError("no director key to trust")

    def verify(self, data: bytes, *, device_id: str, last_counter: int, now_ms: int) -> Instruction:
        """Check a signed instruction for this device, after ``last_counter``, at ``now_ms``.

        Raises:
            InstructionError: with ``reason`` one of ``unsigned``, ``malformed``,
                ``oversized``, ``unknown-key``, ``bad-signature``, ``foreign``
                (another device's), ``replayed`` (the counter was seen),
                ``reordered`` (an older counter) or ``expired``.
        """
        signed = SignedInstruction.from_bytes(data)
        key = self._keys.get(signed.key_id)
        if key is None:
            raise InstructionError("unknown-key", f"key {signed.key_id} is not trusted")
        inst = signed.instruction
        try:
            key.verify(signed.signature, inst.signed_bytes(signed.key_id))
        except InvalidSignature as exc:
            raise InstructionError("bad-signature", "the signature does not verify") from exc
        if inst.device_id != device_id:
            raise InstructionError("foreign", f"meant for {inst.device_id!r}, not {device_id!r}")
        if inst.counter == last_counter:
            raise InstructionError("replayed", f"counter {inst.counter} was seen already")
        if inst.counter < last_counter:
            raise InstructionError(
                "reordered", f"counter {inst.counter} is older than {last_counter}"
            )
        if inst.expires_ms <= now_ms:
            raise InstructionError("expired", f"expired at {inst.expires_ms} ms")
        return inst
