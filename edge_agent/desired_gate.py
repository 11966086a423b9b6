"""What the agent lets through as its desired state: only the director's signed instructions.

A desired state from the hub is followed only when it arrives as a
``signed_desired`` instruction that verifies with the director key the device
trusts, names this device, carries a counter above the last one accepted and
has not expired (:class:`skills.trust.director.DirectorVerifier`). The accepted
instruction is kept in the state folder (written and synced before it is
followed), so replay protection survives a restart. A plain ``desired``
message is followed only in the explicit insecure mode.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

from google.protobuf.message import DecodeError

from protos import pb
from protos.envelope import now_ms
from skills.errors import TrustError
from skills.trust.director import (
    DirectorVerifier,
    InstructionError,
    SignedInstruction,
)

__all__ = ["DesiredGate"]

log = logging.getLogger(__name__)

_MAX_KEY_BYTES = 16 * 1024
_INSTRUCTION_FILE = "instruction.bin"
_PLAIN_FILE = "desired.bin"


class DesiredGate:
    """Checks desired-state messages for one device and keeps the last one accepted.

    Args:
        state_dir: The agent's state folder.
        device_id: This device's id (from its certificate when enrolled).
        director_key: The director's public key file; ``state_dir/identity/director.pub``
            (written at enrolment) when None.
        insecure: Follow plain ``desired`` messages too (the explicit insecure mode).
        clock_ms: Wall-clock milliseconds, for expiry.
    """

    def __init__(
        self,
        state_dir: Path,
        device_id: str,
        *,
        director_key: Path | None = None,
        insecure: bool = False,
        clock_ms: Callable[[], int] = now_ms,
    ) -> None:
        self.device_id = device_id
        self.insecure = insecure
        self.key_path = director_key or state_dir / "identity" / "director.pub"
        self._folder = state_dir / "director"
        self._plain_path = state_dir / _PLAIN_FILE
        self._clock_ms = clock_ms
        self._verifier: DirectorVerifier | None = None
        self._accepted = b""
        #: The counter of the last accepted instruction (0: none yet).
        self.last_counter = 0
        #: The desired state being followed, or None before the first one.
        self.desired: pb.DesiredState | None = None
        self._load()

    # -- checks --------------------------------------------------------------------

    def accept_signed(self, data: bytes) -> pb.DesiredState | None:
        """Verify a signed instruction and, if it holds, keep and return its desired state.

        Returns:
            The new desired state, or None for a second copy of the instruction already
            followed (a retained message delivered again: harmless).

        Raises:
            InstructionError: refused; ``reason`` is one of the verifier's, ``no-key``
                (no director key to check with) or ``malformed`` (the payload is not
                a desired state).
            OSError: the accepted instruction cannot be written (nothing is followed).
        """
        if data and data == self._accepted:
            return None
        verifier = self._load_verifier()
        inst = verifier.verify(
            data, device_id=self.device_id, last_counter=self.last_counter, now_ms=self._clock_ms()
        )
        desired = pb.DesiredState()
        try:
            desired.ParseFromString(inst.payload)
        except DecodeError as exc:
            raise InstructionError("malformed", "the payload is not a desired state") from exc
        _write_synced(self._folder / _INSTRUCTION_FILE, data)
        self._accepted, self.last_counter, self.desired = data, inst.counter, desired
        return desired

    def accept_plain(self, desired: pb.DesiredState) -> pb.DesiredState | None:
        """Follow an unsigned desired state, which only the insecure mode allows.

        Returns:
            The desired state, or None when it is older than the one followed.

        Raises:
            InstructionError: ``unsigned``, outside the insecure mode.
            OSError: it cannot be written.
        """
        if not self.insecure:
            raise InstructionError("unsigned", "a plain desired state outside the insecure mode")
        if self.desired is not None and desired.generation < self.desired.generation:
            return None
        _write_synced(self._plain_path, desired.SerializeToString())
        self.desired = desired
        return desired

    # -- state ---------------------------------------------------------------------

    def _load_verifier(self) -> DirectorVerifier:
        if self._verifier is not None:
            return self._verifier
        try:
            with self.key_path.open("rb") as fh:
                pem = fh.read(_MAX_KEY_BYTES + 1)
        except OSError as exc:
            raise InstructionError("no-key", f"no director key at {self.key_path}") from exc
        if len(pem) > _MAX_KEY_BYTES:
            raise InstructionError("no-key", f"{self.key_path} is over {_MAX_KEY_BYTES} bytes")
        try:
            self._verifier = DirectorVerifier([pem])
        except TrustError as exc:
            raise InstructionError("no-key", f"{self.key_path}: {exc}") from exc
        return self._verifier

    def _load(self) -> None:
        try:
            data = (self._folder / _INSTRUCTION_FILE).read_bytes()
        except FileNotFoundError:
            data = b""
        if data:
            try:
                inst = SignedInstruction.from_bytes(data).instruction
                desired = pb.DesiredState.FromString(inst.payload)
            except (InstructionError, DecodeError) as exc:
                log.error(
                    "the kept director instruction is unreadable; waiting for a new one: %s", exc
                )
            else:
                self._accepted, self.last_counter, self.desired = data, inst.counter, desired
                return
        if self.insecure:
            self.desired = _load_plain(self._plain_path)


def _load_plain(path: Path) -> pb.DesiredState | None:
    try:
        return pb.DesiredState.FromString(path.read_bytes())
    except (FileNotFoundError, DecodeError):
        return None


def _write_synced(path: Path, data: bytes) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    tmp.replace(path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
