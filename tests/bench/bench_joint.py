"""Joint-inference benchmark: a small digits CNN on the device hands its unsure digits to a big one.

Run: ``python tests/bench/bench_joint.py [--out PATH]``.

Both models are trained here (torch, one thread, seconds) on scikit-learn's
digits, with the same 70/10/20 split: the **small** one is a
``DigitsCNN(4, 8, 16)`` trained for 4 epochs, the **big** one a
``DigitsCNN(32, 64, 128)`` trained for 10; both are exported to ONNX and run in
ONNX Runtime over the held-out test digits.

* **Sweep** (offline): for each confidence measure of :mod:`edge_agent.split.joint`
  (entropy: hard above the threshold; margin: hard below it) and thresholds
  taken at quantiles of the small model's confidences (so the upload ratios
  spread from 0 to 1), the inputs it calls hard go to the big model: the
  upload ratio, the accuracy of each path (device-kept: small model; hub-answered:
  big model), and overall, against small-only and big-only.
* **Live point**: the big model is the joint pair's big model of a skill
  (:mod:`tests.support.split_skill`) served by a real hub process
  (``edgeskill hub serve``); the device, this process, runs the small model on
  every test digit and sends the hard ones with the agent's gRPC transport
  (``InferTail``, ``split = "joint"``, encoded by the agent's ``JointRoute``).
  Its path counts and accuracy must equal the sweep's at the same threshold.

It prints a table, writes ``tests/bench/results/joint.json`` and a plot of
accuracy against upload ratio for both measures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import plots  # noqa: F401  (selects matplotlib's Agg backend first)
from matplotlib import pyplot as plt
from rich.console import Console
from rich.table import Table
from tailhub import device, hub_serving

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from converters.digits import DigitsCNN, DigitsData, load_digits_data
from edge_agent.split.joint import MEASURES, confidence, is_hard
from edge_agent.split.link import LinkEstimator
from edge_agent.split.routes import JOINT, JointRoute, Shared, SplitSettings
from protos import pb
from skills.manifest import JointSpec
from tests.support.split_skill import SKILL, build_split_skill

RESULTS = Path(__file__).parent / "results" / "joint.json"
SMALL = ((4, 8, 16), 4)  # widths, epochs
BIG = ((32, 64, 128), 10)
#: Upload ratios aimed at by the sweep's thresholds.
TARGETS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0)
LIVE_TARGET = 0.2  # the live point: entropy, about a fifth uploaded
DEADLINE_MS = 5_000
console = Console(width=140)


def train(data: DigitsData, widths: tuple[int, int, int], epochs: int) -> Any:
    """A digits CNN of ``widths`` trained for ``epochs`` (Adam, batches of 32, seeded)."""
    import torch  # noqa: PLC0415
    from torch.nn import functional  # noqa: PLC0415

    torch.manual_seed(0)
    model = DigitsCNN(*widths)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    x, y = torch.from_numpy(data.train.x), torch.from_numpy(data.train.y)
    order = torch.Generator().manual_seed(0)
    for _ in range(epochs):
        model.train()
        for batch in torch.randperm(len(y), generator=order).split(32):
            optimizer.zero_grad()
            functional.cross_entropy(model(x[batch]), y[batch]).backward()
            optimizer.step()
    return model.eval()


def export(data: DigitsData, work: Path) -> tuple[Path, Path, dict[str, int]]:
    """Both models trained and exported; their parameter counts."""
    import torch  # noqa: PLC0415

    from converters.onnx_export import export_onnx  # noqa: PLC0415

    torch.set_num_threads(1)  # two threads on two shared cores run several times slower
    paths, params = [], {}
    for name, (widths, epochs) in (("small", SMALL), ("big", BIG)):
        model = train(data, widths, epochs)
        params[name] = sum(p.numel() for p in model.parameters())
        paths.append(export_onnx(model, data.test.x[:4], work / f"{name}.onnx"))
    return paths[0], paths[1], params


def logits(path: Path, x: np.ndarray) -> np.ndarray:
    """The model's logits for every row of ``x`` (ONNX Runtime, one batch)."""
    import onnxruntime as ort  # noqa: PLC0415

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {"image": x})[0])


def accuracy(predicted: np.ndarray, labels: np.ndarray) -> float | None:
    """Top-1 accuracy, or ``None`` over no examples."""
    return round(float(np.mean(predicted == labels)), 4) if len(labels) else None


def route(measure: str, confidences: np.ndarray, threshold: float) -> np.ndarray:
    """Which inputs the device sends to the hub."""
    return np.array([is_hard(float(c), measure, threshold) for c in confidences], dtype=bool)


def sweep_row(
    measure: str,
    threshold: float,
    hard: np.ndarray,
    small: np.ndarray,
    big: np.ndarray,
    y: np.ndarray,
) -> dict[str, Any]:
    """One threshold: the upload ratio and each path's accuracy."""
    answered = np.where(hard, big, small)
    return {
        "measure": measure,
        "threshold": round(threshold, 6),
        "upload_ratio": round(float(np.mean(hard)), 4),
        "uploaded": int(hard.sum()),
        "kept": int((~hard).sum()),
        "device_kept_accuracy": accuracy(small[~hard], y[~hard]),
        "hub_answered_accuracy": accuracy(big[hard], y[hard]),
        "small_on_uploaded_accuracy": accuracy(small[hard], y[hard]),
        "overall_accuracy": accuracy(answered, y),
    }


def thresholds(measure: str, confidences: np.ndarray) -> list[float]:
    """Thresholds at which about each of :data:`TARGETS` is uploaded.

    Each lies halfway between two of the confidences, so the small model's batch-1
    run on the device (a rounding away from its batched run) routes every input alike.
    """
    ordered = np.unique(np.concatenate([[0.0, 1.0], confidences]))
    out = []
    for u in TARGETS:
        if measure == "entropy":  # hard above: the top u, so just above the (1 - u) quantile
            i = int(np.searchsorted(ordered, np.quantile(confidences, 1.0 - u), side="right"))
        else:  # margin, hard below: the bottom u, so just below the u quantile
            i = int(np.searchsorted(ordered, np.quantile(confidences, u), side="left"))
        low, high = ordered[max(i - 1, 0)], ordered[min(i, len(ordered) - 1)]
        out.append(float(low + high) / 2.0)
    return out


def sweep(small_logits: np.ndarray, big_logits: np.ndarray, y: np.ndarray) -> list[dict[str, Any]]:
    """Every measure and threshold over the test digits."""
    small, big = small_logits.argmax(axis=1), big_logits.argmax(axis=1)
    rows = []
    for measure in MEASURES:
        values = np.array([confidence(row[None], measure) for row in small_logits])
        for threshold in thresholds(measure, values):
            rows.append(
                sweep_row(measure, threshold, route(measure, values, threshold), small, big, y)
            )
    return rows


async def live(
    target: str, small_path: Path, version: str, x: np.ndarray, y: np.ndarray, threshold: float
) -> dict[str, Any]:
    """Every test digit through the device and, when hard, the hub's big model over InferTail."""
    import onnxruntime as ort  # noqa: PLC0415

    session = ort.InferenceSession(str(small_path), providers=["CPUExecutionProvider"])
    spec = JointSpec("small", "big", "entropy", threshold, DEADLINE_MS)
    shared = Shared(LinkEstimator(), threading.Lock(), SplitSettings(), time.monotonic)
    joint = JointRoute(SKILL, version, spec, shared)
    predicted: list[int] = []
    hard: list[bool] = []
    ms: dict[str, list[float]] = {"device": [], "hub": []}
    async with device(target, "bench-joint") as transport:
        for image in x:
            started = time.monotonic()
            scores = np.asarray(session.run(None, {"image": image[None]})[0])
            sent = is_hard(confidence(scores, "entropy"), "entropy", threshold)
            if sent:
                request = pb.InferRequest(
                    model=joint.hub_model,
                    split=JOINT,
                    inputs=joint.encode(JOINT, {"image": image[None]}),
                    skill=SKILL,
                    version=version,
                    request_id=uuid.uuid4().hex,
                    deadline_ms=DEADLINE_MS,
                )
                answer = await transport.infer_tail(request, DEADLINE_MS / 1000.0)
                scores = joint.decode(answer, ["logits"])["logits"]
            ms["hub" if sent else "device"].append((time.monotonic() - started) * 1000.0)
            predicted.append(int(scores.argmax()))
            hard.append(sent)
    mask, answers = np.array(hard, dtype=bool), np.array(predicted)
    return {
        "measure": "entropy",
        "threshold": round(threshold, 6),
        "uploaded": int(mask.sum()),
        "kept": int((~mask).sum()),
        "upload_ratio": round(float(mask.mean()), 4),
        "device_kept_accuracy": accuracy(answers[~mask], y[~mask]),
        "hub_answered_accuracy": accuracy(answers[mask], y[mask]),
        "overall_accuracy": accuracy(answers, y),
        "device_kept_median_ms": round(statistics.median(ms["device"]), 3)
        if ms["device"]
        else None,
        "hub_answered_median_ms": round(statistics.median(ms["hub"]), 3) if ms["hub"] else None,
        "predictions": answers,
    }


def check_live(point: dict[str, Any], offline: dict[str, Any], big: np.ndarray) -> dict[str, Any]:
    """The live point against the sweep at its threshold: counts and answers."""
    predictions = point.pop("predictions")
    uploaded = offline["hard"]
    same = {
        key: point[key] == offline["row"][key]
        for key in (
            "uploaded",
            "kept",
            "device_kept_accuracy",
            "hub_answered_accuracy",
            "overall_accuracy",
        )
    }
    point["hub_answers_equal_offline_big"] = int(np.sum(predictions[uploaded] == big[uploaded]))
    point["matches_offline"] = same
    point["confirmed"] = all(same.values())
    return point


def print_table(
    rows: list[dict[str, Any]], baselines: dict[str, Any], point: dict[str, Any]
) -> None:
    """The sweep, the baselines and the live point."""
    title = (
        f"Joint inference on digits: small-only {baselines['small_only_accuracy']:.3f}, "
        f"big-only {baselines['big_only_accuracy']:.3f} ({baselines['test_digits']} test digits)"
    )
    table = Table(title=title)
    for column in (
        "measure",
        "threshold",
        "upload %",
        "kept acc",
        "hub acc",
        "small on uploaded",
        "overall",
    ):
        table.add_column(column, justify="left" if column == "measure" else "right")

    def cell(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    for r in rows:
        table.add_row(
            r["measure"],
            f"{r['threshold']:.4f}",
            f"{100 * r['upload_ratio']:.1f}",
            cell(r["device_kept_accuracy"]),
            cell(r["hub_answered_accuracy"]),
            cell(r["small_on_uploaded_accuracy"]),
            cell(r["overall_accuracy"]),
        )
    console.print(table)
    verdict = (
        "[green]matches the sweep[/]" if point["confirmed"] else "[red]differs from the sweep[/]"
    )
    console.print(
        f"live (hub process, InferTail): entropy > {point['threshold']:.4f}: "
        f"{point['uploaded']} uploaded, {point['kept']} kept, "
        f"overall {point['overall_accuracy']:.3f}, "
        f"median ms device-kept {point['device_kept_median_ms']}, hub-answered "
        f"{point['hub_answered_median_ms']}: {verdict}"
    )


def plot(
    rows: list[dict[str, Any]], baselines: dict[str, Any], point: dict[str, Any], out: Path
) -> Path:
    """Overall accuracy against upload ratio per measure; the baselines and the live point."""
    fig, ax = plt.subplots(figsize=(7, 5))
    for measure in MEASURES:
        mine = sorted((r for r in rows if r["measure"] == measure), key=lambda r: r["upload_ratio"])
        ax.plot(
            [r["upload_ratio"] for r in mine],
            [r["overall_accuracy"] for r in mine],
            "o-",
            label=measure,
        )
    ax.axhline(baselines["small_only_accuracy"], linestyle="--", color="grey", label="small only")
    ax.axhline(baselines["big_only_accuracy"], linestyle=":", color="black", label="big only")
    ax.plot(
        [point["upload_ratio"]], [point["overall_accuracy"]], "*", markersize=14, label="live (hub)"
    )
    ax.set_xlabel("upload ratio (share of inputs sent to the hub)")
    ax.set_ylabel("overall top-1 accuracy")
    ax.set_title("Joint inference on digits: accuracy vs upload ratio")
    ax.legend()
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main() -> None:
    """Train, sweep, run the live point, print, write the JSON and the plot."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    started = time.perf_counter()
    data = load_digits_data()
    x, y = data.test.x, data.test.y
    with tempfile.TemporaryDirectory(prefix="edgeskill-joint-") as tmp:
        work = Path(tmp)
        small_path, big_path, params = export(data, work)
        small_logits, big_logits = logits(small_path, x), logits(big_path, x)
        rows = sweep(small_logits, big_logits, y)
        entropy = np.array([confidence(row[None], "entropy") for row in small_logits])
        threshold = thresholds("entropy", entropy)[TARGETS.index(LIVE_TARGET)]
        hard = route("entropy", entropy, threshold)
        small, big = small_logits.argmax(axis=1), big_logits.argmax(axis=1)
        offline = {"row": sweep_row("entropy", threshold, hard, small, big, y), "hard": hard}
        skill = build_split_skill(work, big_path, big=big_path)
        with hub_serving(work, skill) as hub:
            found = asyncio.run(
                live(f"{hub.host}:{hub.port}", small_path, skill.version, x, y, threshold)
            )
        point = check_live(found, offline, big)
    baselines = {
        "small_only_accuracy": accuracy(small, y),
        "big_only_accuracy": accuracy(big, y),
        "test_digits": len(y),
        "parameters": params,
    }
    print_table(rows, baselines, point)
    meta = {
        "data": "scikit-learn digits, 70/10/20 stratified split (seed 0); the 20 % test split",
        "small": f"DigitsCNN{SMALL[0]}, {SMALL[1]} epochs; on the device (ONNX Runtime, here)",
        "big": f"DigitsCNN{BIG[0]}, {BIG[1]} epochs; on the hub (offline: ONNX Runtime here)",
        "measures": "edge_agent.split.joint: entropy (normalised, hard above), margin (hard below)",
        "thresholds": f"quantiles of the small model's confidences, aiming at {list(TARGETS)}",
        "live": "edgeskill hub serve process, plain gRPC on loopback (no link emulation), "
        "GrpcAgentTransport.infer_tail, JointRoute.encode",
        "cpu_count": os.cpu_count(),
        "wall_s": round(time.perf_counter() - started, 1),
    }
    result = {"meta": meta, "baselines": baselines, "sweep": rows, "live": point}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    picture = plot(rows, baselines, point, args.out.with_suffix(".png"))
    console.print(f"wrote {args.out} and {picture} in {meta['wall_s']} s")
    if not point["confirmed"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
