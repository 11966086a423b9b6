"""Split-planner benchmark: decision time on a 200-node DAG; candidate cuts against the optimum.

Run: ``python tests/bench/bench_planner.py [--repeats 200]``

The graph is EfficientNet-shaped (synthetic costs): a stem, then inverted-residual
blocks (expand, depthwise, project, and an add with the block's input where the
shapes allow), then a head: 200 nodes with skip connections. Timed, as medians
over ``--repeats`` runs in one process (ratios to the 5 ms target, not absolutes,
are what carry over to another machine):

* ``table``: pricing every topological-prefix cut from the graph (201 cuts);
* ``plan``: one decision over that table (what runs on every link change);
* ``min-cut``: the exact optimum over all partitions (Dinic on the DADS network);
* ``re-plan``: all three, as after the cost graph itself changes.

Then, per link of the split benchmark and device slowdown (1×, 4×, 16×), the
planner's pick among (a) every prefix cut and (b) the block boundaries only
(what the converters ship), against the min-cut optimum: the gap in percent.
It prints two tables and writes ``tests/bench/results/planner.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from edge_agent.split.graph import CostGraph, Node, Tensor, optimum, table_from_graph
from edge_agent.split.planner import LinkEstimate, plan

RESULTS = Path(__file__).parent / "results" / "planner.json"
TARGET_MS = 5.0
LINKS = {
    "1 Mbit/s, 100 ms": LinkEstimate(100.0, 125e3),
    "10 Mbit/s, 50 ms": LinkEstimate(50.0, 1.25e6),
    "50 Mbit/s, 10 ms": LinkEstimate(10.0, 6.25e6),
    "1 Gbit/s, 1 ms": LinkEstimate(1.0, 125e6),
}
SLOWDOWNS = (1.0, 4.0, 16.0)
HUB_SPEEDUP = 1.0  # the hub is as fast as the (unslowed) device; slowdowns scale the device
console = Console()


def efficientnet_like(nodes: int = 200) -> tuple[CostGraph, list[str]]:
    """A DAG of ``nodes`` nodes shaped like EfficientNet-Lite0, and its block-output tensors."""
    made: list[Node] = []
    tensors: list[Tensor] = []
    readers: dict[str, list[str]] = {}
    sizes: dict[str, int] = {}
    boundaries: list[str] = []

    def add(name: str, ms: float, inputs: list[str], out_bytes: int) -> str:
        made.append(Node(name, ms, ms / HUB_SPEEDUP / 8))  # a GPU hub: 8x faster per op
        for tensor in inputs:
            readers[tensor].append(name)
        out = f"{name}:0"
        readers[out], sizes[out] = [], out_bytes
        return out

    readers["image"], sizes["image"] = [], 224 * 224 * 3
    current = add("stem", 2.0, ["image"], 112 * 112 * 32)
    side, channels, block = 112, 32, 0
    while len(made) < nodes - 3:
        block += 1
        down = block % 8 == 0 and side > 7
        out_side = side // 2 if down else side
        out_channels = channels + (16 if down else 0)
        expanded = add(
            f"b{block}.expand",
            0.002 * side * side * channels / 1000,
            [current],
            6 * side * side * channels,
        )
        depthwise = add(
            f"b{block}.dw",
            0.001 * side * side * channels / 1000,
            [expanded],
            6 * out_side * out_side * channels,
        )
        projected = add(
            f"b{block}.project",
            0.002 * out_side * out_side * channels / 1000,
            [depthwise],
            out_side * out_side * out_channels,
        )
        if not down and out_channels == channels:
            projected = add(
                f"b{block}.add",
                0.0001 * side * side,
                [projected, current],
                out_side * out_side * out_channels,
            )
        current, side, channels = projected, out_side, out_channels
        boundaries.append(current)
    pooled = add("pool", 0.05, [current], channels * 4)
    logits = add("fc", 0.3, [pooled], 4000)
    while len(made) < nodes:
        logits = add(f"softmax{len(made)}", 0.01, [logits], 4000)
    for name, users in readers.items():
        producer = None if name == "image" else name.rsplit(":", 1)[0]
        tensors.append(Tensor(name, sizes[name], producer, tuple(users), output=name == logits))
    return CostGraph(tuple(made), tuple(tensors)), boundaries


def median_ms(action: Callable[[], object], repeats: int) -> float:
    """The median wall time of ``action`` in ms."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter_ns()
        action()
        times.append((time.perf_counter_ns() - started) / 1e6)
    return statistics.median(times)


def timings(graph: CostGraph, repeats: int) -> list[dict[str, Any]]:
    """Decision times on ``graph``."""
    link = LINKS["10 Mbit/s, 50 ms"]
    table = table_from_graph(graph, "net")
    steps: dict[str, Callable[[], object]] = {
        "table (201 prefix cuts)": lambda: table_from_graph(graph, "net"),
        "plan (one decision)": lambda: plan(table, link, 3.0, current=5),
        "min-cut optimum": lambda: optimum(graph, link, 3.0),
        "re-plan (all three)": lambda: (
            plan(table_from_graph(graph, "net"), link, 3.0),
            optimum(graph, link, 3.0),
        ),
    }
    rows = []
    for step, action in steps.items():
        ms = median_ms(action, repeats)
        rows.append({"step": step, "median_ms": round(ms, 4), "within_5ms": ms < TARGET_MS})
    return rows


def gaps(graph: CostGraph, boundaries: list[str]) -> list[dict[str, Any]]:
    """Per link and slowdown: the candidates' best against the exact optimum."""
    rows = []
    for slowdown in SLOWDOWNS:
        slowed = graph.slowed_down(slowdown)
        every = table_from_graph(slowed, "net")
        shipped = table_from_graph(slowed, "net", [[t] for t in boundaries])
        for label, link in LINKS.items():
            best = optimum(slowed, link)
            pick_every = plan(every, link)
            pick_shipped = plan(shipped, link)
            rows.append(
                {
                    "link": label,
                    "device_slowdown": slowdown,
                    "optimum_ms": round(best.total_ms, 3),
                    "optimum_device_nodes": len(best.device_nodes),
                    "prefix_ms": round(pick_every.best_ms, 3),
                    "prefix_cut": every.cuts[pick_every.cut].name,
                    "prefix_gap_pct": round(100 * (pick_every.best_ms / best.total_ms - 1), 3),
                    "shipped_ms": round(pick_shipped.best_ms, 3),
                    "shipped_cut": shipped.cuts[pick_shipped.cut].name,
                    "shipped_gap_pct": round(100 * (pick_shipped.best_ms / best.total_ms - 1), 3),
                }
            )
    return rows


def print_tables(timed: list[dict[str, Any]], gapped: list[dict[str, Any]], nodes: int) -> None:
    """Both tables, to the console."""
    table = Table(title=f"split planner on a {nodes}-node DAG (target < {TARGET_MS:g} ms)")
    for column in ("step", "median ms", "< 5 ms"):
        table.add_column(column, justify="right" if column != "step" else "left")
    for row in timed:
        table.add_row(row["step"], f"{row['median_ms']:.3f}", "yes" if row["within_5ms"] else "NO")
    console.print(table)
    table = Table(title="candidate cuts against the min-cut optimum")
    for column in (
        "link",
        "device",
        "optimum ms",
        "prefix ms",
        "gap %",
        "shipped cut",
        "shipped ms",
        "gap %",
    ):
        table.add_column(column, justify="left" if column in ("link", "shipped cut") else "right")
    for row in gapped:
        table.add_row(
            row["link"],
            f"{row['device_slowdown']:g}x",
            f"{row['optimum_ms']:.2f}",
            f"{row['prefix_ms']:.2f}",
            f"{row['prefix_gap_pct']:.2f}",
            row["shipped_cut"],
            f"{row['shipped_ms']:.2f}",
            f"{row['shipped_gap_pct']:.2f}",
        )
    console.print(table)


def main() -> None:
    """Run the benchmark, print its tables, write its JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--nodes", type=int, default=200)
    args = parser.parse_args()
    graph, boundaries = efficientnet_like(args.nodes)
    timed = timings(graph, args.repeats)
    gapped = gaps(graph, boundaries)
    print_tables(timed, gapped, len(graph.nodes))
    meta = {
        "nodes": len(graph.nodes),
        "tensors": len(graph.tensors),
        "blocks": len(boundaries),
        "repeats": args.repeats,
        "python": sys.version.split()[0],
        "note": "synthetic EfficientNet-like costs, int8 activations; hub ops 8x faster than 1x",
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps({"meta": meta, "timings": timed, "gaps": gapped}, indent=2) + "\n",
        encoding="utf-8",
    )
    console.print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
