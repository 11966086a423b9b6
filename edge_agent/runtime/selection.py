"""Picking the model variant a device should run: a pure function of its inputs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

from edge_agent.errors import RuntimeBackendError
from edge_agent.runtime.backends import Backend

__all__ = ["VariantLike", "backend_for", "select_variant"]


class VariantLike(Protocol):
    """The part of :class:`skills.manifest.ModelVariant` that selection reads."""

    @property
    def target(self) -> str:
        """The target the variant was built for."""
        ...

    @property
    def precision(self) -> str:
        """The variant's numeric precision (``fp32``, ``int8``, ...)."""
        ...


V = TypeVar("V", bound=VariantLike)


def backend_for(target: str, backends: Sequence[Backend]) -> Backend | None:
    """The first backend that serves ``target`` and is installed, or ``None``."""
    for backend in backends:
        if backend.serves(target) and backend.available():
            return backend
    return None


def select_variant(
    manifest_variants: Sequence[V],
    profile_targets: Sequence[str],
    backends: Sequence[Backend],
    precisions: Sequence[str] = (),
) -> V:
    """Pick the variant for the first target, in the device's order, that can run here.

    Among several variants for the same target (fp32 and int8, say), the device's
    precision preference decides; precisions it does not name, and ties, go by the
    manifest's order: the bundle author orders by preference.

    Args:
        manifest_variants: The variants of one model, as the bundle lists them.
        profile_targets: The device's targets, best first.
        backends: The backends the agent knows.
        precisions: The device's preferred precisions, best first.

    Returns:
        The chosen variant.

    Raises:
        RuntimeBackendError: No variant's target is both in the device's list and
            served by an installed backend; the message lists both sides.
    """
    rank = {p: i for i, p in enumerate(precisions)}
    for target in profile_targets:
        if backend_for(target, backends) is None:
            continue
        fits = [v for v in manifest_variants if v.target == target]
        if fits:
            return min(fits, key=lambda v: rank.get(v.precision, len(rank)))
    bundle_has = sorted({v.target for v in manifest_variants})
    runnable = [t for t in profile_targets if backend_for(t, backends) is not None]
    raise RuntimeBackendError(
        f"no model variant fits this device: the bundle has {bundle_has or 'no variants'}, "
        f"the device can run {runnable or 'nothing'} (profile targets {list(profile_targets)})"
    )
