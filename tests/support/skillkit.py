"""Test fixtures for skill bundles: a quickly trained digits model, packed into bundles.

This skips the model factory's records on purpose (tests need bundles in
seconds, not lineage); the demo and users go through ``cloud.models``.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.console import Console

from converters.digits import DigitsData, load_digits_data, train_digits
from converters.onnx_export import check_onnx, export_onnx
from converters.quantize import quantize_int8
from skills.archive import safe_extract, write_archive
from skills.bundle import build_bundle
from skills.drift_reference import DriftReference
from skills.drift_spec import write_reference
from skills.manifest import Manifest, ModelVariant

LIBRARY = Path(__file__).resolve().parents[2] / "skills" / "library"


@dataclass(frozen=True)
class TrainedModel:
    """An exported, checked digits model."""

    onnx_path: Path
    accuracy: float
    max_diff: float
    data: DigitsData


def train_digits_onnx(
    out: Path, *, epochs: int = 8, seed: int = 0, console: Console | None = None
) -> TrainedModel:
    """Train the digits CNN, export it to ONNX and check ONNX Runtime against torch.

    Raises:
        ConversionError: the exported model does not match torch.
    """
    console = console or Console()
    data = load_digits_data(seed)
    with console.status("training the digits CNN") as status:

        def on_epoch(epoch: int, loss: float, acc: float) -> None:
            status.update(
                f"training the digits CNN: epoch {epoch}/{epochs}, "
                f"loss {loss:.3f}, val acc {acc:.3f}"
            )

        model, accuracy = train_digits(data, epochs=epochs, seed=seed, on_epoch=on_epoch)
    out.parent.mkdir(parents=True, exist_ok=True)
    export_onnx(model, data.test.x[:1], out)
    max_diff = check_onnx(model, out, data.test.x[:64])
    return TrainedModel(out, accuracy, max_diff, data)


@dataclass(frozen=True)
class VariantFile:
    """A model file for one target and precision."""

    target: str
    precision: str
    path: Path


def quantized_variants(trained: TrainedModel, out_dir: Path) -> list[VariantFile]:
    """The float model and its INT8 (static, calibrated) variant for ONNX Runtime.

    Raises:
        ConverterError: quantisation failed.
    """
    int8 = quantize_int8(
        trained.onnx_path, out_dir / "digits-int8.onnx", trained.data.train.x[:300]
    )
    return [
        VariantFile("onnx-cpu", "fp32", trained.onnx_path),
        VariantFile("onnx-cpu", "int8", int8),
    ]


def build_skill(
    source: Path,
    version: str,
    models: Sequence[VariantFile],
    out_dir: Path,
    *,
    config: dict[str, str] | None = None,
    reference: DriftReference | None = None,
) -> Path:
    """Build a bundle from a skill source folder with the given model files.

    Every file becomes a variant of the model named ``classifier``; a ``reference``
    ships as the bundle's drift reference (declared in ``[drift]``), as the hub's
    model factory ships one.

    Raises:
        SkillError: the source or a model is malformed.
    """
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "src"
        shutil.copytree(source, work, ignore=shutil.ignore_patterns("__pycache__"))
        manifest = Manifest.from_toml((work / "skill.toml").read_text(encoding="utf-8"))
        (work / "models").mkdir(exist_ok=True)
        variants = []
        for v in models:
            rel = f"models/classifier-{v.target}-{v.precision}{v.path.suffix}"
            shutil.copyfile(v.path, work / rel)
            variants.append(
                ModelVariant(model="classifier", target=v.target, path=rel, precision=v.precision)
            )
        manifest = Manifest(
            name=manifest.name,
            version=version,
            entrypoint=manifest.entrypoint,
            description=manifest.description,
            inputs=manifest.inputs,
            outputs=manifest.outputs,
            resources=manifest.resources,
            models=tuple(variants),
            config={**dict(manifest.config), **(config or {})},
            drift=manifest.drift if reference is None else write_reference(work, reference),
        )
        (work / "skill.toml").write_text(manifest.to_toml(), encoding="utf-8")
        return build_bundle(work, out_dir)


def rewrite_bundle(bundle: Path, out: Path, files: Mapping[str, bytes]) -> Path:
    """A copy of ``bundle`` at ``out`` with the content of existing ``files`` replaced.

    What a publisher who skipped :func:`skills.bundle.build_bundle`'s checks ships:
    the manifest still matches, the replaced files need not be valid.

    Raises:
        SkillError: the bundle does not extract, or a name is not in it.
    """
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "bundle"
        safe_extract(bundle, root)
        write_archive(root, out, overrides=files)
    return out


def write_holdout(data: DigitsData, path: Path, limit: int | None = None) -> int:
    """Write the held-out digits as a replay file for agents; returns the sample count."""
    x, y = data.test.x, data.test.y
    if limit is not None:
        x, y = x[:limit], y[:limit]
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, x=x.astype(np.float32), y=y.astype(np.int64))
    return len(x)
