"""The hub's director (Uptane's director role): per-device signed desired state.

TUF metadata says what a bundle is; the director says what one device must
run now. :class:`HubDirector` keeps the hub's director key in
``<home>/director/`` and signs each device's desired state bound to its id, a
counter that only grows and an expiry (:mod:`skills.trust.director`). The
counter and the latest instruction live in the store, so every hub process
signs consistently: a new instruction (with the next counter) is made only
when the desired state changed or the stored one is close to its expiry.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cloud.errors import StoreError
from cloud.store import DesiredRecord, InstructionRecord, Store
from cloud.wire import desired_message
from protos import make_envelope, pb
from protos.envelope import now_ms
from protos.limits import MAX_ENVELOPE_BYTES
from skills.errors import TrustError
from skills.trust.director import DirectorKey, Instruction, InstructionError

__all__ = ["DirectorError", "DirectorSettings", "HubDirector", "signed_envelope"]

log = logging.getLogger(__name__)

_KEY_FILE = "director.pem"
_PUB_FILE = "director.pub"
_MAX_KEY_BYTES = 16 * 1024
#: Room the envelope needs around the instruction.
_MAX_PAYLOAD_BYTES = MAX_ENVELOPE_BYTES - 4096
_CAS_TRIES = 8


class DirectorError(StoreError):
    """The director key cannot be read or made, or an instruction cannot be signed.

    A :class:`~cloud.errors.StoreError`: the hub cannot produce the device's
    desired state now, and callers handle it as they handle a store failure.
    """


@dataclass(frozen=True)
class DirectorSettings:
    """How long instructions live, and when they are signed again before they expire."""

    ttl_s: float = 24 * 3600.0
    #: An instruction closer than this to its expiry is signed again (with a new counter).
    refresh_margin_s: float = 6 * 3600.0

    def __post_init__(self) -> None:
        if not 0 < self.refresh_margin_s < self.ttl_s:
            raise ValueError("refresh_margin_s must be in (0, ttl_s)")


class HubDirector:
    """The hub's director key and the signing of per-device instructions.

    Args:
        home: The hub's home folder; the key lives in ``home/director/director.pem``
            (0600, folder 0700), made on first use, and its public half in
            ``director.pub``.
        settings: Instruction lifetime and refresh margin.

    Raises:
        DirectorError: The key file exists but is not a director key, or cannot
            be read or written.
    """

    def __init__(self, home: Path, settings: DirectorSettings | None = None) -> None:
        self.settings = settings or DirectorSettings()
        self.folder = Path(home) / "director"
        self.key = _load_or_create(self.folder)
        #: Instructions signed by this process (for logs and tests).
        self.signed = 0

    @property
    def public_path(self) -> Path:
        """Where the public half is kept (``director.pub``): what devices trust."""
        return self.folder / _PUB_FILE

    def public_pem(self) -> bytes:
        """The director's public key, PEM (SubjectPublicKeyInfo)."""
        return self.key.public_pem

    # -- signing -----------------------------------------------------------------------

    def needs_signing(self, stored: tuple[int, int, int] | None, generation: int, now: int) -> bool:
        """Whether a device whose stored ``(counter, generation, expires_ms)`` is ``stored``
        needs a new instruction for desired ``generation`` at ``now`` (ms).
        """
        if stored is None:
            return generation > 0
        _, signed_generation, expires_ms = stored
        margin_ms = int(self.settings.refresh_margin_s * 1000)
        return signed_generation != generation or expires_ms - now <= margin_ms

    def instruction(
        self, store: Store, desired: DesiredRecord, now: int | None = None
    ) -> InstructionRecord:
        """The device's current signed instruction for ``desired``, signing one if needed.

        Reuses the stored instruction when it carries the same desired state and
        is not close to its expiry; otherwise signs the next counter and stores it
        (compare-and-set, so concurrent hub processes agree). Blocking: call from
        a worker thread.

        Raises:
            DirectorError: The desired state is too large to sign, or signers kept racing.
            StoreError: The store failed.
        """
        payload, digest = self._payload(desired)
        return self._current(store, desired, payload, digest, now)

    def _current(
        self, store: Store, desired: DesiredRecord, payload: bytes, digest: str, now: int | None
    ) -> InstructionRecord:
        """:meth:`instruction` once the payload is made and checked."""
        for _ in range(_CAS_TRIES):
            now_at = now_ms() if now is None else now
            stored = store.instruction_for(desired.device_id)
            if stored is not None and self._reusable(stored, digest, now_at):
                return stored
            record = self._sign(desired, payload, digest, stored, now_at)
            if store.save_instruction(record, previous=stored.counter if stored else 0):
                self.signed += 1
                return record
        raise DirectorError(f"could not store an instruction for {desired.device_id}: contention")

    def instructions(
        self, store: Store, records: Sequence[DesiredRecord], now: int | None = None
    ) -> dict[str, InstructionRecord | DirectorError]:
        """:meth:`instruction` for several devices, reading their stored ones in one query.

        Those still current (the usual case: the notifier's poll signed them) come
        from that one read; the rest go through :meth:`instruction` one by one. A
        device whose state cannot be signed gets its error in its place, and the
        others their instructions. Blocking: call from a worker thread.

        Raises:
            StoreError: The store failed.
        """
        now_at = now_ms() if now is None else now
        stored = store.instructions_many([r.device_id for r in records])
        found: dict[str, InstructionRecord | DirectorError] = {}
        for desired in records:
            device = desired.device_id
            try:
                payload, digest = self._payload(desired)
                current = stored.get(device)
                if current is not None and self._reusable(current, digest, now_at):
                    found[device] = current
                else:
                    found[device] = self._current(store, desired, payload, digest, now_at)
            except DirectorError as exc:
                found[device] = exc
        return found

    @staticmethod
    def _payload(desired: DesiredRecord) -> tuple[bytes, str]:
        """The signed payload of ``desired`` and its SHA-256 (hex).

        Raises:
            DirectorError: the payload is over the cap.
        """
        payload = desired_message(desired).SerializeToString(deterministic=True)
        if len(payload) > _MAX_PAYLOAD_BYTES:
            raise DirectorError(f"desired state of {desired.device_id} is {len(payload)} bytes")
        return payload, hashlib.sha256(payload).hexdigest()

    def _reusable(self, stored: InstructionRecord, digest: str, now: int) -> bool:
        """Whether ``stored`` carries the state of ``digest`` and is not close to expiry."""
        margin_ms = int(self.settings.refresh_margin_s * 1000)
        return stored.payload_sha256 == digest and stored.expires_ms - now > margin_ms

    def _sign(
        self,
        desired: DesiredRecord,
        payload: bytes,
        digest: str,
        stored: InstructionRecord | None,
        now: int,
    ) -> InstructionRecord:
        counter = (stored.counter if stored else 0) + 1
        expires = now + int(self.settings.ttl_s * 1000)
        try:
            signed = self.key.sign(Instruction(desired.device_id, counter, expires, payload))
            data = signed.to_bytes()
        except InstructionError as exc:
            raise DirectorError(f"cannot sign for {desired.device_id}: {exc}") from exc
        return InstructionRecord(
            desired.device_id, counter, desired.generation, expires, now, digest, data
        )

    def revisions(self, store: Store, now: int | None = None) -> dict[str, int]:
        """Every device's instruction counter, after signing what is due (the notifier's poll).

        Signs again every instruction that is stale (the desired state changed) or
        close to its expiry. Safe on every hub process: the store's compare-and-set
        orders signers. Devices with nothing desired and no instruction are at 0.
        Blocking: call from a worker thread.

        Raises:
            StoreError: The store failed.
        """
        now_at = now_ms() if now is None else now
        index = store.instruction_index()
        generations = store.desired_generations()
        counters = {d: index[d][0] if d in index else 0 for d in generations}
        due = [d for d, g in generations.items() if self.needs_signing(index.get(d), g, now_at)]
        for desired in store.desired_many(due) if due else []:
            try:
                counters[desired.device_id] = self.instruction(store, desired, now_at).counter
            except DirectorError as exc:  # one device's oversized state must not stop the rest
                log.warning("director: %s", exc)
        return counters


def signed_envelope(device_id: str, record: InstructionRecord) -> pb.Envelope:
    """The ``signed_desired`` envelope carrying ``record``'s instruction."""
    return make_envelope(device_id, signed_desired=pb.SignedDesired(instruction=record.instruction))


def _load_or_create(folder: Path) -> DirectorKey:
    path = folder / _KEY_FILE
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder.chmod(0o700)
        try:
            with path.open("rb") as fh:
                data = fh.read(_MAX_KEY_BYTES + 1)
        except FileNotFoundError:
            return _create(folder)
    except OSError as exc:
        raise DirectorError(f"cannot read the director key in {folder}: {exc}") from exc
    if len(data) > _MAX_KEY_BYTES:
        raise DirectorError(f"{path} is not a director key (too large)")
    try:
        key = DirectorKey.from_pem(data)
    except TrustError as exc:
        raise DirectorError(f"{path}: {exc}") from exc
    pub = folder / _PUB_FILE
    try:
        if not pub.exists() or pub.read_bytes() != key.public_pem:
            _write(pub, key.public_pem, 0o644)
    except OSError as exc:
        raise DirectorError(f"cannot write {pub}: {exc}") from exc
    return key


def _create(folder: Path) -> DirectorKey:
    key = DirectorKey.generate()
    tmp = folder / f".{_KEY_FILE}.{os.getpid()}.tmp"
    _write(tmp, key.private_pem(), 0o600)
    try:
        os.link(tmp, folder / _KEY_FILE)  # fails if another hub process made one first
    except FileExistsError:
        return _load_or_create(folder)
    finally:
        tmp.unlink(missing_ok=True)
    _write(folder / _PUB_FILE, key.public_pem, 0o644)
    log.info("made a new director key in %s (key id %s)", folder, key.key_id)
    return key


def _write(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.w{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    tmp.chmod(mode)
    tmp.replace(path)
