"""The wire contract's shared pieces: one error per name, fetch codes, caps and PEM reading."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

import cloud.errors
import edge_agent.errors
import protos
from cloud.mqtt_fetch import requested_window
from protos.envelope import validate_envelope
from protos.errors import ProtocolError, TransportError
from protos.fetch import GRPC_STATUS_NAMES, WINDOW_PROPERTY, FetchErrorCode
from protos.limits import MAX_DEVICE_ID_CHARS, MAX_MESSAGE_ID_CHARS
from protos.pem import read_pem
from protos.topics import Topics


def test_transport_error_is_one_class_on_both_sides() -> None:
    assert cloud.errors.TransportError is TransportError
    assert edge_agent.errors.TransportError is TransportError
    assert protos.TransportError is TransportError
    assert not issubclass(TransportError, ProtocolError)


def test_every_fetch_code_has_a_grpc_status_and_only_final_ones_are_final() -> None:
    assert set(GRPC_STATUS_NAMES) == set(FetchErrorCode)
    assert all(hasattr(grpc.StatusCode, name) for name in GRPC_STATUS_NAMES.values())
    assert len(set(GRPC_STATUS_NAMES.values())) == len(FetchErrorCode)
    assert {c for c in FetchErrorCode if c.final} == {
        FetchErrorCode.TOO_LARGE,
        FetchErrorCode.REFUSED,
    }
    assert [str(c) for c in FetchErrorCode] == [
        "not-found",
        "too-large",
        "refused",
        "unknown-device",
        "busy",
    ]


@pytest.mark.parametrize(
    ("user", "window"),
    [
        ((), 32),
        (((WINDOW_PROPERTY, "8"),), 8),
        (((WINDOW_PROPERTY, "0"),), 1),
        (((WINDOW_PROPERTY, "9999"),), 64),
        (((WINDOW_PROPERTY, "9" * 5000),), 32),  # no 5000-digit int parsed
        (((WINDOW_PROPERTY, "²"),), 32),
        ((("other", "8"),), 32),
    ],
)
def test_the_window_property_is_read_within_its_cap(
    user: tuple[tuple[str, str], ...], window: int
) -> None:
    assert requested_window(user, 64) == window


def test_envelope_caps_come_from_the_limits() -> None:
    env = protos.make_envelope("d" * MAX_DEVICE_ID_CHARS, heartbeat=protos.pb.Heartbeat())
    env.id = "i" * MAX_MESSAGE_ID_CHARS
    validate_envelope(env)
    env.id += "i"
    with pytest.raises(ProtocolError, match=f"longer than {MAX_MESSAGE_ID_CHARS}"):
        validate_envelope(env)
    env.id = "ok"
    env.device_id += "d"
    with pytest.raises(ProtocolError, match=f"longer than {MAX_DEVICE_ID_CHARS}"):
        validate_envelope(env)
    Topics().down("d" * MAX_DEVICE_ID_CHARS, "desired")
    with pytest.raises(ProtocolError):
        Topics().down("d" * (MAX_DEVICE_ID_CHARS + 1), "desired")


def test_read_pem_refuses_missing_empty_and_oversized_files(tmp_path: Path) -> None:
    good = tmp_path / "ok.pem"
    good.write_bytes(b"-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n")
    assert read_pem(good) == good.read_bytes()
    with pytest.raises(TransportError, match="cannot read TLS file"):
        read_pem(tmp_path / "missing.pem")
    (tmp_path / "empty.pem").write_bytes(b"  \n")
    with pytest.raises(TransportError, match="empty or larger than 100 bytes"):
        read_pem(tmp_path / "empty.pem", max_bytes=100)
    with pytest.raises(TransportError, match="empty or larger than 10 bytes"):
        read_pem(good, max_bytes=10)
