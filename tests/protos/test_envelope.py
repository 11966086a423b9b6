"""The wire helpers: generated code is current, envelopes validate and caps hold."""

from __future__ import annotations

import subprocess
import sys

import pytest

from protos import (
    MAX_ENVELOPE_BYTES,
    ProtocolError,
    decode_envelope,
    encode_envelope,
    kind_of,
    make_envelope,
    pb,
)
from protos.limits import MAX_OFFER_BYTES


def test_generated_code_is_current() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "protos.generate", "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_round_trip_keeps_id_device_and_body() -> None:
    env = make_envelope("cam-1", heartbeat=pb.Heartbeat(uptime_s=7))
    back = decode_envelope(encode_envelope(env))
    assert (back.id, back.device_id, kind_of(back), back.heartbeat.uptime_s) == (
        env.id,
        "cam-1",
        "heartbeat",
        7,
    )


def test_ids_are_unique() -> None:
    ids = {make_envelope("d", heartbeat=pb.Heartbeat()).id for _ in range(1000)}
    assert len(ids) == 1000


def test_exactly_one_body() -> None:
    with pytest.raises(ValueError, match="exactly one body"):
        make_envelope("d", heartbeat=pb.Heartbeat(), ack=pb.Ack())


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"\xff\xff\xff", "not an envelope"),
        (pb.Envelope(device_id="d", heartbeat=pb.Heartbeat()).SerializeToString(), "id missing"),
        (pb.Envelope(id="x", device_id="d").SerializeToString(), "no body"),
        (
            pb.Envelope(id="x" * 65, heartbeat=pb.Heartbeat()).SerializeToString(),
            "id missing or longer",
        ),
        (b"\x00" * (MAX_ENVELOPE_BYTES + 1), "exceeds"),
    ],
)
def test_bad_input_is_refused(data: bytes, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        decode_envelope(data)


def test_oversized_envelope_is_not_encoded() -> None:
    big = pb.Telemetry(metrics={f"m{i}": float(i) for i in range(20000)})
    with pytest.raises(ProtocolError, match="cap"):
        encode_envelope(make_envelope("d", telemetry=big))


def _offered(kind: str, *files: tuple[str, bytes]) -> bytes:
    body = {"desired": pb.DesiredState(generation=1)} if kind == "desired" else {}
    if kind == "heartbeat":
        body = {"heartbeat": pb.Heartbeat()}
    env = make_envelope("cam-1", **body)
    env.metadata.root_version = 1
    env.metadata.files.extend(pb.MetadataFile(path=p, data=d) for p, d in files)
    return env.SerializeToString()


def test_a_metadata_offer_within_its_bounds_is_taken() -> None:
    files = [("metadata/timestamp.json", b"t"), ("metadata/2.snapshot.json", b"s")]
    env = decode_envelope(_offered("desired", *files))
    assert [f.path for f in env.metadata.files] == [p for p, _ in files]


@pytest.mark.parametrize(
    ("kind", "files", "match"),
    [
        ("heartbeat", [("metadata/timestamp.json", b"t")], "not a desired state"),
        ("desired", [(f"metadata/{i}.json", b"") for i in range(4)], "4 files"),
        ("desired", [("targets/digits.skill", b"x")], "not metadata/<file>"),
        ("desired", [("metadata/../keys/root.pem", b"x")], "not metadata/<file>"),
        ("desired", [("metadata/", b"x")], "not metadata/<file>"),
        ("desired", [("metadata/..json", b"x")], "not metadata/<file>"),
        ("desired", [("metadata/t.json", bytes(MAX_OFFER_BYTES + 1))], "bytes"),
    ],
    ids=["beside-heartbeat", "too-many", "a-target", "climbs-out", "no-name", "dot", "too-big"],
)
def test_a_metadata_offer_out_of_bounds_is_refused(
    kind: str, files: list[tuple[str, bytes]], match: str
) -> None:
    with pytest.raises(ProtocolError, match=match):
        decode_envelope(_offered(kind, *files))
