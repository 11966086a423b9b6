"""Control code of the built-in ``face-detect`` skill: a photo in, face boxes out.

The model is MediaPipe's BlazeFace short-range detector: a ``[1, 128, 128, 3]``
float input in [-1, 1] and, for each of 896 fixed anchors, 16 regressors (box
centre offset and size, then six key points) and one logit. Everything around
it is here, in numpy: letterboxing the photo to a square, the SSD anchors
MediaPipe generates for this model, decoding the regressors against them, and
MediaPipe's weighted non-maximum suppression (overlapping detections are
averaged, weighted by score, rather than dropped).

Items carry ``image``: an ``[H, W, 3]`` (or ``[H, W]`` grey) uint8 photo. Results
carry ``faces``, each with ``box`` ``[x0, y0, x1, y1]`` in pixels of the photo,
``score`` and six ``keypoints`` (right eye, left eye, nose tip, mouth, right and
left ear tragion), plus the drift fields ``label`` (``face`` or ``none``),
``confidence`` (the best score, or one minus the best anchor's score without a
face) and ``summaries.brightness``.

Config: ``min_score`` (default 0.5), ``iou`` (suppression overlap, 0.3),
``max_faces`` (100). Numpy, the standard library and the Skill SDK only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from skills.imaging import resize
from skills.sdk import Model, Skill, SkillContext

__all__ = ["FaceDetectSkill", "anchors", "decode", "letterbox", "weighted_nms"]

_MODEL = "detector"
_SIZE = 128
_MAX_SIDE = 8192
# MediaPipe's SsdAnchorsCalculator options for face_detection_short_range.
_STRIDES = (8, 16, 16, 16)
_MIN_SCALE, _MAX_SCALE = 0.1484375, 0.75
_KEYPOINTS = 6
_LOGIT_CLIP = 100.0


def anchors() -> np.ndarray:
    """The model's 896 anchor centres ``[N, 2]`` (x, y) in [0, 1], in output order.

    Layers sharing a stride share one grid: each of its cells gets two anchors per
    layer (aspect ratio 1 and the interpolated scale); with fixed anchor sizes only
    the centres matter.
    """
    centres: list[np.ndarray] = []
    layer = 0
    while layer < len(_STRIDES):
        stride = _STRIDES[layer]
        same = sum(1 for s in _STRIDES[layer:] if s == stride)
        cells = _SIZE // stride
        ys, xs = np.meshgrid(np.arange(cells), np.arange(cells), indexing="ij")
        grid = np.stack([(xs + 0.5) / cells, (ys + 0.5) / cells], axis=-1).reshape(-1, 1, 2)
        centres.append(np.repeat(grid, 2 * same, axis=1).reshape(-1, 2))
        layer += same
    return np.concatenate(centres).astype(np.float32)


_ANCHORS = anchors()


def letterbox(image: np.ndarray) -> tuple[np.ndarray, float, float, float]:
    """The photo padded to a centred square and resized to the model's input.

    Returns:
        The ``[1, 128, 128, 3]`` input in [-1, 1], the square's side in pixels and the
        padding added on the left and at the top (to map boxes back).

    Raises:
        ValueError: Not an ``[H, W, 3]`` or ``[H, W]`` uint8 photo of a sane size.
    """
    photo = np.asarray(image)
    if photo.ndim == 2:
        photo = np.repeat(photo[..., None], 3, axis=2)
    if photo.dtype != np.uint8 or photo.ndim != 3 or photo.shape[2] != 3:
        raise ValueError(f"expected an [H, W, 3] uint8 photo, got {photo.dtype} {photo.shape}")
    height, width = photo.shape[:2]
    if min(height, width) < 1 or max(height, width) > _MAX_SIDE:
        raise ValueError(f"photo size {height}x{width} is outside 1..{_MAX_SIDE}")
    side = max(height, width)
    top, left = (side - height) // 2, (side - width) // 2
    square = np.zeros((side, side, 3), np.uint8)
    square[top : top + height, left : left + width] = photo
    pixels = resize(square, _SIZE, _SIZE) / 127.5 - 1.0
    return pixels[None].astype(np.float32), float(side), float(left), float(top)


def decode(regressors: np.ndarray, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Boxes ``[N, 4]`` (x0, y0, x1, y1) and key points ``[N, 6, 2]`` in [0, 1]; scores ``[N]``.

    Raises:
        ValueError: The outputs are not ``[1, 896, 16]`` and ``[1, 896, 1]``.
    """
    raw = np.asarray(regressors, np.float32).reshape(-1, 4 + 2 * _KEYPOINTS)
    if raw.shape[0] != len(_ANCHORS) or np.asarray(logits).size != len(_ANCHORS):
        raise ValueError(f"expected {len(_ANCHORS)} anchors, got {raw.shape} and {logits.shape}")
    scaled = raw / _SIZE
    centre = scaled[:, :2] + _ANCHORS
    half = scaled[:, 2:4] / 2
    boxes = np.concatenate([centre - half, centre + half], axis=1)
    points = scaled[:, 4:].reshape(-1, _KEYPOINTS, 2) + _ANCHORS[:, None, :]
    clipped = np.clip(np.asarray(logits, np.float64).reshape(-1), -_LOGIT_CLIP, _LOGIT_CLIP)
    scores = 1.0 / (1.0 + np.exp(-clipped))
    return np.concatenate([boxes, points.reshape(-1, 2 * _KEYPOINTS)], axis=1), scores


def _iou(box: np.ndarray, others: np.ndarray) -> np.ndarray:
    low = np.maximum(box[:2], others[:, :2])
    high = np.minimum(box[2:4], others[:, 2:4])
    inter = np.prod(np.clip(high - low, 0.0, None), axis=1)
    area = np.prod(box[2:4] - box[:2])
    areas = np.prod(others[:, 2:4] - others[:, :2], axis=1)
    return inter / np.maximum(area + areas - inter, 1e-12)


def weighted_nms(
    detections: np.ndarray, scores: np.ndarray, iou: float, limit: int
) -> list[tuple[np.ndarray, float]]:
    """MediaPipe's weighted suppression: each cluster's score-weighted mean, best first.

    Args:
        detections: ``[N, 4 + 12]`` boxes and key points.
        scores: ``[N]`` scores, already above the threshold.
        iou: The overlap above which a detection joins the best remaining one's cluster.
        limit: The most detections to return.
    """
    order = np.argsort(-scores, kind="stable")
    remaining = detections[order]
    weights = scores[order]
    kept: list[tuple[np.ndarray, float]] = []
    while len(remaining) and len(kept) < limit:
        cluster = _iou(remaining[0], remaining) > iou
        cluster[0] = True
        w = weights[cluster]
        merged = (remaining[cluster] * w[:, None]).sum(axis=0) / w.sum()
        kept.append((merged, float(weights[0])))
        remaining, weights = remaining[~cluster], weights[~cluster]
    return kept


def _float_config(config: Mapping[str, str], key: str, default: float) -> float:
    raw = config.get(key, "").strip()
    value = float(raw) if raw else default
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{key} must be in [0, 1], got {raw!r}")
    return value


class FaceDetectSkill(Skill):
    """Finds the faces in one photo per item."""

    def __init__(self) -> None:
        self._model: Model | None = None
        self._min_score = 0.5
        self._iou = 0.3
        self._max_faces = 100

    def setup(self, ctx: SkillContext) -> None:
        """Load the detector and read the configuration.

        Raises:
            ValueError: ``min_score`` or ``iou`` is not in [0, 1], or ``max_faces`` < 1.
        """
        self._min_score = _float_config(ctx.config, "min_score", 0.5)
        self._iou = _float_config(ctx.config, "iou", 0.3)
        self._max_faces = int(ctx.config.get("max_faces", "100"))
        if self._max_faces < 1:
            raise ValueError(f"max_faces must be at least 1, got {self._max_faces}")
        self._model = ctx.model(_MODEL)
        ctx.logger.info("face-detect ready on %s (%s)", self._model.backend, self._model.target)

    def process(self, item: Mapping[str, Any]) -> Mapping[str, Any]:
        """Detect the faces in ``item["image"]``.

        Raises:
            ValueError: No image, or a malformed one.
            RuntimeError: ``setup`` has not run.
        """
        if self._model is None:
            raise RuntimeError("process() before setup()")
        if "image" not in item:
            raise ValueError("item has no 'image'")
        pixels, side, left, top = letterbox(item["image"])
        outputs = self._model.run({self._model.input_names[0]: pixels})
        detections, scores = decode(outputs["regressors"], outputs["classificators"])
        keep = scores >= self._min_score
        found = weighted_nms(detections[keep], scores[keep], self._iou, self._max_faces)
        offset = np.array([left, top], np.float32)
        faces = []
        for merged, score in found:
            corners = merged[:4].reshape(2, 2) * side - offset
            points = merged[4:].reshape(_KEYPOINTS, 2) * side - offset
            faces.append(
                {
                    "box": corners.reshape(-1).round(1).tolist(),
                    "score": score,
                    "keypoints": points.round(1).tolist(),
                }
            )
        best = float(scores.max())
        return {
            "faces": faces,
            "label": "face" if faces else "none",
            "confidence": best if faces else 1.0 - best,
            "summaries": {"brightness": float(np.asarray(item["image"]).mean() / 255.0)},
        }
