"""Drift samples reach the store over both transports: checked whole, stored once, then acked.

Runs over gRPC (an in-process server) and over MQTT (the real broker) against a
real SQLite store, with raw devices that can send any bytes (the helpers of
``test_grpc_server``).
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import numpy as np
import pytest

from cloud.hubcore import HubCore
from protos import encode_envelope, make_envelope, pb
from skills.tensor_codec import encode_protos
from tests.cloud import test_grpc_server as wire

# The transport fixtures and helpers of the gRPC/MQTT server tests.
transport, url, store, core = wire.transport, wire.url, wire.store, wire.core
serving, acked, dropped = wire.serving, wire.acked, wire.dropped


def tensor(shape: tuple[int, ...] = (1, 1, 8, 8), value: float = 0.5) -> pb.TensorProto:
    x = np.full(shape, value, dtype=np.float32)
    return encode_protos({"image": x}, ["image"], "fp32")[0]


def sample(**fields: Any) -> pb.DriftSample:
    values: dict[str, Any] = {
        "input": tensor(), "predicted": 3, "confidence": 0.4, "label": 7, "seen_at_ms": 1000,
    }  # fmt: skip
    values.update(fields)
    return pb.DriftSample(**values)


def samples_env(*samples: pb.DriftSample, device_id: str = "cam-1") -> pb.Envelope:
    body = pb.DriftSamples(skill="digits", version="1.0.0", samples=list(samples))
    return make_envelope(device_id, drift_samples=body)


def bad_dtype() -> pb.DriftSample:
    s = sample()
    s.input.dtype = "float64"
    return s


def bad_shape() -> pb.DriftSample:
    s = sample()
    s.input.shape[:] = [1, 1, 8, 9]  # data for 64 values, shape says 72
    return s


HOSTILE = {
    "too many": [sample() for _ in range(65)],
    "none": [],
    "tensor over 64 KiB": [sample(input=tensor((1, 1, 129, 128)))],
    "unknown dtype": [bad_dtype()],
    "shape off its data": [bad_shape()],
    "confidence NaN": [sample(confidence=math.nan)],
    "confidence over 1": [sample(confidence=1.5)],
    "label under -1": [sample(label=-2)],
    "label at 1024": [sample(label=1024)],
    "not finite input": [sample(input=tensor(value=math.inf))],
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_samples_are_refused_whole_counted_and_nothing_is_stored(
    transport: str, core: HubCore, url: str, case: str
) -> None:
    # One good sample beside the bad one: the envelope is refused as a whole.
    bad = samples_env(sample(), *HOSTILE[case]) if HOSTILE[case] else samples_env()

    async def main() -> None:
        async with serving(transport, core, url) as dev:
            await dev.send(encode_envelope(bad), "drift_samples")
            await dropped(core, {"invalid": 1})
            good = samples_env(sample(label=-1))
            assert await acked(dev, good) == [good.id]  # the device is still served

    asyncio.run(main())
    stored = core.store.drift_samples("digits", "1.0.0")
    assert [(s.label, s.predicted) for s in stored] == [(-1, 3)]


def test_samples_are_stored_once_and_every_copy_is_acked(
    transport: str, core: HubCore, url: str
) -> None:
    env = samples_env(sample(), sample(label=-1, confidence=0.2))

    async def main() -> None:
        async with serving(transport, core, url) as dev:
            assert await acked(dev, env) == [env.id]
            assert await acked(dev, env) == [env.id]  # a resend after a lost ack
        assert core.handled["drift_samples"] == 1

    asyncio.run(main())
    stored = core.store.drift_samples("digits", "1.0.0")
    assert [(s.device_id, s.label, s.shape) for s in stored] == [
        ("cam-1", 7, (1, 1, 8, 8)),
        ("cam-1", -1, (1, 1, 8, 8)),
    ]
    assert pb.TensorProto.FromString(stored[0].tensor) == tensor()
    assert core.store.count_drift_samples("digits", "1.0.0") == (2, 1)
    # A hub restarted (its memory of ids gone) still finds the copy in the store.
    assert not core.store.add_drift_samples(env.id, "cam-1", _batch(env), now_ms=2000)


def _batch(env: pb.Envelope) -> Any:
    from cloud.drift_samples import samples_from_wire  # noqa: PLC0415

    return samples_from_wire(env.drift_samples)


def test_a_skill_version_keeps_only_its_newest_samples(core: HubCore) -> None:
    for i in range(5):
        env = samples_env(sample(label=i), sample(label=i + 100))
        assert core.store.add_drift_samples(env.id, "cam-1", _batch(env), now_ms=i, keep=3)
    assert [s.label for s in core.store.drift_samples("digits", "1.0.0")] == [103, 4, 104]
