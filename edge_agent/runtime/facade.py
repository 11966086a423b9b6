"""The runtime facade: loads each model's best variant for this device, once."""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from edge_agent.errors import RuntimeBackendError
from edge_agent.runtime.backends import Backend, LoadedModel, default_backends
from edge_agent.runtime.selection import backend_for, select_variant

if TYPE_CHECKING:
    from skills.manifest import Manifest, ModelVariant

__all__ = ["Runtime"]

_log = logging.getLogger(__name__)

_HASH_CHUNK = 1 << 20


class Runtime:
    """Models of one installed skill version, as this device should run them.

    Args:
        skill_dir: The installed version's folder; variant paths are relative to it.
        manifest: The version's manifest.
        profile_targets: The device's targets, best first.
        backends: The backends to choose from; all known ones by default.
        precisions: The device's preferred precisions, best first.
        providers: The device profile's ONNX Runtime providers, best first, for the
            default backends (ignored when ``backends`` is given).
    """

    def __init__(
        self,
        skill_dir: Path,
        manifest: Manifest,
        profile_targets: Sequence[str],
        *,
        backends: Sequence[Backend] | None = None,
        precisions: Sequence[str] = (),
        providers: Sequence[str] = (),
    ) -> None:
        self._skill_dir = skill_dir.resolve()
        self._manifest = manifest
        self._targets = tuple(profile_targets)
        self._precisions = tuple(precisions)
        if backends is None:
            backends = default_backends(providers) if providers else default_backends()
        self._backends = list(backends)
        self._models: dict[str, LoadedModel] = {}
        self._lock = threading.Lock()

    @property
    def loaded(self) -> Mapping[str, LoadedModel]:
        """The models loaded so far, by name (for status reports)."""
        return dict(self._models)

    def model(self, name: str) -> LoadedModel:
        """Load (on first use) and return model ``name``'s best variant for this device.

        Args:
            name: The model's name in the manifest.

        Returns:
            The loaded model.

        Raises:
            RuntimeBackendError: The manifest has no such model, no variant fits this
                device, the variant's file is missing or does not match the manifest,
                or the backend could not load it.
        """
        with self._lock:
            if name not in self._models:
                self._models[name] = self._load(name)
            return self._models[name]

    def _load(self, name: str) -> LoadedModel:
        variants = tuple(self._manifest.variants(name))
        if not variants:
            known = sorted({v.model for v in self._manifest.models})
            raise RuntimeBackendError(f"the manifest has no model {name!r} (it has {known})")
        try:
            variant = select_variant(variants, self._targets, self._backends, self._precisions)
        except RuntimeBackendError as exc:
            raise RuntimeBackendError(f"model {name!r}: {exc}") from exc
        backend = backend_for(variant.target, self._backends)
        if backend is None:  # select_variant checked this; kept for the type checker
            raise RuntimeBackendError(f"no backend for target {variant.target!r}")
        path = self._verified_file(name, variant)
        model = backend.load(path, variant.target, name=name)
        model.precision = variant.precision
        _log.info(
            "model %s: variant %s (%s) on %s/%s",
            name,
            variant.target,
            variant.precision,
            model.backend,
            model.provider,
        )
        return model

    def _verified_file(self, name: str, variant: ModelVariant) -> Path:
        """The variant's file, inside the skill and matching the manifest's size and sha256.

        A variant without a sha256 (a source folder before ``skill build``) is only
        checked to exist inside the skill.
        """
        path = (self._skill_dir / variant.path).resolve()
        if not path.is_relative_to(self._skill_dir):
            raise RuntimeBackendError(f"model {name!r}: path {variant.path!r} leaves the skill")
        try:
            size = path.stat().st_size
        except OSError as exc:
            raise RuntimeBackendError(f"model {name!r}: cannot read {variant.path}: {exc}") from exc
        if not variant.sha256:  # an unbuilt source folder: nothing to check against
            return path
        if size != variant.size:
            raise RuntimeBackendError(
                f"model {name!r}: {variant.path} has {size} bytes, the manifest says {variant.size}"
            )
        if _sha256(path) != variant.sha256:
            raise RuntimeBackendError(f"model {name!r}: {variant.path} does not match its sha256")
        return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    try:
        with path.open("rb") as handle:
            while chunk := handle.read(_HASH_CHUNK):
                digest.update(chunk)
    except OSError as exc:
        raise RuntimeBackendError(f"cannot read {path.name}: {exc}") from exc
    return digest.hexdigest()
