"""Speech synthesised with espeak-ng, for the drift references of audio skills.

No Python package ships recorded speech, so a library skill whose inputs are
audio (``voice-activity``, ``keyword-spot``) names lines to speak in its
``sources.toml`` (``[reference] speak = [...]``), and the build has espeak-ng
(Debian's ``espeak-ng``, a formant synthesiser: the same text gives the same
samples) say them into one WAV stream, each line with a second of pause
before and after it, as a microphone would hear sentences apart, over a quiet
room's noise floor (seeded white noise at -60 dBFS: no microphone gives
digital silence, and a reference of exact zeros would make any real device's
level look drifted). The agent's
audio adapter reads that file back (mono, resampled to 16 kHz) as it reads any
``.wav``, so the reference is what a device would report for such a stream.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import wave
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from cloud.models.errors import FactoryError

__all__ = ["ESPEAK", "synthesise", "write_speech"]

ESPEAK = "espeak-ng"
#: How long one line may take to synthesise before the build gives up.
_TIMEOUT_S = 60.0
#: What espeak-ng writes: 16-bit mono PCM (at its own rate, 22,050 Hz).
_WIDTH = 2
#: The noise floor under the speech, in dBFS (RMS), and its seed.
NOISE_DBFS = -60.0
_NOISE_SEED = 20260


def synthesise(text: str, timeout_s: float = _TIMEOUT_S) -> tuple[bytes, int]:
    """``text`` spoken by espeak-ng: 16-bit mono little-endian PCM and its rate.

    Raises:
        FactoryError: espeak-ng is not installed, fails, times out, or writes
            something other than 16-bit mono PCM.
    """
    exe = shutil.which(ESPEAK)
    if exe is None:
        raise FactoryError(
            f"speaking the reference needs {ESPEAK}, which is not installed "
            f"(Debian: apt-get install {ESPEAK})"
        )
    with tempfile.TemporaryDirectory(prefix="edgeskill-speech-") as tmp:
        out = Path(tmp) / "line.wav"
        try:
            subprocess.run(  # a fixed program; the text is one argument after --
                [exe, "-w", str(out), "--", text],
                check=True,
                capture_output=True,
                timeout=timeout_s,
            )
            with wave.open(str(out), "rb") as wav:
                if wav.getsampwidth() != _WIDTH or wav.getnchannels() != 1:
                    raise FactoryError(f"{ESPEAK} wrote {wav.getnchannels()}-channel audio")
                return wav.readframes(wav.getnframes()), wav.getframerate()
        except subprocess.CalledProcessError as exc:
            detail = exc.stderr.decode("utf-8", "replace").strip()
            raise FactoryError(f"{ESPEAK} failed on {text!r}: {detail}") from exc
        except subprocess.TimeoutExpired as exc:
            raise FactoryError(f"{ESPEAK} took over {timeout_s:.0f} s on {text!r}") from exc
        except (OSError, EOFError, wave.Error) as exc:
            raise FactoryError(f"{ESPEAK} wrote no readable WAV for {text!r}: {exc}") from exc


def write_speech(
    lines: Sequence[str], path: Path, gap_s: float = 1.0, noise_dbfs: float = NOISE_DBFS
) -> float:
    """Speak ``lines`` into one WAV at ``path``, ``gap_s`` of pause around each.

    Args:
        lines: What to say, one utterance each.
        path: The 16-bit mono WAV to write (espeak-ng's rate).
        gap_s: Pause before, between and after the utterances.
        noise_dbfs: RMS level of the white noise added to the whole stream.

    Returns:
        The stream's length in seconds.

    Raises:
        FactoryError: As :func:`synthesise`, or ``lines`` is empty.
        OSError: ``path`` cannot be written.
    """
    if not lines:
        raise FactoryError("nothing to speak")
    spoken = [synthesise(line) for line in lines]
    rate = spoken[0][1]
    if any(r != rate for _, r in spoken):
        raise FactoryError(f"{ESPEAK} spoke at more than one sample rate")
    gap = np.zeros(round(gap_s * rate))
    parts = [gap]
    for pcm, _ in spoken:
        parts += [np.frombuffer(pcm, "<i2").astype(np.float64), gap]
    stream = np.concatenate(parts)
    noise = np.random.default_rng(_NOISE_SEED).standard_normal(stream.size)
    stream += noise * 32768.0 * 10 ** (noise_dbfs / 20)
    frames = np.clip(stream.round(), -32768, 32767).astype("<i2").tobytes()
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(_WIDTH)
        wav.setframerate(rate)
        wav.writeframes(frames)
    return stream.size / rate
