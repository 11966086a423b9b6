"""The ``voice-activity`` skill: Silero VAD on speech spoken by espeak-ng.

The truth is read off the synthesised signal itself: speech starts at the first
sample above 0.1 % of the peak and ends at the last one (the padding around it is
digital silence). The skill must find both edges within 100 ms, whatever the
chunk size the stream arrives in.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.skills.library.conftest import Harness, speak

TOLERANCE_S = 0.1
SENTENCE = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def vad(library_skill: Callable[[str], Harness]) -> Harness:
    return library_skill("voice-activity")


@pytest.fixture(scope="module")
def spoken(tmp_path_factory: pytest.TempPathFactory) -> tuple[np.ndarray, float, float]:
    pcm = speak(SENTENCE, tmp_path_factory.mktemp("vad") / "s.wav", lead_s=1.2, tail_s=1.5)
    onset, offset = _edges(pcm)
    return pcm, onset, offset


def _edges(pcm: np.ndarray) -> tuple[float, float]:
    """The first and last sample above 0.1 % of the peak, in seconds."""
    loud = np.flatnonzero(np.abs(pcm.astype(np.int32)) > 0.001 * np.abs(pcm).max())
    return loud[0] / 16000, loud[-1] / 16000


def _events(vad: Harness, pcm: np.ndarray, chunk: int) -> list[dict[str, object]]:
    skill = vad.skill()
    events: list[dict[str, object]] = []
    for start in range(0, len(pcm), chunk):
        events += skill.process({"audio": pcm[start : start + chunk]})["events"]
    return events


@pytest.mark.parametrize("chunk", [160, 1000, 16000])
def test_speech_onset_and_offset_are_found_within_100_ms(
    vad: Harness, spoken: tuple[np.ndarray, float, float], chunk: int
) -> None:
    pcm, onset, offset = spoken
    events = _events(vad, pcm, chunk)
    kinds = [e["kind"] for e in events]
    assert kinds == ["start", "end"] * (len(kinds) // 2) and kinds
    assert abs(float(events[0]["t_s"]) - onset) < TOLERANCE_S  # type: ignore[arg-type]
    assert abs(float(events[-1]["t_s"]) - offset) < TOLERANCE_S  # type: ignore[arg-type]


def test_the_pause_between_two_sentences_splits_the_speech(vad: Harness, tmp_path: Path) -> None:
    first = speak(SENTENCE, tmp_path / "a.wav", lead_s=0.5)
    second = speak("Then it rests.", tmp_path / "b.wav", lead_s=0.8, tail_s=1.0)
    events = _events(vad, np.concatenate([first, second]), 4000)
    assert [e["kind"] for e in events] == ["start", "end", "start", "end"]
    truth_end = _edges(first)[1]
    truth_start = len(first) / 16000 + _edges(second)[0]
    gap_end, gap_start = float(events[1]["t_s"]), float(events[2]["t_s"])  # type: ignore[arg-type]
    assert abs(gap_end - truth_end) < TOLERANCE_S
    assert abs(gap_start - truth_start) < TOLERANCE_S


def test_silence_and_low_noise_are_not_speech(vad: Harness) -> None:
    noise = np.random.default_rng(0).normal(0, 0.003, 3 * 16000).astype(np.float32)
    skill = vad.skill()
    for audio in (np.zeros(16000, np.int16), noise):
        result = skill.process({"audio": audio})
        assert result["events"] == [] and result["speech"] is False
        assert result["probability"] < 0.2


def test_reset_and_flush_bound_a_stream(
    vad: Harness, spoken: tuple[np.ndarray, float, float]
) -> None:
    pcm, onset, _ = spoken
    skill = vad.skill()
    half = pcm[: int((onset + 1.0) * 16000)]  # cut inside the speech
    first = skill.process({"audio": half, "flush": True})
    assert [e["kind"] for e in first["events"]] == ["start", "end"]
    assert first["events"][1]["t_s"] == pytest.approx(len(half) / 16000)
    again = skill.process({"audio": half, "reset": True})
    assert again["events"][0]["t_s"] == first["events"][0]["t_s"]  # timed from the new start
    assert again["speech"] is True and again["windows"] == len(half) // 512


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ({}, "no 'audio'"),
        ({"audio": np.zeros((2, 2), np.int16)}, "1-D"),
        ({"audio": np.full(10, 2.0)}, "within"),
        ({"audio": np.zeros(4, np.int32)}, "int16"),
    ],
)
def test_bad_audio_fails_the_item(vad: Harness, item: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        vad.skill().process(item)


def test_bad_config_fails_setup(vad: Harness) -> None:
    with pytest.raises(ValueError, match="threshold"):
        vad.skill({"threshold": "0.1"})


def test_drift_fields_say_speech_or_silence_and_the_level(
    vad: Harness, spoken: tuple[np.ndarray, float, float]
) -> None:
    pcm, onset, offset = spoken
    skill = vad.skill()
    lead = skill.process({"audio": pcm[: int(onset * 16000) - 1600], "reset": True})
    assert lead["label"] == "silence" and lead["confidence"] > 0.5
    assert lead["summaries"] == {"level_db": -100.0}  # espeak-ng's padding is exact zeros
    middle = (onset + offset) / 2
    said = skill.process({"audio": pcm[int(onset * 16000) - 1600 : int(middle * 16000)]})
    assert said["label"] == "speech" and said["confidence"] >= 0.5
    assert -40.0 < said["summaries"]["level_db"] < -3.0
    tone = np.sin(np.arange(16000) * 2 * np.pi * 440 / 16000).astype(np.float32) * 0.5
    level = skill.process({"audio": tone, "reset": True})["summaries"]["level_db"]
    assert level == pytest.approx(20 * np.log10(0.5 / np.sqrt(2)), abs=0.01)  # a sine's RMS
