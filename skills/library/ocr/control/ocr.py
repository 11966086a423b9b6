"""Control code of the built-in ``ocr`` skill: a photo of text in, lines of text out.

Two models from PaddleOCR (PP-OCRv6 small, as RapidOCR ships them):

* ``detector`` (DBNet): the photo, short side scaled to ``det_side`` and both
  sides to multiples of 32, normalised to [-1, 1], BGR; out comes a text
  probability map of the same size. The DB post-process here binarises it
  (``> 0.3``), dilates it, labels its connected regions (run-length union-find
  in numpy), scores each region by its mean probability, drops those
  under ``box_score``, and grows each box back by DB's unclip distance
  (``area * 1.6 / perimeter``). Boxes are axis-aligned: fine for printed pages
  and mildly tilted lines, not for rotated text.
* ``recognizer`` (SVTR, CTC): each line cropped, scaled to 48 pixels high and
  normalised likewise; out come per-column class probabilities. CTC decoding
  takes the best class per column, merges repeats and drops the blank (class 0).
  The classes are the model's own dictionary, which the ONNX file carries in its
  ``character`` metadata; the build writes it to ``control/ocr_keys.txt`` (one
  character a line, then the space class).

Items carry ``image``: an ``[H, W, 3]`` RGB or ``[H, W]`` grey uint8 photo.
Results carry ``lines`` (``box`` ``[x0, y0, x1, y1]`` in photo pixels, ``text``,
``score``) in reading order, ``text`` (the lines joined by newlines), and the
drift fields ``label`` (``text``/``none``), ``confidence`` (the mean line score)
and ``summaries.brightness``.

Config: ``det_side`` (736), ``box_score`` (0.5), ``min_score`` (0.5: lines read
with less confidence are dropped), ``max_lines`` (200).
Numpy, the standard library and the Skill SDK only.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from skills.imaging import resize
from skills.sdk import Model, Skill, SkillContext

__all__ = ["OcrSkill", "ctc_decode", "db_boxes", "label_regions", "read_keys"]

KEYS_FILE = "ocr_keys.txt"
_REC_HEIGHT = 48
_MAX_REC_WIDTH = 3200
_MAX_SIDE = 4096
_BINARY = 0.3
_UNCLIP = 1.6
_MIN_BOX = 3


def read_keys(path: Path) -> list[str]:
    """The recogniser's classes: the blank, then the file's characters (the last is the space).

    Raises:
        ValueError: The file is missing or empty.
    """
    try:
        keys = path.read_text(encoding="utf-8").split("\n")
    except OSError as exc:
        raise ValueError(f"cannot read the OCR dictionary {path.name}: {exc}") from exc
    if len(keys) < 2:
        raise ValueError(f"the OCR dictionary {path.name} is empty")
    return ["", *keys]


def _normalised(pixels: np.ndarray) -> np.ndarray:
    """``[H, W, 3]`` RGB 0..255 as the models' ``[1, 3, H, W]`` BGR input in [-1, 1]."""
    return np.ascontiguousarray((pixels[..., ::-1] / 127.5 - 1.0).transpose(2, 0, 1)[None])


def _photo(image: object) -> np.ndarray:
    photo = np.asarray(image)
    if photo.ndim == 2:
        photo = np.repeat(photo[..., None], 3, axis=2)
    if photo.dtype != np.uint8 or photo.ndim != 3 or photo.shape[2] != 3:
        raise ValueError(f"expected an [H, W, 3] uint8 photo, got {photo.dtype} {photo.shape}")
    if min(photo.shape[:2]) < 8 or max(photo.shape[:2]) > _MAX_SIDE:
        raise ValueError(f"photo size {photo.shape[0]}x{photo.shape[1]} is outside 8..{_MAX_SIDE}")
    return photo


def _find(parent: list[int], i: int) -> int:
    while parent[i] != i:
        parent[i] = parent[parent[i]]
        i = parent[i]
    return i


def label_regions(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The runs of ``mask`` and the 8-connected region each belongs to.

    Runs of set pixels are found row by row; runs touching in neighbouring rows are
    joined with a union-find, so the cost grows with the number of runs, not pixels.

    Returns:
        Per run: its row, first and last column (inclusive), and its region's id.
    """
    padded = np.pad(mask.astype(np.int8), ((0, 0), (1, 1)))
    edges = np.diff(padded, axis=1)
    rows, starts = np.nonzero(edges == 1)
    ends = np.nonzero(edges == -1)[1] - 1  # same order: row-major, alternating
    parent = list(range(len(rows)))
    first = np.searchsorted(rows, np.arange(mask.shape[0] + 1))
    for row in range(mask.shape[0] - 1):
        below_lo, below_hi = int(first[row + 1]), int(first[row + 2])
        if first[row] == below_lo or below_lo == below_hi:
            continue
        b_starts, b_ends = starts[below_lo:below_hi], ends[below_lo:below_hi]
        for run in range(int(first[row]), below_lo):
            touching = np.nonzero((b_starts <= ends[run] + 1) & (b_ends >= starts[run] - 1))[0]
            for other in touching:
                a, b = _find(parent, run), _find(parent, below_lo + int(other))
                if a != b:
                    parent[max(a, b)] = min(a, b)
    roots = np.array([_find(parent, i) for i in range(len(rows))], dtype=np.int64)
    return rows, starts, ends, roots


def db_boxes(prob: np.ndarray, box_score: float) -> list[tuple[float, float, float, float]]:
    """DB post-process of a ``[H, W]`` probability map: unclipped boxes, map pixels.

    A region's score is the mean probability over its own pixels (PaddleOCR's
    ``slow`` score mode): a tilted line's axis-aligned box would dilute it.
    """
    mask = prob > _BINARY
    dilated = mask.copy()  # PaddleOCR's 2x2 dilation
    dilated[1:, :] |= mask[:-1, :]
    dilated[:, 1:] |= dilated[:, :-1].copy()
    height, width = prob.shape
    rows, starts, ends, roots = label_regions(dilated)
    if not len(rows):
        return []
    row_sums = np.pad(prob.astype(np.float64).cumsum(axis=1), ((0, 0), (1, 0)))
    run_sums = row_sums[rows, ends + 1] - row_sums[rows, starts]
    regions, index = np.unique(roots, return_inverse=True)
    sums = np.bincount(index, run_sums, len(regions))
    pixels = np.bincount(index, ends - starts + 1, len(regions))
    x0s, y0s = np.full(len(regions), width), np.full(len(regions), height)
    x1s, y1s = np.zeros(len(regions), np.int64), np.zeros(len(regions), np.int64)
    np.minimum.at(x0s, index, starts)
    np.minimum.at(y0s, index, rows)
    np.maximum.at(x1s, index, ends)
    np.maximum.at(y1s, index, rows)
    out = []
    for i in range(len(regions)):
        w, h = x1s[i] - x0s[i] + 1, y1s[i] - y0s[i] + 1
        if min(w, h) < _MIN_BOX or sums[i] / pixels[i] < box_score:
            continue
        grow = float(w * h * _UNCLIP / (2 * (w + h)))
        x0, y0, x1, y1 = (float(v) for v in (x0s[i], y0s[i], x1s[i] + 1, y1s[i] + 1))
        out.append(
            (
                max(0.0, x0 - grow),
                max(0.0, y0 - grow),
                min(float(width), x1 + grow),
                min(float(height), y1 + grow),
            )
        )
    return out


def ctc_decode(probs: np.ndarray, keys: list[str]) -> tuple[str, float]:
    """Greedy CTC decoding of ``[T, classes]`` probabilities: the text and its mean score."""
    best = probs.argmax(axis=1)
    score = probs.max(axis=1)
    keep = np.ones(len(best), bool)
    keep[1:] = best[1:] != best[:-1]
    keep &= best != 0
    text = "".join(keys[i] if i < len(keys) else "" for i in best[keep])
    return text, float(score[keep].mean()) if keep.any() else 0.0


def _config(config: Mapping[str, str], key: str, default: float, low: float, high: float) -> float:
    raw = config.get(key, "").strip()
    value = float(raw) if raw else default
    if not low <= value <= high:
        raise ValueError(f"{key} must be in [{low:g}, {high:g}], got {raw!r}")
    return value


class OcrSkill(Skill):
    """Reads the lines of text in one photo per item."""

    def __init__(self) -> None:
        self._det: Model | None = None
        self._rec: Model | None = None
        self._keys: list[str] = []
        self._side = 736
        self._box_score = 0.5
        self._min_score = 0.5
        self._max_lines = 200

    def setup(self, ctx: SkillContext) -> None:
        """Load both models and the dictionary; read the configuration.

        Raises:
            ValueError: A setting is out of range, or the dictionary is missing.
        """
        self._side = int(_config(ctx.config, "det_side", 736, 32, _MAX_SIDE))
        self._box_score = _config(ctx.config, "box_score", 0.5, 0.0, 1.0)
        self._min_score = _config(ctx.config, "min_score", 0.5, 0.0, 1.0)
        self._max_lines = int(_config(ctx.config, "max_lines", 200, 1, 10_000))
        self._keys = read_keys(ctx.skill_dir / "control" / KEYS_FILE)
        self._det, self._rec = ctx.model("detector"), ctx.model("recognizer")
        ctx.logger.info("ocr ready: %d classes, on %s", len(self._keys), self._det.backend)

    def _detect(self, photo: np.ndarray, det: Model) -> list[tuple[float, float, float, float]]:
        height, width = photo.shape[:2]
        ratio = min(self._side / min(height, width), _MAX_SIDE / max(height, width))
        new_h = max(32, round(height * ratio / 32) * 32)
        new_w = max(32, round(width * ratio / 32) * 32)
        feeds = {det.input_names[0]: _normalised(resize(photo, new_h, new_w))}
        prob = np.asarray(next(iter(det.run(feeds).values())))[0, 0]
        sx, sy = width / new_w, height / new_h
        boxes = [
            (x0 * sx, y0 * sy, x1 * sx, y1 * sy)
            for x0, y0, x1, y1 in db_boxes(prob, self._box_score)
        ]
        return sorted(boxes, key=lambda b: (round(b[1] / 10), b[0]))[: self._max_lines]

    def _read(self, photo: np.ndarray, box: tuple[float, ...], rec: Model) -> tuple[str, float]:
        x0, y0, x1, y1 = (round(v) for v in box)
        crop = photo[y0:y1, x0:x1]
        width = min(_MAX_REC_WIDTH, max(8, round(crop.shape[1] * _REC_HEIGHT / crop.shape[0])))
        feeds = {rec.input_names[0]: _normalised(resize(crop, _REC_HEIGHT, width))}
        probs = np.asarray(next(iter(rec.run(feeds).values())))[0]
        return ctc_decode(probs, self._keys)

    def process(self, item: Mapping[str, Any]) -> Mapping[str, Any]:
        """Read the text in ``item["image"]``.

        Raises:
            ValueError: No image, or a malformed one.
            RuntimeError: ``setup`` has not run.
        """
        if self._det is None or self._rec is None:
            raise RuntimeError("process() before setup()")
        if "image" not in item:
            raise ValueError("item has no 'image'")
        photo = _photo(item["image"])
        lines: list[dict[str, Any]] = []
        scores: list[float] = []
        for box in self._detect(photo, self._det):
            if box[2] - box[0] < 2 or box[3] - box[1] < 2:
                continue
            text, score = self._read(photo, box, self._rec)
            if text.strip() and score >= self._min_score:
                lines.append({"box": [round(v, 1) for v in box], "text": text, "score": score})
                scores.append(score)
        return {
            "lines": lines,
            "text": "\n".join(str(line["text"]) for line in lines),
            "label": "text" if lines else "none",
            "confidence": float(np.mean(scores)) if scores else 1.0,
            "summaries": {"brightness": float(photo.mean() / 255.0)},
        }
