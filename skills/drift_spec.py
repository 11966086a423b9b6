"""The manifest's ``[drift]`` table: a bundle's drift reference and what it summarises.

A skill version may ship the statistics its live predictions are compared with
on the device (:mod:`skills.drift_reference`), at a path in the bundle::

    [drift]
    reference = "drift/reference.json"  # a DriftReference document, path in the bundle
    inputs = ["brightness"]             # input summaries it holds, up to MAX_DRIFT_INPUTS

What the agent compares comes from the control code's result for each item:
the predicted class under ``label``, its top-class confidence under
``confidence`` and, for the declared input summaries, ``summaries`` (a mapping
of summary name to number). A result without ``label`` and ``confidence`` is
not counted; a summary not declared here is ignored.

The table is validated like the rest of the manifest (a bundle is hostile): the
path is a safe bundle path to a ``.json`` file, the inputs are a short list of
unique names that fit the agent's telemetry metric names. The document itself
is checked by :func:`read_reference`: size-capped, parsed defensively, and its
input summaries must be exactly the declared ones.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skills._fields import Table, check_bundle_path, check_pattern, fail, located
from skills.drift_limits import DEFAULT_LIMITS, ReferenceLimits
from skills.errors import DriftReferenceError

if TYPE_CHECKING:
    from skills.drift_reference import DriftReference

__all__ = [
    "DEFAULT_REFERENCE_PATH",
    "DRIFT_INPUT_PATTERN",
    "MAX_DRIFT_INPUTS",
    "DriftSpec",
    "drift_from",
    "drift_table",
    "read_reference",
    "write_reference",
]

#: Input summaries a bundle may declare: each becomes two telemetry metrics per window.
MAX_DRIFT_INPUTS = 8
#: A summary's name; ``drift.ks_p.<name>`` must stay a valid metric name (64 characters).
DRIFT_INPUT_PATTERN = re.compile(r"[a-z][a-z0-9_]{0,31}")
#: Where :func:`write_reference` puts a reference in a skill source folder.
DEFAULT_REFERENCE_PATH = "drift/reference.json"


@dataclass(frozen=True)
class DriftSpec:
    """Where a bundle's drift reference lies and which input summaries it holds.

    Attributes:
        reference: Bundle path of the reference JSON document.
        inputs: Names of the input summaries the reference holds (and the control
            code reports), unique, at most :data:`MAX_DRIFT_INPUTS`.
    """

    reference: str
    inputs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        """Validate the fields.

        Raises:
            ManifestError: A field is invalid; the message names it.
        """
        path = check_bundle_path(self.reference, "reference")
        if not path.endswith(".json"):
            raise fail("reference", f"{path!r} must be a .json file")
        inputs = self.inputs
        if not isinstance(inputs, tuple | list) or len(inputs) > MAX_DRIFT_INPUTS:
            raise fail("inputs", f"must be a list of at most {MAX_DRIFT_INPUTS} names")
        for name in inputs:
            check_pattern(name, "inputs", DRIFT_INPUT_PATTERN)
        if len(set(inputs)) != len(inputs):
            raise fail("inputs", "names must be unique")
        object.__setattr__(self, "inputs", tuple(inputs))


def drift_from(raw: object, where: str = "drift") -> DriftSpec:
    """Read the ``[drift]`` table.

    Raises:
        ManifestError: Unknown or mistyped keys, or an invalid field.
    """
    table = Table(raw, where)
    reference = table.get("reference", str)
    inputs = table.get("inputs", list, [])
    table.done()
    with located(where):
        return DriftSpec(reference=reference, inputs=tuple(inputs))


def drift_table(spec: DriftSpec) -> dict[str, Any]:
    """The ``[drift]`` table of ``spec``, for ``to_toml``."""
    return {"reference": spec.reference, "inputs": list(spec.inputs)}


def _read_capped(path: Path, rel: str, max_bytes: int) -> bytes:
    """The bytes of a regular file (no link, no device or pipe) of at most ``max_bytes``.

    Raises:
        DriftReferenceError: It is missing, not a regular file, larger, or unreadable.
    """
    what = f"drift reference {rel!r}"
    try:
        # No link followed, and a pipe does not block the open: the type is checked on
        # the opened file, so nothing can be swapped in between.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise DriftReferenceError(f"cannot open {what}: {exc.strerror or exc}") from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise DriftReferenceError(f"{what} is not a regular file")
        data = _read_fd(fd, max_bytes + 1)
    except OSError as exc:
        raise DriftReferenceError(f"cannot read {what}: {exc}") from exc
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise DriftReferenceError(f"{what} is over the cap of {max_bytes} bytes")
    return data


def _read_fd(fd: int, limit: int) -> bytes:
    """Up to ``limit`` bytes from ``fd``, to its end."""
    chunks: list[bytes] = []
    size = 0
    while size < limit and (chunk := os.read(fd, min(1 << 16, limit - size))):
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def read_reference(
    root: Path, spec: DriftSpec, limits: ReferenceLimits = DEFAULT_LIMITS
) -> DriftReference:
    """Read and check the drift reference of the bundle tree at ``root``.

    Args:
        root: An extracted bundle, or a skill source folder.
        spec: Its manifest's ``[drift]`` table.
        limits: Caps on the document.

    Returns:
        The reference, holding exactly the declared input summaries.

    Raises:
        DriftReferenceError: The file is missing, outside ``root``, not a regular
            file, over ``limits.max_bytes``, not a valid reference, or its input
            summaries are not the declared ones.
    """
    # Numpy with it: a manifest is read while idle, a reference only when a skill starts.
    from skills.drift_reference import DriftReference  # noqa: PLC0415

    path = root.joinpath(*spec.reference.split("/"))
    if not path.resolve().is_relative_to(root.resolve()):  # a linked folder on the way
        raise DriftReferenceError(f"drift reference {spec.reference!r} leaves the bundle")
    data = _read_capped(path, spec.reference, limits.max_bytes)
    reference = DriftReference.from_json(data, limits)
    held = sorted(item.name for item in reference.inputs)
    if held != sorted(spec.inputs):
        raise DriftReferenceError(
            f"drift reference {spec.reference!r} holds input summaries {held}, "
            f"the manifest declares {sorted(spec.inputs)}"
        )
    return reference


def write_reference(
    root: Path, reference: DriftReference, rel: str = DEFAULT_REFERENCE_PATH
) -> DriftSpec:
    """Write ``reference`` into the skill source folder ``root``; the table declaring it.

    Args:
        root: The skill source folder.
        reference: The reference, as :func:`~skills.drift_reference.build_reference` made it.
        rel: Its bundle path.

    Returns:
        The ``[drift]`` table naming the file and the reference's input summaries.

    Raises:
        ManifestError: ``rel`` or an input summary's name is not allowed in a manifest.
        DriftReferenceError: The reference is over the default caps.
        OSError: The file cannot be written.
    """
    spec = DriftSpec(rel, tuple(item.name for item in reference.inputs))
    reference.check_limits()
    path = root.joinpath(*rel.split("/"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(reference.to_json(), encoding="utf-8")
    return spec
