"""Building, inspecting and installing ``.skill`` bundles.

A bundle named ``<name>-<version>.skill`` is a deterministic gzip-compressed tar of::

    skill.toml        the manifest, with sha256 and size of every model variant filled in
    control/          the control code; the entrypoint module lives here
    models/           model files, one per variant
    drift/...         optional drift reference, where the manifest's [drift] table says
    ...               any other data files

Installation extracts into a staging directory next to the destination, verifies the
content against the manifest, and renames the staging directory into place, so the
destination either appears complete or not at all.
"""

from __future__ import annotations

import hashlib
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

from skills.archive import DEFAULT_LIMITS, ArchiveLimits, read_member, safe_extract, write_archive
from skills.drift_spec import read_reference
from skills.errors import BundleError, ManifestError
from skills.manifest import MAX_MANIFEST_BYTES, Manifest, ModelVariant

__all__ = [
    "BUNDLE_SUFFIX",
    "MANIFEST_NAME",
    "build_bundle",
    "bundle_filename",
    "install_bundle",
    "load_manifest",
    "read_manifest",
    "verify_tree",
]

MANIFEST_NAME = "skill.toml"
BUNDLE_SUFFIX = ".skill"
_CONTROL_DIR = "control"
_CHUNK = 1024 * 1024


def bundle_filename(manifest: Manifest) -> str:
    """Return the file name of the bundle for ``manifest``: ``<name>-<version>.skill``."""
    return f"{manifest.name}-{manifest.version}{BUNDLE_SUFFIX}"


def _regular_file(root: Path, rel: str) -> Path | None:
    """Return ``root/rel`` if it is a regular file (not a link), else ``None``."""
    path = root.joinpath(*rel.split("/"))
    try:
        mode = path.lstat().st_mode
    except OSError:
        return None
    return path if stat.S_ISREG(mode) else None


def _file_digest(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as source:
        while chunk := source.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def _decode_manifest(data: bytes) -> Manifest:
    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{MANIFEST_NAME} is larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{MANIFEST_NAME} is not UTF-8: {exc}") from exc
    return Manifest.from_toml(text)


def load_manifest(root: Path) -> Manifest:
    """The manifest of an unpacked bundle or a source folder, read with the size cap.

    Raises:
        BundleError: ``skill.toml`` is missing or not a regular file.
        ManifestError: It is too large or malformed.
    """
    path = _regular_file(root, MANIFEST_NAME)
    if path is None:
        raise BundleError(f"{MANIFEST_NAME} is missing or not a regular file in {root}")
    if path.stat().st_size > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{MANIFEST_NAME} is larger than {MAX_MANIFEST_BYTES} bytes")
    return _decode_manifest(path.read_bytes())


def _check_layout(root: Path, manifest: Manifest) -> None:
    """Check the entrypoint module and the drift reference file exist under ``root``.

    Raises:
        BundleError: If either is missing.
    """
    module = manifest.entry_module.replace(".", "/")
    candidates = (f"{_CONTROL_DIR}/{module}.py", f"{_CONTROL_DIR}/{module}/__init__.py")
    if not any(_regular_file(root, c) for c in candidates):
        raise BundleError(
            f"entrypoint module {manifest.entry_module!r} not found: expected {candidates[0]}"
            f" or {candidates[1]}"
        )
    drift = manifest.drift
    if drift is not None and _regular_file(root, drift.reference) is None:
        raise BundleError(f"drift reference file {drift.reference!r} is missing")


def _measured(root: Path, variant: ModelVariant) -> ModelVariant:
    path = _regular_file(root, variant.path)
    if path is None:
        raise BundleError(
            f"model file {variant.path!r} ({variant.model}, {variant.target}) is missing"
        )
    sha256, size = _file_digest(path)
    return ModelVariant(
        model=variant.model,
        target=variant.target,
        path=variant.path,
        sha256=sha256,
        size=size,
        precision=variant.precision,
    )


def _filled_in(root: Path, variant: ModelVariant, *, fix_hashes: bool) -> ModelVariant:
    """The variant with its file's sha256 and size; a declared value must match unless fixing.

    Raises:
        BundleError: The file is missing, or ``skill.toml`` declares a sha256 or size the
            file does not have (and ``fix_hashes`` is false).
    """
    actual = _measured(root, variant)
    if fix_hashes:
        return actual
    if variant.sha256 and variant.sha256 != actual.sha256:
        raise BundleError(
            f"{variant.path}: {MANIFEST_NAME} declares sha256 {variant.sha256} but the file's "
            f"is {actual.sha256}; correct {MANIFEST_NAME}, or build with --fix-hashes to use "
            "the file's"
        )
    if variant.size and variant.size != actual.size:
        raise BundleError(
            f"{variant.path}: {MANIFEST_NAME} declares size {variant.size} but the file has "
            f"{actual.size} bytes; correct {MANIFEST_NAME}, or build with --fix-hashes to use "
            "the file's"
        )
    return actual


class _Skipper:
    """Leaves Python caches and, when it lies inside the source, the output folder out."""

    def __init__(self, out_rel: str | None) -> None:
        self._out_rel = out_rel

    def __call__(self, rel: str) -> bool:
        name = rel.rsplit("/", 1)[-1]
        return name == "__pycache__" or name.endswith(".pyc") or rel == self._out_rel


def _build_skipper(src_dir: Path, out_dir: Path) -> _Skipper:
    try:
        inside = out_dir.resolve().relative_to(src_dir.resolve()).as_posix()
    except ValueError:
        inside = None
    return _Skipper(inside)


def build_bundle(
    src_dir: Path,
    out_dir: Path,
    *,
    fix_hashes: bool = False,
    check: Callable[[Path, Manifest], object] | None = None,
) -> Path:
    """Build ``out_dir/<name>-<version>.skill`` from a skill source folder.

    The sha256 and size of every model variant are measured from the files and written
    into the archived ``skill.toml``; ``src_dir`` itself is not modified. A sha256 or
    size that ``skill.toml`` leaves out is filled in; one it declares must match the
    file, unless ``fix_hashes`` says to take the file's. A drift reference the manifest
    declares must be a valid one holding the declared input summaries. The same folder
    always gives the same bytes. ``__pycache__`` folders and ``.pyc`` files are left
    out, and so is ``out_dir`` when it lies inside ``src_dir``.

    Args:
        src_dir: Folder with ``skill.toml``, ``control/``, ``models/`` and data files.
        out_dir: Folder for the bundle; created if missing.
        fix_hashes: Replace a declared sha256 or size that does not match its file.
        check: Called with ``src_dir`` and the completed manifest before anything is
            written (a model check, for instance); what it raises ends the build.

    Returns:
        The path of the written bundle.

    Raises:
        ManifestError: If ``skill.toml`` is invalid.
        BundleError: If ``skill.toml``, a model file, the entrypoint module or the
            drift reference file is missing, or a declared sha256 or size does not match.
        DriftReferenceError: If the drift reference is malformed, over a cap, or does not
            hold the declared input summaries.
        ArchiveError: If the folder holds links or special files, or writing fails.
    """
    manifest = load_manifest(src_dir)
    _check_layout(src_dir, manifest)
    if manifest.drift is not None:
        read_reference(src_dir, manifest.drift)
    built = manifest.with_models(
        [_filled_in(src_dir, v, fix_hashes=fix_hashes) for v in manifest.models]
    )
    if check is not None:
        check(src_dir, built)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / bundle_filename(built)
    write_archive(
        src_dir,
        out,
        overrides={MANIFEST_NAME: built.to_toml().encode("utf-8")},
        skip=_build_skipper(src_dir, out_dir),
    )
    return out


def read_manifest(bundle: Path, limits: ArchiveLimits = DEFAULT_LIMITS) -> Manifest:
    """Read the manifest of a bundle without extracting it.

    Args:
        bundle: The ``.skill`` file.
        limits: Archive caps applied while reading.

    Returns:
        The manifest.

    Raises:
        ArchiveError: If the archive is unreadable or unsafe up to ``skill.toml``.
        BundleError: If the bundle has no ``skill.toml``.
        ManifestError: If ``skill.toml`` is invalid.
    """
    data = read_member(bundle, MANIFEST_NAME, MAX_MANIFEST_BYTES, limits)
    if data is None:
        raise BundleError(f"{bundle.name} has no {MANIFEST_NAME}")
    return _decode_manifest(data)


def verify_tree(root: Path) -> Manifest:
    """Check an extracted bundle against its own manifest.

    Every model variant must be a regular file with the recorded size and sha256; the
    entrypoint module and the drift reference file must exist. The drift reference's
    content is not read here: a device runs a skill whose reference is malformed
    (without drift statistics), and the hub checks it before signing
    (:func:`skills.model_check.check_bundle`).

    Args:
        root: The folder holding the extracted bundle.

    Returns:
        The manifest.

    Raises:
        ManifestError: If ``skill.toml`` is invalid.
        BundleError: If a file is missing, a variant has no recorded hash, or a size or
            hash does not match.
    """
    manifest = load_manifest(root)
    _check_layout(root, manifest)
    for variant in manifest.models:
        if not variant.sha256:
            raise BundleError(f"model file {variant.path!r} has no sha256 in {MANIFEST_NAME}")
        actual = _measured(root, variant)
        if actual.size != variant.size:
            raise BundleError(
                f"model file {variant.path!r} is {actual.size} bytes, manifest says {variant.size}"
            )
        if actual.sha256 != variant.sha256:
            raise BundleError(f"model file {variant.path!r} does not match its sha256")
    return manifest


def install_bundle(bundle: Path, dest: Path, limits: ArchiveLimits = DEFAULT_LIMITS) -> Manifest:
    """Extract and verify a bundle, then move it into place at ``dest`` in one rename.

    The bundle is extracted into ``.staging-<random>`` next to ``dest`` (same file
    system), verified with :func:`verify_tree`, and renamed to ``dest``. On any failure
    the staging directory is removed and ``dest`` is not created. Missing parents of
    ``dest`` are created.

    Args:
        bundle: The ``.skill`` file.
        dest: The install directory; must not exist.
        limits: Archive caps applied while extracting.

    Returns:
        The installed manifest.

    Raises:
        BundleError: If ``dest`` exists, or the content does not match the manifest.
        ArchiveError: If the archive is unreadable, unsafe or over a cap.
        ManifestError: If ``skill.toml`` is invalid.
    """
    if dest.exists() or dest.is_symlink():
        raise BundleError(f"install destination {dest} already exists")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=dest.parent))
    except OSError as exc:
        raise BundleError(f"cannot create a staging directory next to {dest}: {exc}") from exc
    try:
        safe_extract(bundle, staging, limits)
        manifest = verify_tree(staging)
        staging.chmod(0o755)  # mkdtemp makes it 0o700
        staging.rename(dest)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise BundleError(f"cannot install {bundle.name} at {dest}: {exc}") from exc
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return manifest
