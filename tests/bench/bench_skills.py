"""Library skills benchmark: latency through the agent's skill runtime against a bare runtime call.

Run: ``python tests/bench/bench_skills.py [--repeats 20]``

Per library skill (models built from their pinned packages) and per backend
available here that takes the skill's model files (the variant's own runtime;
OpenVINO too, which reads ONNX and TFLite files directly), on one real input
each (scikit-image's astronaut and page, espeak-ng's "okay nabu" in 0.5 s
chunks, a sentence):

* ``agent``: one item through the agent's path: the control code in its own
  :class:`~edge_agent.sandbox.SkillProcess` (pipe encoding, pre- and
  post-processing, every model call through the runtime facade); the round trip
  the agent times for telemetry;
* ``bare``: the same model calls, with the very inputs the control code made for
  that item (recorded in-process first), straight on the loaded model;
* ``overhead``: agent / bare, both medians of ``--repeats`` items measured in the
  same run (ratios, not absolute times, carry over to another machine).

It prints a table and writes ``tests/bench/results/skills.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import platform
import shutil
import statistics
import sys
import tempfile
import time
import wave
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from cloud.models.library import LIBRARY, library_skills, materialise_skill
from edge_agent.adapters import load_input
from edge_agent.runtime.facade import Runtime
from edgeskill.skill_runner import running
from skills.manifest import Manifest, ModelVariant
from skills.sdk import InferResult
from tests.skills.library.conftest import Harness, speak

RESULTS = Path(__file__).parent / "results" / "skills.json"
RUNTIMES = {"onnx-cpu": "onnxruntime", "tflite": "litert", "openvino": "openvino"}


def _inputs(work: Path) -> dict[str, dict[str, Any]]:
    """One real item per skill."""
    import skimage  # noqa: PLC0415

    data = Path(skimage.__file__).parent / "data"
    pcm = speak("okay nabu", work / "espeak.wav", lead_s=0.2, tail_s=0.2)
    with wave.open(str(work / "speech.wav"), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes(pcm.astype("<i2").tobytes())
    chunk = load_input(work / "speech.wav").item(1)[0]["audio"]  # 0.5 s inside the word
    photo = load_input(data / "astronaut.png").item(0)[0]
    page = load_input(data / "page.png").item(0)[0]
    return {
        "face-detect": photo,
        "ocr": page,
        "voice-activity": {"audio": chunk},
        "keyword-spot": {"audio": chunk},
        "text-embed": {"text": "A man is playing a guitar on the stage."},
    }


def _with_openvino(root: Path) -> Manifest:
    """The materialised skill with an ``openvino`` variant beside each model file."""
    manifest = Manifest.from_toml((root / "skill.toml").read_text(encoding="utf-8"))
    extra: list[ModelVariant] = []
    covered = {m.model for m in manifest.models if m.target == "openvino"}
    for v in sorted(manifest.models, key=lambda m: m.target != "onnx-cpu"):  # ONNX file first
        if v.model in covered:
            continue
        covered.add(v.model)
        copy = f"models/openvino-{Path(v.path).name}"  # the same file: OpenVINO reads it
        shutil.copyfile(root / v.path, root / copy)
        extra.append(dataclasses.replace(v, target="openvino", path=copy))
    built = dataclasses.replace(manifest, models=(*manifest.models, *extra))
    (root / "skill.toml").write_text(built.to_toml(), encoding="utf-8")
    return built


@dataclasses.dataclass
class _Recorder:
    """A skill context whose models record every call's feeds."""

    skill_dir: Path
    runtime: Runtime
    config: Mapping[str, str]
    logger: logging.Logger = dataclasses.field(default_factory=lambda: logging.getLogger("bench"))
    calls: list[tuple[str, dict[str, np.ndarray]]] = dataclasses.field(default_factory=list)

    def model(self, name: str) -> Any:
        loaded = self.runtime.model(name)
        calls = self.calls

        class Recording:
            def __getattr__(self, attr: str) -> Any:
                return getattr(loaded, attr)

            def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
                calls.append((name, {k: np.array(v) for k, v in feeds.items()}))
                return loaded.run(feeds)

        return Recording()

    def infer(self, model: str, feeds: Mapping[str, np.ndarray]) -> InferResult:
        return InferResult(self.model(model).run(feeds), "device")

    def emit(self, result: Mapping[str, Any]) -> None:
        del result


def _bare_ms(harness: Harness, target: str, item: dict[str, Any], repeats: int) -> float:
    """p50 of the model calls one item makes, replayed straight on the loaded models."""
    runtime = Runtime(harness.root, harness.manifest, (target,))
    context = _Recorder(harness.root, runtime, dict(harness.manifest.config))
    skill = getattr(harness.module(), harness.manifest.entry_class)()
    skill.setup(context)
    context.calls.clear()
    skill.process(item)
    calls = [(runtime.model(name), feeds) for name, feeds in context.calls]
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        for model, feeds in calls:
            model.run(feeds)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def _agent_ms(root: Path, target: str, item: dict[str, Any], repeats: int) -> tuple[float, str]:
    with running(root, (target,)) as proc:
        proc.process(item, timeout=120)  # warm-up: first-call allocations
        times = [proc.process(item, timeout=120)[1] for _ in range(repeats)]
        return statistics.median(times), ", ".join(sorted(proc.models.values()))


def _measure(name: str, root: Path, item: dict[str, Any], repeats: int) -> list[dict[str, Any]]:
    manifest = _with_openvino(root)
    harness = Harness(root, manifest)
    rows = []
    for target in sorted({v.target for v in manifest.models}):
        row: dict[str, Any] = {"skill": name, "backend": RUNTIMES.get(target, target)}
        try:
            row["bare_p50_ms"] = _bare_ms(harness, target, item, repeats)
            row["agent_p50_ms"], row["variant"] = _agent_ms(root, target, item, repeats)
        except Exception as exc:  # a runtime that does not take this model file
            row["error"] = str(exc).splitlines()[0][:160]
        else:
            row["overhead"] = row["agent_p50_ms"] / row["bare_p50_ms"]
        rows.append(row)
    return rows


def _table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="library skills: agent skill runtime vs a bare runtime call (p50, ms)")
    for column in ("skill", "backend", "bare", "agent", "overhead"):
        table.add_column(column, justify="left" if column in ("skill", "backend") else "right")
    for r in rows:
        if "error" in r:
            table.add_row(r["skill"], r["backend"], "-", "-", f"[dim]{r['error'][:50]}[/]")
        else:
            cells = (f"{r['bare_p50_ms']:.2f}", f"{r['agent_p50_ms']:.2f}", f"{r['overhead']:.2f}×")
            table.add_row(r["skill"], r["backend"], *cells)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--skill", action="append", help="Only this skill; repeat for more.")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-skills-") as tmp:
        work = Path(tmp)
        items = _inputs(work)
        for name in args.skill or library_skills():
            materialise_skill(LIBRARY / name, work / name)
            rows += _measure(name, work / name, items[name], args.repeats)
    Console().print(_table(rows))
    meta = {
        "repeats": args.repeats,
        "machine": platform.machine(),
        "python": platform.python_version(),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"meta": meta, "skills": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
