"""Property tests of the envelope decoder: hostile bytes give an envelope or a ProtocolError.

A decoded envelope always satisfies the checks every handler relies on (an
id, a body, bounded ids), and encoding it again gives an equal envelope.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from protos import MAX_ENVELOPE_BYTES, decode_envelope, encode_envelope, kind_of, make_envelope, pb
from protos.envelope import validate_envelope
from protos.errors import ProtocolError
from protos.limits import MAX_DEVICE_ID_CHARS

_SETTINGS = settings(max_examples=300, deadline=None)


@_SETTINGS
@given(st.binary(max_size=2048))
def test_any_bytes_are_an_envelope_or_a_protocol_error(data: bytes) -> None:
    try:
        env = decode_envelope(data)
    except ProtocolError:
        return
    validate_envelope(env)
    assert kind_of(env)
    assert decode_envelope(encode_envelope(env)) == env


@_SETTINGS
@given(
    device=st.text(max_size=200),
    uptime=st.integers(0, 2**63 - 1),
    labels=st.dictionaries(st.text(max_size=20), st.text(max_size=20), max_size=5),
)
def test_envelopes_we_make_survive_the_wire_or_are_refused_at_decode(
    device: str, uptime: int, labels: dict[str, str]
) -> None:
    for body in (
        {"heartbeat": pb.Heartbeat(uptime_s=uptime)},
        {"register": pb.Register(labels=labels)},
    ):
        env = make_envelope(device, **body)  # type: ignore[arg-type]
        data = env.SerializeToString()
        try:
            back = decode_envelope(data)
        except ProtocolError:
            assert len(device) > MAX_DEVICE_ID_CHARS or len(data) > MAX_ENVELOPE_BYTES
            continue
        assert back == env


@_SETTINGS
@given(st.binary(min_size=1, max_size=64))
def test_a_message_over_the_cap_is_refused_before_parsing(tail: bytes) -> None:
    data = b"\x00" * MAX_ENVELOPE_BYTES + tail
    try:
        decode_envelope(data)
    except ProtocolError as exc:
        assert "cap" in str(exc)
    else:
        raise AssertionError("an oversized message was decoded")
