"""Control code of the built-in ``imagenet`` skill: a photo in, an ImageNet class out.

Items carry ``image``, either a photo (``[H, W, 3]`` uint8 RGB or ``[H, W]``
grey, any size of at least 1x1) or an input already preprocessed (float32 ``[1, 3, 224, 224]`` or
``[3, 224, 224]``, pixels mapped with ``(x - 127) / 128``). A photo is
preprocessed here as the hub's :func:`converters.efficientnet.preprocess` does:
shorter side resized to 256 with an antialiased bilinear filter (PIL's, rounded
like it to 8 bits), the centre 224x224 cropped, pixels mapped to about [-1, 1].

The model (``classifier``, EfficientNet-Lite0) is declared for split inference,
so it runs through ``ctx.infer``: the agent picks the cut from the link it
measures, and the result says where the work ran. The class names come from
``imagenet_labels.txt`` next to this file, which the hub writes at build time.
Results carry the drift fields: ``label`` and ``confidence`` (the top class and
its probability) and ``summaries.brightness`` (the mean pixel of the 224x224
centre crop the model sees, in [0, 1]).

This runs on the device: numpy, the standard library and the Skill SDK only.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from skills.sdk import InferResult, Skill, SkillContext

__all__ = ["ImagenetSkill", "preprocess", "resize_bilinear"]

_MODEL = "classifier"
_INPUT = "image"
_OUTPUT = "logits"
_SIZE = 224
_RESIZE_TO = 256
_MEAN = 127.0
_STD = 128.0
_CLASSES = 1000
_MAX_SIDE = 8192
LABELS_FILE = "imagenet_labels.txt"


def _weights(size_in: int, size_out: int) -> np.ndarray:
    """PIL's antialiased bilinear (triangle) filter as a ``[size_out, size_in]`` matrix."""
    scale = size_in / size_out
    stretch = max(scale, 1.0)
    centres = (np.arange(size_out) + 0.5) * scale
    pixels = np.arange(size_in) + 0.5
    distance = (pixels[None, :] - centres[:, None]) / stretch
    weights = np.clip(1.0 - np.abs(distance), 0.0, None)
    return weights / weights.sum(axis=1, keepdims=True)


def resize_bilinear(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Resize ``[H, W, C]`` uint8 to ``[height, width, C]`` uint8, antialiased bilinear.

    Raises:
        ValueError: ``image`` is not ``[H, W, C]`` or a size is not positive.
    """
    if image.ndim != 3 or min(image.shape[:2]) < 1 or height < 1 or width < 1:
        raise ValueError(f"cannot resize {image.shape} to {height}x{width}")
    rows = _weights(image.shape[0], height)
    cols = _weights(image.shape[1], width)
    pixels = image.astype(np.float64)
    out = np.einsum("oh,hwc->owc", rows, pixels)
    out = np.einsum("pw,owc->opc", cols, out)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def preprocess(image: np.ndarray) -> np.ndarray:
    """A photo as the model's input: ``[1, 3, 224, 224]`` float32.

    Raises:
        ValueError: ``image`` is not an ``[H, W, 3]`` or ``[H, W]`` (grey) uint8 photo
            of a sane size.
    """
    if image.ndim == 2:  # a grey photo: the same value in each channel
        image = np.repeat(image[..., None], 3, axis=2)
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise ValueError(f"expected an [H, W, 3] uint8 photo, got {image.dtype} {image.shape}")
    height, width = image.shape[:2]
    if min(height, width) < 1 or max(height, width) > _MAX_SIDE:
        raise ValueError(f"photo size {height}x{width} is outside 1..{_MAX_SIDE}")
    scale = _RESIZE_TO / min(height, width)
    new_h = max(_SIZE, round(height * scale))
    new_w = max(_SIZE, round(width * scale))
    resized = resize_bilinear(image, new_h, new_w)
    top, left = (new_h - _SIZE) // 2, (new_w - _SIZE) // 2
    crop = resized[top : top + _SIZE, left : left + _SIZE].astype(np.float32)
    chw = ((crop - _MEAN) / _STD).transpose(2, 0, 1)
    return np.ascontiguousarray(chw[None], dtype=np.float32)


def model_input(item: Mapping[str, Any]) -> np.ndarray:
    """The item's ``image`` as the model's input.

    Raises:
        ValueError: No image, or one that is neither a photo nor a preprocessed input.
    """
    if "image" not in item:
        raise ValueError("item has no 'image'")
    image = np.asarray(item["image"])
    if image.dtype == np.uint8:
        return preprocess(image)
    if image.dtype != np.float32 or image.size != 3 * _SIZE * _SIZE:
        raise ValueError(
            f"expected an [H, W, 3] uint8 photo or a float32 [1, 3, {_SIZE}, {_SIZE}] input, "
            f"got {image.dtype} {image.shape}"
        )
    if image.shape not in ((1, 3, _SIZE, _SIZE), (3, _SIZE, _SIZE)):
        raise ValueError(f"a preprocessed input is [1, 3, {_SIZE}, {_SIZE}], got {image.shape}")
    if not np.isfinite(image).all():
        raise ValueError("image has NaN or infinite values")
    return np.ascontiguousarray(image.reshape(1, 3, _SIZE, _SIZE))


def read_labels(path: Path) -> list[str]:
    """The class names in ``path``, one a line; numbered names when it is missing or short."""
    try:
        names = path.read_text(encoding="utf-8").splitlines()[:_CLASSES]
    except OSError:
        names = []
    return names + [f"class {i}" for i in range(len(names), _CLASSES)]


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max())
    return shifted / shifted.sum()


class ImagenetSkill(Skill):
    """Classifies one photo per item, wherever the agent plans the model to run."""

    def __init__(self) -> None:
        self._ctx: SkillContext | None = None
        self._labels: list[str] = []
        self._log_results = False
        self._items = 0

    def setup(self, ctx: SkillContext) -> None:
        """Read the class names and the configuration.

        Raises:
            ValueError: ``log_results`` is neither ``true`` nor ``false``.
        """
        flag = ctx.config.get("log_results", "false").strip().lower()
        if flag not in ("true", "false"):
            raise ValueError(f"log_results must be true or false, got {flag!r}")
        self._log_results = flag == "true"
        self._labels = read_labels(ctx.skill_dir / "control" / LABELS_FILE)
        self._ctx = ctx
        ctx.logger.info("imagenet ready: %d class names", len(self._labels))

    def process(self, item: Mapping[str, Any]) -> Mapping[str, Any]:
        """Classify ``item["image"]``.

        Returns:
            ``label`` (the class index), ``class`` (its name), ``confidence``, and
            where it ran: ``path``, ``cut`` (``None`` when nothing crossed) and
            ``fallback`` (the hub failed and the device finished).

        Raises:
            ValueError: The image is malformed, or the model gave no logits.
            RuntimeError: ``setup`` has not run.
        """
        if self._ctx is None:
            raise RuntimeError("process() before setup()")
        image = model_input(item)
        result = self._ctx.infer(_MODEL, {_INPUT: image})
        label, confidence = _top1(result)
        self._items += 1
        answer = {
            "label": label,
            "class": self._labels[label],
            "confidence": confidence,
            "path": result.path,
            "cut": result.cut,
            "fallback": result.fallback,
            # the crop's mean pixel, read back from the model input's (x - 127) / 128
            "summaries": {"brightness": float(image.mean() * _STD + _MEAN) / 255.0},
        }
        if self._log_results:
            self._ctx.logger.info(
                "result item=%d path=%s cut=%s fallback=%s label=%d confidence=%.4f",
                self._items,
                result.path,
                result.cut or "-",
                result.fallback,
                label,
                confidence,
            )
        return answer


def _top1(result: InferResult) -> tuple[int, float]:
    """The top class and its probability.

    Raises:
        ValueError: The outputs hold no finite ``[1, 1000]`` logits.
    """
    logits = result.outputs.get(_OUTPUT)
    if logits is None:
        raise ValueError(f"the model gave no {_OUTPUT!r} (got {sorted(result.outputs)})")
    values = np.asarray(logits, dtype=np.float64).reshape(-1)
    if values.size != _CLASSES or not np.isfinite(values).all():
        raise ValueError(f"expected {_CLASSES} finite logits, got {values.size}")
    probabilities = _softmax(values)
    label = int(probabilities.argmax())
    return label, float(probabilities[label])
