"""Control code of the built-in ``voice-activity`` skill: audio in, speech segments out.

The model is Silero VAD v6: each call takes 512 new samples at 16 kHz behind the
64 samples before them (``input`` ``[1, 576]``), the recurrent ``state``
``[2, 1, 128]`` the previous call returned, and ``sr``; it returns the speech
probability of those 32 ms and the next state. This skill keeps the state, the
context and the unfinished window between items, so a stream can arrive in
chunks of any length, and turns the probabilities into segments the way
Silero's ``VADIterator`` does: speech starts at the first window at or above
``threshold``, and ends once the probability has stayed below ``threshold -
0.15`` for ``min_silence_ms``; both edges are widened by ``speech_pad_ms``.

Items carry ``audio``: 16 kHz mono samples, int16 or float in [-1, 1], of any
length (an empty chunk is fine). ``"reset": true`` starts a new stream first and
``"flush": true`` ends an open segment at the end of the chunk. Results carry
``events`` (``{"kind": "start" | "end", "t_s": seconds from the stream start}``),
``speech`` (whether speech is open after the chunk), ``probability`` (of the
chunk's last window) and ``windows`` (how many ran), plus the drift fields:
``label`` (``speech`` when a window of the chunk reached ``threshold``, else
``silence``), ``confidence`` (that peak probability, or one minus it for
silence) and ``summaries.level_db`` (the chunk's RMS level in dBFS).

Numpy, the standard library and the Skill SDK only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from skills.audio import level_dbfs
from skills.sdk import Model, Skill, SkillContext

__all__ = ["VadStream", "VoiceActivitySkill"]

_MODEL = "vad"
RATE = 16000
WINDOW = 512
CONTEXT = 64
_HYSTERESIS = 0.15
_MAX_CHUNK = 60 * RATE  # a minute per item


def _samples(audio: object) -> np.ndarray:
    """``audio`` as float32 samples in [-1, 1].

    Raises:
        ValueError: Not a 1-D numeric array, too long, or out of range.
    """
    array = np.asarray(audio)
    if array.ndim != 1 or array.size > _MAX_CHUNK:
        raise ValueError(f"audio must be 1-D with at most {_MAX_CHUNK} samples, got {array.shape}")
    if array.dtype == np.int16:
        return array.astype(np.float32) / 32768.0
    if array.dtype.kind != "f":
        raise ValueError(f"audio must be int16 or float samples, got {array.dtype}")
    samples = array.astype(np.float32)
    if samples.size and (not np.isfinite(samples).all() or np.abs(samples).max() > 1.0):
        raise ValueError("float audio must be finite and within [-1, 1]")
    return samples


class VadStream:
    """One audio stream's model state and segment tracker.

    Args:
        model: The loaded Silero model.
        threshold: Speech probability that opens a segment.
        min_silence: Samples of silence that close one.
        pad: Samples each segment is widened by.
    """

    def __init__(self, model: Model, threshold: float, min_silence: int, pad: int) -> None:
        self._model = model
        self._threshold = threshold
        self._min_silence = min_silence
        self._pad = pad
        self.reset()

    def reset(self) -> None:
        """Forget everything: a new stream starts."""
        self._state = np.zeros((2, 1, 128), np.float32)
        self._context = np.zeros(CONTEXT, np.float32)
        self._pending = np.zeros(0, np.float32)
        self._sample = 0  # samples consumed by the model so far
        self._triggered = False
        self._silence_from = 0
        self.probability = 0.0

    @property
    def speech(self) -> bool:
        """Whether a segment is open."""
        return self._triggered

    def _window(self, window: np.ndarray) -> float:
        feeds = {
            "input": np.concatenate([self._context, window])[None],
            "state": self._state,
            "sr": np.array(RATE, np.int64),
        }
        out = self._model.run(feeds)
        self._state = np.asarray(out["stateN"], np.float32)
        self._context = window[-CONTEXT:]
        return float(np.asarray(out["output"]).reshape(-1)[0])

    def _track(self, probability: float) -> dict[str, Any] | None:
        """VADIterator's rule for one window ending at ``self._sample``."""
        if probability >= self._threshold:
            self._silence_from = 0
            if not self._triggered:
                self._triggered = True
                start = max(0, self._sample - self._pad - WINDOW)
                return {"kind": "start", "t_s": start / RATE}
        elif self._triggered and probability < self._threshold - _HYSTERESIS:
            if not self._silence_from:
                self._silence_from = self._sample
            if self._sample - self._silence_from >= self._min_silence:
                end = self._silence_from + self._pad - WINDOW
                self._triggered, self._silence_from = False, 0
                return {"kind": "end", "t_s": end / RATE}
        return None

    def feed(self, samples: np.ndarray) -> tuple[list[dict[str, Any]], int, float]:
        """Run every whole window in ``samples`` (after what was left over).

        Returns:
            The events, how many windows ran, and their highest speech probability.
        """
        buffered = np.concatenate([self._pending, samples])
        whole = len(buffered) // WINDOW * WINDOW
        events, peak = [], 0.0
        for start in range(0, whole, WINDOW):
            self.probability = self._window(buffered[start : start + WINDOW])
            peak = max(peak, self.probability)
            self._sample += WINDOW
            event = self._track(self.probability)
            if event is not None:
                events.append(event)
        self._pending = buffered[whole:]
        return events, whole // WINDOW, peak

    def flush(self) -> dict[str, Any] | None:
        """Close an open segment at the end of what was fed."""
        if not self._triggered:
            return None
        self._triggered, self._silence_from = False, 0
        return {"kind": "end", "t_s": (self._sample + len(self._pending)) / RATE}


def _config(config: Mapping[str, str], key: str, default: float, high: float) -> float:
    raw = config.get(key, "").strip()
    value = float(raw) if raw else default
    if not 0.0 <= value <= high:
        raise ValueError(f"{key} must be in [0, {high:g}], got {raw!r}")
    return value


class VoiceActivitySkill(Skill):
    """Tracks speech in one audio stream fed in chunks."""

    def __init__(self) -> None:
        self._stream: VadStream | None = None
        self._threshold = 0.5

    def setup(self, ctx: SkillContext) -> None:
        """Load the model and read the configuration.

        Raises:
            ValueError: ``threshold`` is not in [0.15, 1], or a duration is out of range.
        """
        threshold = _config(ctx.config, "threshold", 0.5, 1.0)
        if threshold < _HYSTERESIS:
            raise ValueError(f"threshold must be at least {_HYSTERESIS}, got {threshold}")
        silence = _config(ctx.config, "min_silence_ms", 100.0, 10_000.0)
        pad = _config(ctx.config, "speech_pad_ms", 30.0, 1000.0)
        model = ctx.model(_MODEL)
        ms = RATE // 1000
        self._stream = VadStream(model, threshold, round(silence * ms), round(pad * ms))
        self._threshold = threshold
        ctx.logger.info("voice-activity ready on %s (%s)", model.backend, model.target)

    def process(self, item: Mapping[str, Any]) -> Mapping[str, Any]:
        """Feed ``item["audio"]`` to the stream.

        Raises:
            ValueError: No audio, or malformed audio.
            RuntimeError: ``setup`` has not run.
        """
        if self._stream is None:
            raise RuntimeError("process() before setup()")
        if "audio" not in item:
            raise ValueError("item has no 'audio'")
        samples = _samples(item["audio"])
        if item.get("reset") is True:
            self._stream.reset()
        events, windows, peak = self._stream.feed(samples)
        if item.get("flush") is True and (closing := self._stream.flush()) is not None:
            events.append(closing)
        heard = peak >= self._threshold
        return {
            "events": events,
            "speech": self._stream.speech,
            "probability": self._stream.probability,
            "windows": windows,
            "label": "speech" if heard else "silence",
            "confidence": peak if heard else 1.0 - peak,
            "summaries": {"level_db": level_dbfs(samples)},
        }
