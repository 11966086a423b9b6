"""Speech for the audio skills' drift references: espeak-ng's lines in one stream."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest

from cloud.models.errors import FactoryError
from cloud.models.speech import NOISE_DBFS, synthesise, write_speech


def _read(path: Path) -> tuple[np.ndarray, int]:
    with wave.open(str(path), "rb") as wav:
        assert (wav.getnchannels(), wav.getsampwidth()) == (1, 2)
        return np.frombuffer(wav.readframes(wav.getnframes()), "<i2"), wav.getframerate()


def _dbfs(samples: np.ndarray) -> float:
    return 20 * float(np.log10(np.sqrt(np.mean((samples / 32768.0) ** 2))))


def test_lines_are_spoken_apart_over_a_quiet_noise_floor(tmp_path: Path) -> None:
    lines = ["Good morning.", "Please close the window."]
    seconds = write_speech(lines, tmp_path / "s.wav", gap_s=1.0)
    pcm, rate = _read(tmp_path / "s.wav")
    spoken = [len(synthesise(line)[0]) // 2 for line in lines]
    assert len(pcm) == sum(spoken) + 3 * rate and seconds == pytest.approx(len(pcm) / rate)
    lead, middle = pcm[:rate], pcm[rate + spoken[0] : 2 * rate + spoken[0]]
    for pause in (lead, middle):  # the pauses hold the noise floor, not digital silence
        assert _dbfs(pause) == pytest.approx(NOISE_DBFS, abs=0.5)
    assert _dbfs(pcm[rate : rate + spoken[0]]) > NOISE_DBFS + 30  # the speech itself


def test_the_same_lines_give_the_same_stream(tmp_path: Path) -> None:
    write_speech(["Okay nabu"], tmp_path / "a.wav")
    write_speech(["Okay nabu"], tmp_path / "b.wav")
    assert (tmp_path / "a.wav").read_bytes() == (tmp_path / "b.wav").read_bytes()


def test_without_espeak_ng_the_build_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH where espeak-ng is not
    with pytest.raises(FactoryError, match="apt-get install espeak-ng"):
        write_speech(["hello"], tmp_path / "s.wav")
    assert not (tmp_path / "s.wav").exists()
    with pytest.raises(FactoryError, match="nothing to speak"):
        write_speech([], tmp_path / "s.wav")
