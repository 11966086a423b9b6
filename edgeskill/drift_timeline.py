"""The drift demo's bookkeeping: shifted inputs, fleet accuracy over time, phases, the plot.

Pure but for :func:`write_plot` (a PNG, with matplotlib when it is installed):
telemetry windows in, accuracy points, phase rows and loop numbers out, so
:mod:`edgeskill.demo_drift` only runs processes and waits.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "SHIFTS",
    "Event",
    "Point",
    "fleet_accuracy",
    "phase_row",
    "recovered_at",
    "shift_images",
    "timeline",
    "write_plot",
]

#: What each kind of shift does to a batch of images in [0, 1] (labels stay the true ones).
SHIFTS = ("invert", "invert+noise", "rot90")


def shift_images(x: np.ndarray, kind: str, seed: int = 0) -> np.ndarray:
    """``x`` (N, 1, H, W) shifted by ``kind``: inverted, inverted with noise, or rotated 90°.

    Raises:
        ValueError: An unknown kind.
    """
    if kind == "invert":
        out = 1.0 - x
    elif kind == "invert+noise":
        noise = np.random.default_rng(seed).normal(0.0, 0.1, size=x.shape)
        out = np.clip(1.0 - x + noise, 0.0, 1.0)
    elif kind == "rot90":
        out = np.rot90(x, k=1, axes=(-2, -1))
    else:
        raise ValueError(f"unknown shift {kind!r}; use one of {', '.join(SHIFTS)}")
    return np.ascontiguousarray(out, dtype=np.float32)


@dataclass(frozen=True)
class Window:
    """What the demo reads of one telemetry window."""

    device: str
    version: str
    end_ms: int
    labelled: int
    correct: int
    psi: float | None


def window_of(record: Any) -> Window:
    """A store telemetry record (``drift.*`` metrics in it) as a :class:`Window`."""
    metrics = record.metrics
    psi = [metrics[k] for k in ("drift.psi_class", "drift.psi_confidence") if k in metrics]
    return Window(
        record.device_id, record.version, record.window_end_ms, record.labelled, record.correct,
        max(psi) if psi else None,
    )  # fmt: skip


@dataclass(frozen=True)
class Point:
    """Fleet accuracy over the windows that ended in one bin."""

    end_ms: int
    accuracy: float
    labelled: int


@dataclass(frozen=True)
class Event:
    """A moment the plot marks (shift, alarm, canary, promotion)."""

    name: str
    at_ms: int


def fleet_accuracy(windows: Iterable[Window]) -> tuple[float, int]:
    """Correct over labelled across ``windows`` (NaN when none is labelled), and the count."""
    labelled = correct = 0
    for w in windows:
        labelled += w.labelled
        correct += w.correct
    return (correct / labelled if labelled else math.nan), labelled


def timeline(windows: Sequence[Window], bin_ms: int, start_ms: int) -> list[Point]:
    """Fleet accuracy per bin of ``bin_ms`` from ``start_ms`` (bins with labels only)."""
    bins: dict[int, list[Window]] = {}
    for w in windows:
        if w.end_ms >= start_ms:
            bins.setdefault((w.end_ms - start_ms) // bin_ms, []).append(w)
    points = []
    for index in sorted(bins):
        accuracy, labelled = fleet_accuracy(bins[index])
        if labelled:
            points.append(Point(start_ms + (index + 1) * bin_ms, accuracy, labelled))
    return points


def recovered_at(points: Sequence[Point], after_ms: int, target: float) -> int | None:
    """The end of the first bin after ``after_ms`` whose accuracy reached ``target``."""
    return next((p.end_ms for p in points if p.end_ms > after_ms and p.accuracy >= target), None)


def phase_row(name: str, windows: Sequence[Window], start_ms: int, end_ms: int) -> list[str]:
    """One row of the before/after table: phase, seconds, accuracy, mean PSI, versions."""
    inside = [w for w in windows if start_ms <= w.end_ms < end_ms]
    accuracy, labelled = fleet_accuracy(inside)
    psi = [w.psi for w in inside if w.psi is not None]
    versions = sorted({w.version for w in inside})
    return [
        name,
        f"{(end_ms - start_ms) / 1000:.1f}",
        f"{accuracy:.3f}" if labelled else "-",
        str(labelled),
        f"{sum(psi) / len(psi):.2f}" if psi else "-",
        ", ".join(versions) or "-",
    ]


def write_plot(path: Path, points: Sequence[Point], events: Sequence[Event], zero_ms: int) -> bool:
    """Draw fleet accuracy over time with the events as vertical lines; False without matplotlib.

    Raises:
        OSError: The PNG cannot be written.
    """
    try:
        import matplotlib as mpl  # noqa: PLC0415 - optional (the dev extra)

        mpl.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.plot([(p.end_ms - zero_ms) / 1000 for p in points], [p.accuracy for p in points], "o-")
    colours = {"shift": "tab:red", "alarm": "tab:orange", "canary": "tab:blue"}
    for event in events:
        x = (event.at_ms - zero_ms) / 1000
        ax.axvline(x, linestyle="--", color=colours.get(event.name, "tab:green"))
        ax.annotate(event.name, (x, 0.02), rotation=90, xycoords=("data", "axes fraction"))
    ax.set(xlabel="seconds since the shift", ylabel="fleet accuracy", ylim=(0.0, 1.02))
    ax.set_title("edgeskill demo --drift: fleet accuracy over time")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
