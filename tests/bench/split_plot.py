"""The split benchmark's picture: per link, the latency of each strategy at each device slowdown."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import plots  # noqa: F401  (selects matplotlib's Agg backend first)
from matplotlib import pyplot as plt

SERIES = (
    ("device_only_ms", "device-only"),
    ("hub_only_ms", "hub-only"),
    ("best_ms", "best cut (measured)"),
    ("planner_ms", "planner's cut"),
)


def plot_split(rows: Sequence[Mapping[str, object]], out: Path) -> Path:
    """One panel per link: grouped bars per slowdown, log latency."""
    links = list(dict.fromkeys(str(r["link"]) for r in rows))
    fig, axes = plt.subplots(1, len(links), figsize=(4.5 * len(links), 4.5), squeeze=False)
    width = 0.8 / len(SERIES)
    for ax, link in zip(axes[0], links, strict=True):
        mine = [r for r in rows if r["link"] == link]
        for i, (key, label) in enumerate(SERIES):
            xs = [j + (i - (len(SERIES) - 1) / 2) * width for j in range(len(mine))]
            ax.bar(xs, [float(r[key]) for r in mine], width, label=label)  # type: ignore[arg-type]
        ax.set_xticks(range(len(mine)), [f"{float(r['device_slowdown']):g}x" for r in mine])  # type: ignore[arg-type]
        ax.set_yscale("log")
        ax.set_title(link)
        ax.set_xlabel("device slowdown")
    axes[0][0].set_ylabel("end-to-end latency, ms (log)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Split inference: EfficientNet-Lite0, device → emulated link → hub")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
