"""Control code of the built-in ``keyword-spot`` skill: audio in, wake-word detections out.

The model is microWakeWord's streaming "okay nabu" detector (TFLite, int8). Its
front end is TensorFlow Lite Micro's audio front end (30 ms windows every 10 ms,
40 mel channels with noise reduction and gain control), from the
``pymicro-features`` package, which must be installed on the device. Every
three feature frames make one model call (``[1, 3, 40]``; the runtime quantises
it); the model keeps its own streaming state between calls inside the
interpreter, so one skill process serves one stream. Like microWakeWord, this
skill averages the last ``window`` probabilities and reports a detection when
the mean passes ``cutoff``, then ignores ``refractory_ms`` of audio so one
utterance is one detection.

Items carry ``audio``: 16 kHz mono samples, int16 (or float in [-1, 1]), of any
length. Results carry ``detections`` (``{"t_s": seconds from the stream's start
at the end of the detecting window, "probability": the mean}``), ``probability``
(the largest mean in the chunk) and ``frames`` (feature frames made), plus the
drift fields: ``label`` (``wake`` when the chunk had a detection, else ``none``),
``confidence`` (the best detection's mean, or one minus the chunk's largest mean)
and ``summaries.level_db`` (the chunk's RMS level in dBFS).
Config: ``cutoff``, ``window`` (the model's ``okay_nabu.json`` gives both),
``refractory_ms`` (1000).
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np

from skills.audio import level_dbfs
from skills.sdk import Model, Skill, SkillContext

__all__ = ["KeywordSpotSkill"]

_MODEL = "wakeword"
_SETTINGS = "okay_nabu.json"
RATE = 16000
STEP = 160  # samples per feature frame (10 ms)
_MAX_CHUNK = 60 * RATE


def _pcm(audio: object) -> bytes:
    """``audio`` as 16-bit little-endian PCM bytes.

    Raises:
        ValueError: Not 1-D int16 or float samples in [-1, 1], or too long.
    """
    array = np.asarray(audio)
    if array.ndim != 1 or array.size > _MAX_CHUNK:
        raise ValueError(f"audio must be 1-D with at most {_MAX_CHUNK} samples, got {array.shape}")
    if array.dtype.kind == "f":
        if array.size and (not np.isfinite(array).all() or np.abs(array).max() > 1.0):
            raise ValueError("float audio must be finite and within [-1, 1]")
        array = np.round(array * 32767).astype(np.int16)
    if array.dtype != np.int16:
        raise ValueError(f"audio must be int16 or float samples, got {array.dtype}")
    return array.astype("<i2").tobytes()


class KeywordSpotSkill(Skill):
    """Spots the wake word in one audio stream fed in chunks."""

    def __init__(self) -> None:
        self._model: Model | None = None
        self._frontend: Any = None
        self._cutoff = 0.85
        self._refractory = RATE
        self._pending = b""
        self._frames: list[np.ndarray] = []
        self._probabilities: deque[float] = deque(maxlen=5)
        self._samples = 0
        self._quiet_until = 0

    def setup(self, ctx: SkillContext) -> None:
        """Load the model, its settings and the feature front end.

        Raises:
            ValueError: A setting is out of range, or the settings file is unreadable.
            ImportError: ``pymicro-features`` is not installed on this device.
        """
        try:
            settings = json.loads((ctx.skill_dir / "control" / _SETTINGS).read_text("utf-8"))
            micro = settings["micro"]
            cutoff = float(ctx.config.get("cutoff") or micro["probability_cutoff"])
            window = int(ctx.config.get("window") or micro["sliding_window_size"])
        except (OSError, KeyError, TypeError, json.JSONDecodeError) as exc:
            raise ValueError(f"cannot read the wake word's settings {_SETTINGS}: {exc}") from exc
        refractory = float(ctx.config.get("refractory_ms") or 1000)
        if not 0.0 < cutoff < 1.0 or not 1 <= window <= 100 or not 0 <= refractory <= 60_000:
            raise ValueError(
                f"bad settings: cutoff {cutoff}, window {window}, refractory {refractory}"
            )
        from pymicro_features import MicroFrontend  # noqa: PLC0415 - a native front end

        self._frontend = MicroFrontend()
        self._cutoff, self._refractory = cutoff, round(refractory * RATE / 1000)
        self._probabilities = deque(maxlen=window)
        self._model = ctx.model(_MODEL)
        ctx.logger.info("keyword-spot ready: %s, cutoff %.2f", settings.get("wake_word"), cutoff)

    def _features(self, pcm: bytes) -> list[tuple[np.ndarray, int]]:
        """Feed the front end whole 10 ms steps; the frames it made, with their end sample."""
        buffered = self._pending + pcm
        frames, used = [], 0
        while used + 2 * STEP <= len(buffered):
            out = self._frontend.process_samples(buffered[used : used + 2 * STEP])
            used += 2 * out.samples_read
            self._samples += out.samples_read
            if out.features:
                frames.append((np.asarray(out.features, np.float32), self._samples))
        self._pending = buffered[used:]
        return frames

    def _step(self, model: Model) -> float | None:
        """Run the model on three frames; the windowed mean once the window is full."""
        batch = np.stack(self._frames)[None]
        self._frames.clear()
        out = model.run({model.input_names[0]: batch})
        self._probabilities.append(float(np.asarray(next(iter(out.values()))).reshape(-1)[0]))
        if len(self._probabilities) < (self._probabilities.maxlen or 1):
            return None
        return float(np.mean(self._probabilities))

    def process(self, item: Mapping[str, Any]) -> Mapping[str, Any]:
        """Feed ``item["audio"]`` to the stream.

        Raises:
            ValueError: No audio, or malformed audio.
            RuntimeError: ``setup`` has not run.
        """
        if self._model is None:
            raise RuntimeError("process() before setup()")
        if "audio" not in item:
            raise ValueError("item has no 'audio'")
        pcm = _pcm(item["audio"])
        frames = self._features(pcm)
        detections, peak = [], 0.0
        for frame, end in frames:
            self._frames.append(frame)
            if len(self._frames) < 3:
                continue
            mean = self._step(self._model)
            if mean is None:
                continue
            peak = max(peak, mean)
            if mean > self._cutoff and end >= self._quiet_until:
                detections.append({"t_s": end / RATE, "probability": mean})
                self._quiet_until = end + self._refractory
                self._probabilities.clear()
        best = max((d["probability"] for d in detections), default=None)
        samples = np.frombuffer(pcm, "<i2").astype(np.float32) / 32768.0
        return {
            "detections": detections,
            "probability": peak,
            "frames": len(frames),
            "label": "none" if best is None else "wake",
            "confidence": 1.0 - peak if best is None else best,
            "summaries": {"level_db": level_dbfs(samples)},
        }
