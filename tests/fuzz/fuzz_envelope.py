"""atheris harness: the envelope decoder gives an envelope or a ProtocolError, nothing else."""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports():
    from protos import decode_envelope, encode_envelope
    from protos.errors import ProtocolError


def one_input(data: bytes) -> None:
    """Decode ``data``; an accepted envelope must survive a round trip."""
    try:
        env = decode_envelope(data)
    except ProtocolError:
        return
    if decode_envelope(encode_envelope(env)) != env:
        raise AssertionError("an accepted envelope does not round-trip")


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
