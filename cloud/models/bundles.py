"""Skill bundles from the factory's artefacts, so a published version has lineage.

The artefact files are copied out of the blob store byte for byte, so the
bundle's manifest lists the artefacts' sha256 and
:meth:`cloud.store.models.ModelTables.link_skill_version` finds them once the
version is published. The bundle also ships the model's drift reference
(:meth:`cloud.models.factory.ModelFactory.drift_reference`), so devices can
tell when what they see drifts from what the model was validated on.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from cloud.errors import ValidationError
from cloud.models.errors import FactoryError
from skills.bundle import build_bundle
from skills.drift_spec import DriftSpec, write_reference
from skills.errors import SkillError
from skills.manifest import Manifest, ModelVariant

if TYPE_CHECKING:
    from cloud.models.factory import ModelFactory
    from cloud.store.model_records import ArtifactRecord

__all__ = ["MAX_BUNDLE_ARTIFACTS", "package_skill"]

MAX_BUNDLE_ARTIFACTS = 16


def package_skill(
    factory: ModelFactory,
    source: Path,
    version: str,
    artifacts: Sequence[ArtifactRecord],
    out_dir: Path,
    *,
    model: str = "classifier",
) -> Path:
    """Build a skill bundle from a skill source folder and checked artefacts.

    Every artefact becomes a variant of ``model`` (precision ``int8`` when its
    variant is quantised, else ``fp32``); the source folder is not modified.
    Unless the source declares a drift reference of its own (``[drift]``), the
    bundle ships the first artefact's model's reference at
    ``drift/reference.json``; a model without held-out data ships none.

    Args:
        factory: The factory holding the artefacts' blobs.
        source: Skill source folder with ``skill.toml`` and ``control/``.
        version: The version the bundle gets.
        artifacts: 1 to ``MAX_BUNDLE_ARTIFACTS`` artefacts, each a distinct target and precision.
        out_dir: Folder for the bundle.

    Returns:
        The bundle's path.

    Raises:
        ValidationError: No or too many artefacts.
        NotFoundError: An artefact's variant does not exist.
        BlobError: An artefact's file or its model's ONNX export is missing or corrupt.
        FactoryError: The source or the assembled bundle is malformed, or the model's
            drift reference cannot be built.
        StoreError: The store failed.
    """
    if not 1 <= len(artifacts) <= MAX_BUNDLE_ARTIFACTS:
        raise ValidationError(f"a bundle ships 1..{MAX_BUNDLE_ARTIFACTS} artefacts")
    with tempfile.TemporaryDirectory(prefix="edgeskill-package-") as tmp:
        work = Path(tmp) / "src"
        try:
            shutil.copytree(source, work, ignore=shutil.ignore_patterns("__pycache__"))
            manifest = Manifest.from_toml((work / "skill.toml").read_text(encoding="utf-8"))
        except (OSError, SkillError) as exc:
            raise FactoryError(f"cannot read the skill source {source}: {exc}") from exc
        variants = [_export(factory, a, model, work) for a in artifacts]
        drift = manifest.drift or _reference(factory, artifacts[0], work)
        try:
            built = dataclasses.replace(
                manifest, version=version, models=tuple(variants), drift=drift
            )
            (work / "skill.toml").write_text(built.to_toml(), encoding="utf-8")
            return build_bundle(work, out_dir)
        except (OSError, SkillError) as exc:
            raise FactoryError(f"cannot build the {manifest.name} bundle: {exc}") from exc


def _export(
    factory: ModelFactory, artifact: ArtifactRecord, model: str, work: Path
) -> ModelVariant:
    variant = factory.tables.get_variant(artifact.variant_id)
    precision = "int8" if variant.quantized else "fp32"
    # The first file is the one the runtime opens; the rest sit beside it under the
    # same stem (OpenVINO reads ``x.bin`` next to ``x.xml``), so every file ships.
    stem = f"models/{model}-{artifact.target}-{precision}"
    for file in artifact.files:
        factory.export_blob(file.sha256, work / f"{stem}{Path(file.name).suffix}")
    rel = f"{stem}{Path(artifact.files[0].name).suffix}"
    return ModelVariant(model=model, target=artifact.target, path=rel, precision=precision)


def _reference(factory: ModelFactory, artifact: ArtifactRecord, work: Path) -> DriftSpec | None:
    """Write the drift reference of ``artifact``'s model into ``work``; its ``[drift]`` table.

    Raises:
        FactoryError: The reference cannot be built or written.
    """
    variant = factory.tables.get_variant(artifact.variant_id)
    reference = factory.drift_reference(variant.model_id)
    if reference is None:
        return None
    try:
        return write_reference(work, reference)
    except (OSError, SkillError) as exc:
        raise FactoryError(f"cannot write the drift reference: {exc}") from exc
