"""The director's signed instructions: accepted only for this device, in order, in time, signed."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skills.errors import TrustError
from skills.trust.director import (
    DirectorKey,
    DirectorVerifier,
    Instruction,
    InstructionError,
    SignedInstruction,
)

NOW = 1_800_000_000_000
KEY = DirectorKey.generate()


def _signed(device: str = "cam-1", counter: int = 5, expires: int = NOW + 60_000) -> bytes:
    return KEY.sign(Instruction(device, counter, expires, b"desired-state-bytes")).to_bytes()


def _verify(data: bytes, device: str = "cam-1", last: int = 4) -> Instruction:
    return DirectorVerifier([KEY.public_pem]).verify(
        data, device_id=device, last_counter=last, now_ms=NOW
    )


def test_a_good_instruction_is_accepted_whole() -> None:
    inst = _verify(_signed())
    assert inst == Instruction("cam-1", 5, NOW + 60_000, b"desired-state-bytes")


@pytest.mark.parametrize(
    ("data", "device", "last", "reason"),
    [
        (b"", "cam-1", 4, "unsigned"),
        (b"ESDI1" + b"\x00" * 10, "cam-1", 4, "malformed"),
        (_signed(device="cam-2"), "cam-1", 4, "foreign"),
        (_signed(counter=4), "cam-1", 4, "replayed"),
        (_signed(counter=3), "cam-1", 4, "reordered"),
        (_signed(expires=NOW), "cam-1", 4, "expired"),
        (
            DirectorKey.generate().sign(Instruction("cam-1", 9, NOW + 1, b"x")).to_bytes(),
            "cam-1",
            4,
            "unknown-key",
        ),
    ],
    ids=["unsigned", "malformed", "foreign", "replayed", "reordered", "expired", "unknown-key"],
)
def test_each_bad_instruction_is_refused_with_its_reason(
    data: bytes, device: str, last: int, reason: str
) -> None:
    with pytest.raises(InstructionError) as caught:
        _verify(data, device, last)
    assert caught.value.reason == reason


def test_a_forged_signature_by_another_key_under_our_key_id_is_refused() -> None:
    forged = DirectorKey.generate().sign(Instruction("cam-1", 9, NOW + 1, b"evil"))
    spoofed = SignedInstruction(forged.instruction, KEY.key_id, forged.signature)
    with pytest.raises(InstructionError) as caught:
        _verify(spoofed.to_bytes())
    assert caught.value.reason == "bad-signature"


def test_keys_round_trip_and_bad_keys_are_refused() -> None:
    again = DirectorKey.from_pem(KEY.private_pem())
    assert again.key_id == KEY.key_id
    with pytest.raises(TrustError):
        DirectorKey.from_pem(b"not a key")
    with pytest.raises(TrustError):
        DirectorVerifier([])


def test_during_a_rotation_both_keys_are_trusted() -> None:
    new = DirectorKey.generate()
    verifier = DirectorVerifier([KEY.public_pem, new.public_pem])
    for key, counter in ((KEY, 5), (new, 6)):
        data = key.sign(Instruction("cam-1", counter, NOW + 1, b"x")).to_bytes()
        assert verifier.verify(data, device_id="cam-1", last_counter=counter - 1, now_ms=NOW)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10_000), st.integers(0, 7))
def test_any_flipped_bit_is_refused(position: int, bit: int) -> None:
    data = bytearray(_signed())
    data[position % len(data)] ^= 1 << bit
    with pytest.raises(InstructionError):
        _verify(bytes(data))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600))
def test_any_bytes_are_refused_or_a_valid_instruction(data: bytes) -> None:
    try:
        inst = _verify(data)
    except InstructionError as exc:
        assert exc.reason in {
            "unsigned",
            "malformed",
            "oversized",
            "unknown-key",
            "bad-signature",
            "foreign",
            "replayed",
            "reordered",
            "expired",
        }
    else:  # only a real signature gets here, which random bytes do not have
        raise AssertionError(f"random bytes accepted as {inst}")
