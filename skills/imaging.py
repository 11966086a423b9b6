"""Image helpers the library skills' control code shares (numpy only: it runs on devices)."""

from __future__ import annotations

import numpy as np

__all__ = ["resize"]


def resize(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Resize ``[H, W, C]`` to ``[height, width, C]`` float32 with a triangle filter."""

    def weights(size_in: int, size_out: int) -> np.ndarray:
        scale = size_in / size_out
        stretch = max(scale, 1.0)
        distance = (
            np.arange(size_in)[None, :] + 0.5 - (np.arange(size_out)[:, None] + 0.5) * scale
        ) / stretch
        w = np.clip(1.0 - np.abs(distance), 0.0, None)
        return w / w.sum(axis=1, keepdims=True)

    rows = weights(image.shape[0], height).astype(np.float32)
    cols = weights(image.shape[1], width).astype(np.float32)
    out = (rows @ image.astype(np.float32).reshape(image.shape[0], -1)).reshape(height, -1, 3)
    return np.ascontiguousarray((out.transpose(0, 2, 1) @ cols.T).transpose(0, 2, 1))
