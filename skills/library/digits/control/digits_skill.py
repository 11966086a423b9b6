"""Control code of the built-in ``digits`` skill: one 8x8 digit in, a label out.

Items carry ``image``: an array or nested list of 64 values, shaped ``[8, 8]`` or
``[64]`` (any shape of 64 values is accepted). Raw scikit-learn digits range over
0..16; with ``"scaled": true`` the values are already in [0, 1].
The model (``classifier``) takes ``image`` float32 ``[N, 1, 8, 8]`` in [0, 1] and
returns ``logits`` ``[N, 10]``.

Each result also carries the image's input summary for drift detection,
``summaries = {"brightness": mean pixel value in [0, 1]}``: the one the hub's
drift reference holds (``cloud.models.references``) when the bundle ships one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from skills.sdk import Model, Skill, SkillContext

__all__ = ["DigitsSkill"]

_PIXELS = 64
_RAW_MAX = 16.0
_MODEL = "classifier"


def _image_batch(item: Mapping[str, Any]) -> np.ndarray:
    """The item's image as float32 ``[1, 1, 8, 8]`` in [0, 1].

    Raises:
        ValueError: The image is missing, not 64 finite numbers, or out of range.
    """
    if "image" not in item:
        raise ValueError("item has no 'image'")
    try:
        pixels = np.asarray(item["image"], dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"image is not numeric: {exc}") from exc
    if pixels.size != _PIXELS:
        raise ValueError(f"image has {pixels.size} values, expected {_PIXELS} (8x8)")
    if not np.isfinite(pixels).all():
        raise ValueError("image has NaN or infinite values")
    top = 1.0 if item.get("scaled") is True else _RAW_MAX
    if pixels.min() < 0.0 or pixels.max() > top:
        raise ValueError(f"image values must lie in [0, {top:g}]")
    return (pixels / top).reshape(1, 1, 8, 8)


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max())
    return shifted / shifted.sum()


class DigitsSkill(Skill):
    """Classifies one digit per item; emits ``low_confidence`` below ``min_confidence``."""

    def __init__(self) -> None:
        self._ctx: SkillContext | None = None
        self._model: Model | None = None
        self._min_confidence: float | None = None

    def setup(self, ctx: SkillContext) -> None:
        """Load the classifier and read ``min_confidence``.

        Raises:
            ValueError: ``min_confidence`` is not a number in [0, 1].
        """
        raw = ctx.config.get("min_confidence", "").strip()
        if raw:
            value = float(raw)
            if not 0.0 <= value <= 1.0 or math.isnan(value):
                raise ValueError(f"min_confidence must be in [0, 1], got {raw!r}")
            self._min_confidence = value
        self._model = ctx.model(_MODEL)
        self._ctx = ctx
        ctx.logger.info("digits ready on %s (%s)", self._model.backend, self._model.target)

    def process(self, item: Mapping[str, Any]) -> Mapping[str, Any]:
        """Classify ``item["image"]``.

        Returns:
            ``{"label": int, "confidence": float, "summaries": {"brightness": float}}``.

        Raises:
            ValueError: The image is malformed.
            RuntimeError: ``setup`` has not run.
        """
        if self._model is None or self._ctx is None:
            raise RuntimeError("process() before setup()")
        batch = _image_batch(item)
        logits = self._model.run({"image": batch})["logits"]
        probabilities = _softmax(np.asarray(logits, dtype=np.float64).reshape(-1))
        label = int(probabilities.argmax())
        confidence = float(probabilities[label])
        if self._min_confidence is not None and confidence < self._min_confidence:
            self._ctx.emit(
                {
                    "kind": "low_confidence",
                    "label": label,
                    "confidence": confidence,
                    "min_confidence": self._min_confidence,
                }
            )
        summaries = {"brightness": float(batch.mean())}
        return {"label": label, "confidence": confidence, "summaries": summaries}
