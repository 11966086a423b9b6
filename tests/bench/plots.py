"""Pictures of benchmark results, next to their JSON (matplotlib, no display needed)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def plot_compression(rows: Sequence[Mapping[str, object]], out: Path, bar_pt: float = 1.0) -> Path:
    """Accuracy loss against size ratio, one series per model, the accuracy bar as a line."""
    fig, ax = plt.subplots(figsize=(8, 5))
    for model in sorted({str(r["model"]) for r in rows}):
        mine = [r for r in rows if r["model"] == model]
        xs = [float(r["size_ratio"]) for r in mine]  # type: ignore[arg-type]
        ys = [float(r["accuracy_loss_pt"]) for r in mine]  # type: ignore[arg-type]
        ax.scatter(xs, ys, label=model)
        for r, x, y in zip(mine, xs, ys, strict=True):
            ax.annotate(
                str(r["variant"]), (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points"
            )
    ax.axhline(bar_pt, linestyle="--", color="grey", label=f"bar: {bar_pt:g} pt loss")
    ax.set_xscale("log")
    ax.set_xlabel("size ratio vs float (×, log scale)")
    ax.set_ylabel("accuracy loss (points)")
    ax.set_title("Compression: smaller is right, better is down")
    ax.legend()
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def plot_bars(
    rows: Sequence[Mapping[str, object]],
    label_key: str,
    value_keys: Sequence[str],
    out: Path,
    title: str,
) -> Path:
    """Grouped bars: one group per row (``label_key``), one bar per value key."""
    fig, axes = plt.subplots(1, len(value_keys), figsize=(4 * len(value_keys), 4))
    axes_list = list(axes) if len(value_keys) > 1 else [axes]
    labels = [str(r[label_key]) for r in rows]
    for ax, key in zip(axes_list, value_keys, strict=True):
        ax.bar(labels, [float(r.get(key) or 0.0) for r in rows])  # type: ignore[arg-type]
        ax.set_title(key)
    fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
