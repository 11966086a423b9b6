"""Compression benchmark: float vs INT8 vs pruned / distilled (+INT8) for two models.

Run: ``python tests/bench/bench_compression.py [--quick]``. Trains the digits CNN and
the MobileNet on scikit-learn's digits, builds every variant of
``converters.pipeline``, measures accuracy on the held-out test split, file size and
batch-1 latency on ONNX Runtime, OpenVINO and LiteRT (when installed), prints a table
and writes ``tests/bench/results/compression.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from plots import plot_compression
from rich.console import Console
from rich.table import Table

from converters.backends import BACKENDS
from converters.digits import load_digits_data, train_digits
from converters.fit import TrainConfig, fit
from converters.mobilenet import MobileNet, MobileNetConfig, count_parameters
from converters.pipeline import CompressOptions, Variant, compress_model

RESULTS = Path(__file__).parent / "results" / "compression.json"
GOAL_INT8_RATIO = 3.5
GOAL_COMBO_RATIO = 10.0


def _table(rows: list[dict[str, object]]) -> Table:
    table = Table(
        title="Compression (accuracy on the held-out test split; latency = batch 1, 1 thread)"
    )
    for column in ("model", "variant", "acc", "loss pt", "size KB", "ratio", "gzip KB"):
        table.add_column(column, justify="left" if column in {"model", "variant"} else "right")
    for backend in BACKENDS:
        table.add_column(f"{backend} ms", justify="right")
    table.add_column("bar", justify="center")
    for row in rows:
        latencies = [
            f"{row[f'latency_ms_{b}']:.3f}" if f"latency_ms_{b}" in row else "-" for b in BACKENDS
        ]
        table.add_row(
            str(row["model"]),
            str(row["variant"]),
            f"{row['accuracy']:.4f}",
            f"{row['accuracy_loss_pt']:+.2f}",
            f"{int(row['size_bytes']) / 1024:.1f}",  # type: ignore[call-overload]
            f"{row['size_ratio']:.2f}x",
            f"{int(row['gzip_bytes']) / 1024:.1f}",  # type: ignore[call-overload]
            *latencies,
            "yes" if row["meets_bar"] else "NO",
        )
    return table


def _train_models(
    quick: bool, console: Console
) -> dict[str, tuple[torch.nn.Module, dict[str, object]]]:
    data = load_digits_data(seed=0)
    started = time.perf_counter()
    cnn, _ = train_digits(data, epochs=8 if quick else 12, seed=0)
    cnn_s = time.perf_counter() - started
    mobilenet = MobileNet(MobileNetConfig())
    started = time.perf_counter()
    fit(mobilenet, data, TrainConfig(epochs=4 if quick else 10, lr=0.01))
    mobile_s = time.perf_counter() - started
    console.print(
        f"trained digits-cnn ({count_parameters(cnn)} params) in {cnn_s:.1f} s, "
        f"mobilenet ({count_parameters(mobilenet)} params) in {mobile_s:.1f} s"
    )
    return {
        "digits-cnn": (cnn, {"params": count_parameters(cnn), "train_s": round(cnn_s, 1)}),
        "mobilenet": (
            mobilenet,
            {"params": count_parameters(mobilenet), "train_s": round(mobile_s, 1)},
        ),
    }


def _goals(rows: list[dict[str, object]]) -> list[str]:
    big = [r for r in rows if r["model"] == "mobilenet"]
    int8 = next(r for r in big if r["variant"] == "int8")
    combos = [r for r in rows if r["meets_bar"] and float(r["size_ratio"]) >= GOAL_COMBO_RATIO]  # type: ignore[arg-type]
    int8_ok = bool(int8["meets_bar"]) and float(int8["size_ratio"]) >= GOAL_INT8_RATIO  # type: ignore[arg-type]
    return [
        f"INT8 on mobilenet: {int8['accuracy_loss_pt']:+.2f} pt, {int8['size_ratio']:.2f}x "
        f"-> {'MET' if int8_ok else 'MISSED'} (goal <= 1.0 pt and >= {GOAL_INT8_RATIO}x)",
        f">= {GOAL_COMBO_RATIO}x at <= 1.0 pt: "
        + (
            ", ".join(f"{r['model']}/{r['variant']} {r['size_ratio']:.1f}x" for r in combos)
            or "MISSED"
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer epochs (a smoke run)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    console = Console(width=170)
    torch.manual_seed(0)
    data = load_digits_data(seed=0)
    rows: list[dict[str, object]] = []
    options = CompressOptions(
        finetune=TrainConfig(epochs=2 if args.quick else 6, lr=3e-3),
        distill=TrainConfig(epochs=4 if args.quick else 10, lr=0.01),
    )
    with tempfile.TemporaryDirectory(prefix="bench-compression-") as tmp:
        for name, (model, info) in _train_models(args.quick, console).items():

            def record(variant: Variant, name: str = name, info: dict[str, object] = info) -> None:
                params = count_parameters(variant.model) if variant.model is not None else None
                row = {**variant.report.to_row(), "params": params}
                if variant.name == "float":
                    row["train_s"] = info["train_s"]
                rows.append(row)
                console.print(
                    f"  {name}/{variant.name}: acc {row['accuracy']:.4f}, {row['size_bytes']} B"
                )

            compress_model(name, model, data, Path(tmp) / name, options=options, on_variant=record)
    console.print(_table(rows))
    for line in _goals(rows):
        console.print(line)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1) + "\n")
    picture = plot_compression(rows, args.out.with_suffix(".png"))
    console.print(f"wrote {args.out} and {picture}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
