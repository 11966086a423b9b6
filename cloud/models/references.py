"""Drift references of the factory's classifiers, for the bundles built from them.

A reference (:mod:`skills.drift_reference`) is what a device compares a skill
version's live answers with. The factory builds it from the model's own answers
on the held-out part of its data set (the validation and test splits, which
training never saw): the predicted-class mix, the histogram of the top-class
confidence, and one input summary, :data:`BRIGHTNESS` (the mean pixel value of
each image as the model sees it, scaled to [0, 1]), which the built-in digits
skill reports per item. The model is run in ONNX Runtime, as devices run it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from cloud.models.errors import FactoryError
from skills.drift_reference import DriftReference, build_reference

if TYPE_CHECKING:
    from converters.digits import DigitsData

__all__ = ["BRIGHTNESS", "classifier_reference", "held_out_reference"]

#: The input summary a factory reference holds: an image's mean pixel value.
BRIGHTNESS = "brightness"


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def classifier_reference(onnx_path: Path, x: np.ndarray) -> DriftReference:
    """The reference of an ONNX classifier (one input, logits out) on images ``x``.

    Args:
        onnx_path: The model.
        x: float32 images ``[N, C, H, W]`` scaled to [0, 1], ``N >= 1``.

    Returns:
        Its predicted classes (as ``str`` of the class index), top-class
        confidences and the images' :data:`BRIGHTNESS`.

    Raises:
        FactoryError: The model does not load or run, its output is not ``[N, classes]``
            logits, or there are no images.
    """
    from converters.errors import ConversionError  # noqa: PLC0415 - torch
    from converters.onnx_export import ort_session, run_onnx  # noqa: PLC0415

    if x.ndim != 4 or len(x) == 0:
        raise FactoryError(f"a drift reference needs images [N, C, H, W], got {x.shape}")
    try:
        logits = run_onnx(ort_session(onnx_path), x)
    except ConversionError as exc:
        raise FactoryError(f"cannot run the model for its drift reference: {exc}") from exc
    if logits.shape[0] != len(x) or logits.ndim != 2:
        raise FactoryError(f"the model answers {logits.shape}, not [N, classes] logits")
    probabilities = _softmax(np.asarray(logits, dtype=np.float64))
    brightness = x.reshape(len(x), -1).astype(np.float64).mean(axis=1)
    try:
        return build_reference(
            probabilities.argmax(axis=1), probabilities.max(axis=1), {BRIGHTNESS: brightness}
        )
    except ValueError as exc:  # NaN logits, or more classes than a reference may hold
        raise FactoryError(f"cannot build a drift reference: {exc}") from exc


def held_out_reference(onnx_path: Path, data: DigitsData) -> DriftReference:
    """The reference of a classifier on its data set's validation and test splits.

    Raises:
        FactoryError: As :func:`classifier_reference`.
    """
    return classifier_reference(onnx_path, np.concatenate([data.val.x, data.test.x]))
