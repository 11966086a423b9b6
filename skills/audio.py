"""Audio helpers the library skills' control code shares (numpy only: it runs on devices)."""

from __future__ import annotations

import numpy as np

__all__ = ["SILENCE_DBFS", "level_dbfs"]

#: The level reported for digital silence (and floor of every level): -100 dBFS.
SILENCE_DBFS = -100.0


def level_dbfs(samples: np.ndarray) -> float:
    """The RMS level of float samples in [-1, 1], in dB below full scale.

    A full-scale square wave is 0 dBFS, a full-scale sine about -3; an empty or
    silent chunk is :data:`SILENCE_DBFS`, the floor.
    """
    if samples.size == 0:
        return SILENCE_DBFS
    rms = float(np.sqrt(np.mean(np.square(samples, dtype=np.float64))))
    if rms <= 10 ** (SILENCE_DBFS / 20):
        return SILENCE_DBFS
    return 20.0 * float(np.log10(rms))
