"""Drift samples: strict opt-in config, caps that hold, and the least sure inputs kept.

Pure: collectors and the watch are fed items and results by hand; no agent, no I/O.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

from edge_agent.drift_samples import (
    HARD_MAX_BYTES,
    HARD_MAX_COUNT,
    MAX_INPUT_BYTES,
    SampleCaps,
    SampleCollector,
    SampleConfigError,
    SampleSettings,
    SampleWatch,
    parse_settings,
)
from protos import MAX_ENVELOPE_BYTES, decode_envelope, encode_envelope, make_envelope, pb
from skills.manifest import Manifest, TensorSpec
from skills.tensor_codec import decode_protos

ON = {"drift.samples": "on"}


def collector(**settings: Any) -> SampleCollector:
    return SampleCollector("digits", "1.0.0", "image", SampleSettings(**settings))


def frame(value: float = 0.5, shape: tuple[int, ...] = (8, 8), dtype: Any = np.float32) -> Any:
    return {"image": np.full(shape, value, dtype=dtype), "scaled": True}


def answer(confidence: float, predicted: int = 3) -> dict[str, Any]:
    return {"label": predicted, "confidence": confidence}


def decoded(sample: pb.DriftSample) -> np.ndarray:
    return decode_protos([sample.input], ["image"])["image"]


# --- the deployment's config ---------------------------------------------------------------


@pytest.mark.parametrize("config", [{}, {"drift.samples": "off"}, {"other": "on"}])
def test_sampling_is_off_unless_the_deployment_says_on(config: dict[str, str]) -> None:
    assert parse_settings(config) is None


def test_on_takes_the_defaults_or_the_deployments_values() -> None:
    assert parse_settings(ON) == SampleSettings(max_count=16, max_bytes=64 * 1024, below=0.6)
    asked = {**ON, "drift.samples_max": "8", "drift.samples_bytes": "4096"}
    asked["drift.samples_below"] = "0.25"
    assert parse_settings(asked) == SampleSettings(max_count=8, max_bytes=4096, below=0.25)
    assert parse_settings({**ON, "drift.samples_below": "1"}) == SampleSettings(below=1.0)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("drift.samples", "yes"),
        ("drift.samples", "ON"),
        ("drift.samples", " on"),
        ("drift.samples_max", "0"),
        ("drift.samples_max", "-1"),
        ("drift.samples_max", "+5"),
        ("drift.samples_max", "1e3"),
        ("drift.samples_max", "16.0"),
        ("drift.samples_max", "1_6"),
        ("drift.samples_max", " 16"),
        ("drift.samples_max", "9" * 40),
        ("drift.samples_bytes", "64KiB"),
        ("drift.samples_bytes", ""),
        ("drift.samples_below", "0"),
        ("drift.samples_below", "1.5"),
        ("drift.samples_below", "nan"),
        ("drift.samples_below", "inf"),
        ("drift.samples_below", "."),
        ("drift.samples_below", "0.6 "),
        ("drift.samples_below", "-0.5"),
        ("drift.samples_mx", "8"),  # a typo is not a silent default
    ],
)
def test_a_bad_value_is_refused(key: str, value: str) -> None:
    with pytest.raises(SampleConfigError):
        parse_settings({**ON, key: value})


def test_a_hub_asking_for_more_gets_the_devices_caps() -> None:
    asked = parse_settings({**ON, "drift.samples_max": "100000", "drift.samples_bytes": "9" * 9})
    assert asked is not None
    assert asked.within(SampleCaps()) == SampleSettings(HARD_MAX_COUNT, HARD_MAX_BYTES, 0.6)
    owner = SampleCaps(max_count=4, max_bytes=1000)
    assert asked.within(owner) == SampleSettings(4, 1000, 0.6)
    with pytest.raises(ValueError, match="max_count"):
        SampleCaps(max_count=HARD_MAX_COUNT + 1)
    with pytest.raises(ValueError, match="max_bytes"):
        SampleCaps(max_bytes=HARD_MAX_BYTES + 1)


# --- one window's samples ----------------------------------------------------------------


def test_the_least_confident_inputs_are_kept_least_confident_first() -> None:
    rng = np.random.default_rng(0)
    box = collector(max_count=16, below=0.6)
    confidences = rng.random(500)
    for i, c in enumerate(confidences):
        box.offer(frame(float(i)), answer(float(c)), i % 10, 1000 + i)
    message = box.flush()
    assert message is not None and (message.skill, message.version) == ("digits", "1.0.0")
    kept = [s.confidence for s in message.samples]
    lowest = np.sort(confidences[confidences < 0.6])[:16].astype(np.float32)
    assert kept == lowest.tolist()
    for sample in message.samples:  # each sample is the very item that was that unsure
        i = int(decoded(sample)[0, 0])
        assert np.float32(confidences[i]) == sample.confidence
        assert (sample.label, sample.seen_at_ms, sample.predicted) == (i % 10, 1000 + i, 3)
    assert box.flush() is None  # the next window starts empty


def test_confident_answers_are_never_sampled() -> None:
    box = collector(below=0.6)
    assert box.offer(frame(), answer(0.6), None, 0) == "confident"
    assert box.offer(frame(), answer(0.99), None, 0) == "confident"
    assert box.flush() is None


def test_the_label_is_carried_where_known_and_minus_one_otherwise() -> None:
    box = collector()
    for label in (7, None, 5000, -3):
        assert box.offer(frame(), answer(0.1), label, 0) == "kept"
    message = box.flush()
    assert message is not None
    assert sorted(s.label for s in message.samples) == [-1, -1, -1, 7]


def test_the_byte_cap_holds_whatever_the_sizes() -> None:
    rng = np.random.default_rng(1)
    box = collector(max_count=64, max_bytes=20_000, below=1.0)
    for _ in range(300):
        size = int(rng.integers(1, 3000))
        assert box.offer(frame(1.0, (size,)), answer(float(rng.random())), None, 0) != "no-input"
        assert box.kept_bytes <= 20_000 and len(box) <= 64
    message = box.flush()
    assert message is not None and message.ByteSize() <= 20_000 + 64
    # Same-sized inputs: the byte cap keeps the least sure ones, as the count cap does.
    box = collector(max_count=64, max_bytes=5000, below=1.0)
    confidences = rng.random(100)
    for c in confidences:
        box.offer(frame(0.5, (256,)), answer(float(c)), None, 0)  # ~1 KiB each
    message = box.flush()
    assert message is not None and len(message.samples) == 4
    assert [s.confidence for s in message.samples] == np.sort(confidences)[:4].astype(
        np.float32
    ).tolist()


def test_a_huge_input_is_skipped_whole_never_cut() -> None:
    box = collector(max_bytes=HARD_MAX_BYTES, below=1.0)
    at_cap = MAX_INPUT_BYTES // 4  # float32 values whose data is exactly the per-input cap
    assert box.offer(frame(0.25, (at_cap + 1,)), answer(0.1), None, 0) == "too-large"
    assert box.offer(frame(0.25, (4000, 4000)), answer(0.1), None, 0) == "too-large"
    assert box.offer(frame(0.25, (1,) * 7), answer(0.1), None, 0) == "too-large"
    assert len(box) == 0
    assert box.offer(frame(0.25, (at_cap,)), answer(0.2), None, 0) == "kept"
    message = box.flush()
    assert message is not None
    (sample,) = message.samples
    np.testing.assert_array_equal(decoded(sample), np.full((at_cap,), 0.25, np.float32))
    # Over the window's own byte cap (under the per-input one): skipped too.
    small = collector(max_bytes=1000)
    assert small.offer(frame(0.25, (300,)), answer(0.1), None, 0) == "too-large"


def test_inputs_keep_their_values_fp16_as_fp16() -> None:
    box = collector(below=1.0)
    pixels = np.arange(64, dtype=np.uint8).reshape(8, 8)
    half = np.linspace(-2, 2, 64, dtype=np.float16).reshape(1, 8, 8)
    box.offer({"image": pixels}, answer(0.1), None, 0)
    box.offer({"image": half}, answer(0.2), None, 0)
    message = box.flush()
    assert message is not None
    first, second = message.samples
    assert (first.input.name, first.input.dtype, list(first.input.shape)) == (
        "image",
        "float32",
        [8, 8],
    )
    np.testing.assert_array_equal(decoded(first), pixels.astype(np.float32))
    assert second.input.dtype == "float16" and len(second.input.data) == 2 * 64
    np.testing.assert_array_equal(decoded(second), half.astype(np.float32))


@pytest.mark.parametrize(
    ("item", "outcome"),
    [
        ({}, "no-input"),
        ({"picture": np.zeros((8, 8), np.float32)}, "no-input"),
        ({"image": [[0.0, 1.0]]}, "no-input"),
        ({"image": np.array(["a", "b"])}, "no-input"),
        ({"image": np.array([object()])}, "no-input"),
        ({"image": np.zeros((0, 8), np.float32)}, "no-input"),
        ({"image": np.array([1.0, np.nan], np.float32)}, "not-finite"),
        ({"image": np.array([1e300])}, "not-finite"),  # no float32 can hold it
    ],
)
def test_anything_but_a_finite_numeric_array_is_skipped(item: dict[str, Any], outcome: str) -> None:
    box = collector()
    assert box.offer(item, answer(0.1), None, 0) == outcome
    assert box.flush() is None


@pytest.mark.parametrize(
    "result",
    [
        {"label": "cat", "confidence": 0.1},
        {"label": True, "confidence": 0.1},
        {"label": 2000, "confidence": 0.1},
        {"label": -1, "confidence": 0.1},
        {"label": 1, "confidence": float("nan")},
        {"label": 1, "confidence": 1.5},
        {"label": 1, "confidence": True},
        {"label": 1, "confidence": "0.1"},
    ],
)
def test_results_that_cannot_be_sampled_are_an_error(result: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        collector().offer(frame(), result, None, 0)


def test_a_result_without_an_answer_is_passed_over() -> None:
    box = collector()
    assert box.offer(frame(), {"label": 1}, None, 0) == "no-answer"
    assert box.offer(frame(), "not a mapping", None, 0) == "no-answer"


def test_a_window_at_the_hard_caps_fits_one_envelope() -> None:
    box = SampleCollector("s" * 64, "v" * 64, "image", SampleSettings(64, HARD_MAX_BYTES, 1.0))
    rng = np.random.default_rng(2)
    for _ in range(400):  # ~4 KiB inputs: over the byte cap many times
        box.offer(frame(0.5, (1000,)), answer(float(rng.random())), 1023, 2**62)
    assert HARD_MAX_BYTES - 4100 < box.kept_bytes <= HARD_MAX_BYTES
    message = box.flush()
    assert message is not None
    env = make_envelope("d" * 128, msg_id="m" * 64, drift_samples=message)
    data = encode_envelope(env)  # raises over the envelope cap
    assert len(data) <= MAX_ENVELOPE_BYTES
    assert decode_envelope(data).drift_samples == message


# --- the watch over an agent's running versions ----------------------------------------


def manifest(*inputs: str) -> Manifest:
    tensors = tuple(TensorSpec(name, "float32", (-1, 8, 8)) for name in inputs)
    return Manifest(name="digits", version="1.0.0", entrypoint="d:D", inputs=tensors)


def test_the_watch_samples_only_versions_whose_deployment_opted_in(
    caplog: pytest.LogCaptureFixture,
) -> None:
    watch = SampleWatch()
    watch.attach("digits", "1.0.0", manifest("image"), {})
    watch.attach("bad", "1.0.0", manifest("image"), {**ON, "drift.samples_max": "lots"})
    watch.attach("nameless", "1.0.0", manifest(), ON)
    watch.attach("on", "2.0.0", manifest("image"), {**ON, "drift.samples_max": "3"})
    assert watch.sampling("digits", "1.0.0") is None
    assert watch.sampling("bad", "1.0.0") is None and watch.sampling("nameless", "1.0.0") is None
    assert watch.sampling("on", "2.0.0") == SampleSettings(max_count=3)
    assert "bad config" in caplog.text and "no input" in caplog.text
    for key in (("digits", "1.0.0"), ("bad", "1.0.0"), ("on", "2.0.0")):
        for _ in range(5):
            watch.observe(key, frame(), answer(0.1), 1, 0)
    (message,) = watch.flush_all()
    assert (message.skill, message.version, len(message.samples)) == ("on", "2.0.0", 3)
    assert watch.flush_all() == []


def test_a_device_owner_can_allow_none() -> None:
    watch = SampleWatch(SampleCaps(max_count=0))
    watch.attach("digits", "1.0.0", manifest("image"), ON)
    assert watch.sampling("digits", "1.0.0") is None


def test_a_stopped_versions_last_window_waits_for_the_next_flush() -> None:
    watch = SampleWatch()
    watch.attach("digits", "1.0.0", manifest("image"), ON)
    watch.observe(("digits", "1.0.0"), frame(), answer(0.1), None, 0)
    watch.detach("digits")
    watch.observe(("digits", "1.0.0"), frame(), answer(0.1), None, 0)  # not sampled now
    (message,) = watch.flush_all()
    assert len(message.samples) == 1


def test_misbehaving_results_and_inputs_are_logged_once_per_version(
    caplog: pytest.LogCaptureFixture,
) -> None:
    watch = SampleWatch()
    watch.attach("digits", "1.0.0", manifest("image"), ON)
    with caplog.at_level(logging.WARNING):
        for _ in range(5):
            watch.observe(("digits", "1.0.0"), frame(), {"label": "cat", "confidence": 0.1}, 0, 0)
            watch.observe(("digits", "1.0.0"), {"image": "text"}, answer(0.1), None, 0)
    assert caplog.text.count("cannot use") == 1
    assert caplog.text.count("skip: no-input") == 1
    assert watch.flush_all() == []
