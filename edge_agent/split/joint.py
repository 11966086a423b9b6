"""How sure a small model is: the confidence measures joint inference routes on.

Joint inference (Sedna's big/small model) runs a small model on the device and
sends the input to a bigger model on the hub only when the small one is unsure.
Two measures, both over the softmax of the small model's first output and both
in ``[0, 1]`` whatever the number of classes:

* ``entropy`` — the entropy of the distribution divided by ``ln(classes)``;
  0 is certain, 1 is uniform. A call is *hard* when it is **above** the threshold.
* ``margin`` — the top probability less the runner-up; 1 is certain, 0 a tie.
  A call is *hard* when it is **below** the threshold.

An output that already is a distribution (non-negative, rows summing to 1) is
taken as it is; anything else is treated as logits and put through a softmax.
For a batch, the call's value is its least confident row: one hard example is
enough to ask the hub. Pure numpy, no I/O.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["MEASURES", "confidence", "is_hard", "probabilities"]

#: The confidence measures a ``[[joint]]`` section may name.
MEASURES = ("entropy", "margin")

_SUM_TOLERANCE = 1e-3


def probabilities(output: np.ndarray) -> np.ndarray:
    """The output as a 2-D array of class distributions (one row per example).

    Raises:
        ValueError: The output is empty or not finite.
    """
    values = np.asarray(output, dtype=np.float64)
    if values.size == 0 or not np.all(np.isfinite(values)):
        raise ValueError("a confidence needs a non-empty, finite output")
    rows = values.reshape(1, -1) if values.ndim < 2 else values.reshape(-1, values.shape[-1])
    sums = rows.sum(axis=1)
    if np.all(rows >= 0) and np.all(np.abs(sums - 1.0) <= _SUM_TOLERANCE):
        return rows
    shifted = np.exp(rows - rows.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def confidence(output: np.ndarray, measure: str) -> float:
    """The call's value of ``measure`` (its least confident row).

    Args:
        output: The small model's class scores (logits or probabilities).
        measure: ``entropy`` or ``margin``.

    Returns:
        A value in ``[0, 1]``: normalised entropy, or top-1 less top-2 probability.

    Raises:
        ValueError: An unknown measure, or an empty or non-finite output.
    """
    if measure not in MEASURES:
        raise ValueError(f"unknown confidence measure {measure!r}; use one of {MEASURES}")
    rows = probabilities(output)
    classes = rows.shape[1]
    if classes < 2:
        return 0.0 if measure == "entropy" else 1.0
    if measure == "entropy":
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(rows > 0, -rows * np.log(rows), 0.0)
        return float(np.clip(terms.sum(axis=1).max() / math.log(classes), 0.0, 1.0))
    top = np.sort(rows, axis=1)[:, -2:]
    return float(np.clip((top[:, 1] - top[:, 0]).min(), 0.0, 1.0))


def is_hard(value: float, measure: str, threshold: float) -> bool:
    """Whether a call with confidence ``value`` should go to the hub's big model.

    Raises:
        ValueError: An unknown measure.
    """
    if measure == "entropy":
        return value > threshold
    if measure == "margin":
        return value < threshold
    raise ValueError(f"unknown confidence measure {measure!r}; use one of {MEASURES}")
