"""The skill manifest, ``skill.toml``: what a skill is, what it needs and which models it ships.

Every dataclass here is frozen and validates itself on construction, so a ``Manifest``
object is always a valid one. :meth:`Manifest.from_toml` adds type checks on the raw
TOML and rejects unknown tables and keys, so that a typo fails loudly instead of being
silently ignored. Errors name the field, e.g. ``models[1]: path 'x.onnx' must be inside models/``.

TOML layout (only ``[skill]`` and its first three keys are required)::

    [skill]
    name = "face-detect"                # ^[a-z][a-z0-9-]{0,62}$
    version = "1.2.0"                   # MAJOR.MINOR.PATCH[-pre]
    entrypoint = "detector:FaceDetect"  # module under control/ (dotted), then the class
    description = "Finds faces"

    [resources]                         # every key optional
    memory_mb = 1024
    cpu_seconds = 0                     # 0 = unlimited
    startup_timeout_s = 30.0
    max_open_files = 256
    max_processes = 0                   # processes and threads; 0 = the device owner's cap
    network = false                     # true: the control code may open sockets

    [config]                            # default config: string keys, string values
    threshold = "0.5"

    [[inputs]]                          # up to 64; [[outputs]] alike
    name = "image"
    dtype = "float32"
    shape = [1, 3, -1, -1]              # -1 = dynamic dimension

    [[models]]                          # up to 64 variants
    model = "detector"                  # the name control code asks the runtime for
    target = "onnx-cpu"                 # one of KNOWN_TARGETS
    path = "models/detector-cpu.onnx"   # relative, inside models/
    sha256 = "..."                      # filled in by build_bundle
    size = 163000                       # filled in by build_bundle
    precision = "fp32"                  # one of KNOWN_PRECISIONS

    [[split]]                           # optional, up to 16; see skills.split_spec
    model = "detector"
    plan = "models/detector/split.json"
    codec = "fp16"
    deadline_ms = 1000

    [[joint]]                           # optional, up to 16; see skills.split_spec
    small = "detector-small"
    big = "detector"
    measure = "entropy"
    threshold = 0.5
    deadline_ms = 1000

    [drift]                             # optional; see skills.drift_spec
    reference = "drift/reference.json"  # the drift reference (skills.drift_reference)
    inputs = ["brightness"]             # the input summaries it holds, up to 8
"""

from __future__ import annotations

import functools
import keyword
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from types import MappingProxyType
from typing import Any

import tomli_w

from skills._fields import (
    Table,
    check_bundle_path,
    check_choice,
    check_int,
    check_pattern,
    check_str,
    fail,
    located,
    parse_version,
    table_list,
)
from skills.drift_spec import DriftSpec, drift_from, drift_table
from skills.errors import ManifestError
from skills.split_spec import (
    MAX_JOINTS,
    MAX_SPLITS,
    JointSpec,
    SplitSpec,
    check_splits_and_joints,
    joint_from,
    joint_table,
    split_from,
    split_table,
)

__all__ = [
    "KNOWN_DTYPES",
    "KNOWN_PRECISIONS",
    "KNOWN_TARGETS",
    "MAX_MANIFEST_BYTES",
    "DriftSpec",
    "JointSpec",
    "Manifest",
    "ModelVariant",
    "Resources",
    "SplitSpec",
    "TensorSpec",
    "check_bundle_path",
    "parse_version",
]

MAX_MANIFEST_BYTES = 64 * 1024
MAX_VARIANTS = 64
MAX_TENSORS = 64
MAX_RANK = 8
MAX_CONFIG_KEYS = 64
MAX_CONFIG_VALUE_CHARS = 1024
MAX_DESCRIPTION_CHARS = 4096
MAX_MODEL_BYTES = 1 << 40

KNOWN_TARGETS = ("onnx-cpu", "onnx-cuda", "onnx-tensorrt", "onnx-cann", "om", "tflite", "openvino")
KNOWN_DTYPES = (
    "float32", "float16", "bfloat16", "float64", "int8", "uint8",
    "int16", "uint16", "int32", "int64", "bool", "string",
)  # fmt: skip
KNOWN_PRECISIONS = ("fp32", "fp16", "bf16", "int8", "int4", "mixed")

_NAME_RE = re.compile(r"[a-z][a-z0-9-]{0,62}")
_MODEL_RE = re.compile(r"[a-z][a-z0-9_-]{0,62}")
# Printable ASCII without spaces, because ONNX names look like "onnx::Conv_3" or "/head/Relu".
_TENSOR_RE = re.compile(r"[!-~]{1,128}")
_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CONFIG_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_MAX_DIM = 2**31 - 1


def _check_entrypoint(value: object) -> str:
    text = check_str(value, "entrypoint", 256)
    module, sep, cls = text.partition(":")
    parts = [*module.split("."), cls]
    if not sep or not all(_IDENT_RE.fullmatch(p) and not keyword.iskeyword(p) for p in parts):
        raise fail("entrypoint", f"{text!r} must look like 'package.module:ClassName'")
    return text


@dataclass(frozen=True)
class TensorSpec:
    """One named input or output tensor.

    Attributes:
        name: Tensor name (printable ASCII, no spaces, up to 128 characters).
        dtype: One of ``KNOWN_DTYPES``.
        shape: Dimensions; ``-1`` marks a dynamic one.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        """Validate the fields.

        Raises:
            ManifestError: If a field is invalid.
        """
        check_pattern(self.name, "name", _TENSOR_RE)
        check_choice(self.dtype, "dtype", KNOWN_DTYPES)
        if not isinstance(self.shape, tuple | list) or len(self.shape) > MAX_RANK:
            raise fail("shape", f"must be a list of at most {MAX_RANK} dimensions")
        for dim in self.shape:
            if check_int(dim, "shape", -1, _MAX_DIM) == 0:
                raise fail("shape", "dimensions are -1 (dynamic) or positive")
        object.__setattr__(self, "shape", tuple(self.shape))


@dataclass(frozen=True)
class Resources:
    """Resource limits for the skill's control process.

    Attributes:
        memory_mb: Resident-memory cap in MiB of the control process and everything it
            starts, enforced as asked (the agent kills the skill above it). There is no
            floor: the interpreter and numpy alone keep ~30 MiB resident and ONNX Runtime
            ~60 MiB more, so a value below ~100 fails the health check of most skills.
        cpu_seconds: CPU time cap; 0 means unlimited.
        startup_timeout_s: Time the skill has to become ready.
        max_open_files: Cap on open file descriptors.
        max_processes: Cap on the processes and threads the skill may run at once; 0 asks
            for the device owner's cap.
        network: Whether the control code may use the network; without it, it runs in an
            empty network namespace where the device allows one.

    Every limit can only lower what the device owner allows: the agent clamps a larger
    value to the owner's cap and says so in the skill's state.
    """

    memory_mb: int = 1024
    cpu_seconds: int = 0
    startup_timeout_s: float = 30.0
    max_open_files: int = 256
    max_processes: int = 0
    network: bool = False

    def __post_init__(self) -> None:
        """Validate the fields.

        Raises:
            ManifestError: If a field is out of range or of the wrong type.
        """
        check_int(self.memory_mb, "memory_mb", 1, 1 << 20)
        check_int(self.cpu_seconds, "cpu_seconds", 0, 366 * 24 * 3600)
        check_int(self.max_open_files, "max_open_files", 16, 1 << 20)
        check_int(self.max_processes, "max_processes", 0, 1 << 20)
        if not isinstance(self.network, bool):
            raise fail("network", f"expected a boolean, got {type(self.network).__name__}")
        timeout = self.startup_timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            raise fail("startup_timeout_s", f"expected a number, got {type(timeout).__name__}")
        if not 0 < timeout <= 3600:
            raise fail("startup_timeout_s", f"{timeout} is outside (0, 3600]")
        object.__setattr__(self, "startup_timeout_s", float(timeout))


@dataclass(frozen=True)
class ModelVariant:
    """One file of one model, built for one target.

    Attributes:
        model: Logical model name the control code asks for.
        target: Runtime and accelerator, one of ``KNOWN_TARGETS``.
        path: File inside the bundle, under ``models/``.
        sha256: Lower-case hex digest of the file, or ``""`` before the bundle is built.
        size: File size in bytes (0 before the bundle is built).
        precision: One of ``KNOWN_PRECISIONS``.
    """

    model: str
    target: str
    path: str
    sha256: str = ""
    size: int = 0
    precision: str = "fp32"

    def __post_init__(self) -> None:
        """Validate the fields.

        Raises:
            ManifestError: If a field is invalid or the path leaves ``models/``.
        """
        check_pattern(self.model, "model", _MODEL_RE)
        check_choice(self.target, "target", KNOWN_TARGETS)
        path = check_bundle_path(self.path, "path")
        if not path.startswith("models/"):
            raise fail("path", f"{path!r} must be inside models/")
        sha = check_str(self.sha256, "sha256", 64)
        if sha and _SHA256_RE.fullmatch(sha) is None:
            raise fail("sha256", "must be 64 lower-case hex digits or empty")
        check_int(self.size, "size", 0, MAX_MODEL_BYTES)
        check_choice(self.precision, "precision", KNOWN_PRECISIONS)


def _freeze_config(config: object) -> Mapping[str, str]:
    if not isinstance(config, Mapping):
        raise fail("config", f"expected a table, got {type(config).__name__}")
    if len(config) > MAX_CONFIG_KEYS:
        raise fail("config", f"more than {MAX_CONFIG_KEYS} keys")
    for key, value in config.items():
        check_pattern(key, "config key", _CONFIG_KEY_RE)
        check_str(value, f"config.{key}", MAX_CONFIG_VALUE_CHARS)
    return MappingProxyType(dict(config))


def _check_tensors(specs: object, where: str) -> tuple[TensorSpec, ...]:
    if not isinstance(specs, tuple | list) or len(specs) > MAX_TENSORS:
        raise fail(where, f"must be a list of at most {MAX_TENSORS} tensors")
    if not all(isinstance(s, TensorSpec) for s in specs):
        raise fail(where, "items must be TensorSpec")
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise fail(where, "tensor names must be unique")
    return tuple(specs)


def _check_variants(models: object) -> tuple[ModelVariant, ...]:
    if not isinstance(models, tuple | list) or len(models) > MAX_VARIANTS:
        raise fail("models", f"must be a list of at most {MAX_VARIANTS} variants")
    if not all(isinstance(m, ModelVariant) for m in models):
        raise fail("models", "items must be ModelVariant")
    keys = [(m.model, m.target, m.precision) for m in models]
    if len(set(keys)) != len(keys):
        raise fail("models", "two variants share model, target and precision")
    paths = [m.path for m in models]
    if len(set(paths)) != len(paths):
        raise fail("models", "two variants share a path")
    return tuple(models)


@functools.lru_cache(maxsize=16)  # texts of at most MAX_MANIFEST_BYTES: 1 MiB in all
def _parsed(text: str) -> Manifest:
    """The manifest of ``text``, kept for the last texts parsed.

    An agent reads the same manifest when it unpacks a version, checks its tree
    and launches it; tomllib is pure Python and the validation walks every field,
    about 160 us a parse of a 1 KB manifest. A manifest is immutable all
    the way down (tuples and read-only mappings), so one parse can be shared; a
    text that fails raises again each time (errors are not cached).
    """
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(f"skill.toml is not valid TOML: {exc}") from exc
    return _manifest_from_doc(doc)


@dataclass(frozen=True)
class Manifest:
    """A validated ``skill.toml``.

    Attributes:
        name: Skill name, ``^[a-z][a-z0-9-]{0,62}$``.
        version: Semantic version, see :func:`parse_version`.
        entrypoint: ``module.path:ClassName``; the module lives under ``control/``.
        description: Free text.
        inputs: Input tensors.
        outputs: Output tensors.
        resources: Limits for the control process.
        models: Model variants shipped in ``models/``.
        config: Default configuration (read-only mapping).
        splits: Models shipped as segments for split inference (``[[split]]``).
        joints: Small/big model pairs for joint inference (``[[joint]]``).
        drift: Where the drift reference lies and what it summarises (``[drift]``),
            if the bundle ships one.
    """

    name: str
    version: str
    entrypoint: str
    description: str = ""
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()
    resources: Resources = field(default_factory=Resources)
    models: tuple[ModelVariant, ...] = ()
    # Excluded from the hash because a mapping is unhashable; equality still compares it.
    config: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    splits: tuple[SplitSpec, ...] = ()
    joints: tuple[JointSpec, ...] = ()
    drift: DriftSpec | None = None

    def __post_init__(self) -> None:
        """Validate every field.

        Raises:
            ManifestError: If a field is invalid; the message names it.
        """
        check_pattern(self.name, "name", _NAME_RE)
        parse_version(self.version)
        _check_entrypoint(self.entrypoint)
        check_str(self.description, "description", MAX_DESCRIPTION_CHARS)
        if not isinstance(self.resources, Resources):
            raise fail("resources", "must be a Resources")
        if self.drift is not None and not isinstance(self.drift, DriftSpec):
            raise fail("drift", "must be a DriftSpec")
        object.__setattr__(self, "inputs", _check_tensors(self.inputs, "inputs"))
        object.__setattr__(self, "outputs", _check_tensors(self.outputs, "outputs"))
        object.__setattr__(self, "models", _check_variants(self.models))
        object.__setattr__(self, "config", _freeze_config(self.config))
        splits, joints = check_splits_and_joints(self.splits, self.joints)
        object.__setattr__(self, "splits", splits)
        object.__setattr__(self, "joints", joints)

    @property
    def entry_module(self) -> str:
        """The dotted module part of :attr:`entrypoint`."""
        return self.entrypoint.partition(":")[0]

    @property
    def entry_class(self) -> str:
        """The class name part of :attr:`entrypoint`."""
        return self.entrypoint.partition(":")[2]

    def variants(self, model: str) -> tuple[ModelVariant, ...]:
        """Return the variants of one logical model, in manifest order."""
        return tuple(v for v in self.models if v.model == model)

    def split_for(self, model: str) -> SplitSpec | None:
        """The ``[[split]]`` declaration of ``model``, if it has one."""
        return next((s for s in self.splits if s.model == model), None)

    def joint_for(self, small: str) -> JointSpec | None:
        """The ``[[joint]]`` pair whose small model is ``small``, if there is one."""
        return next((j for j in self.joints if j.small == small), None)

    def with_models(self, models: Sequence[ModelVariant]) -> Manifest:
        """Return a copy with ``models`` replaced.

        Raises:
            ManifestError: If the new variants are invalid together.
        """
        return replace(self, models=tuple(models))

    @classmethod
    def from_toml(cls, text: str) -> Manifest:
        """Parse and validate ``skill.toml`` text.

        Args:
            text: The TOML document, at most ``MAX_MANIFEST_BYTES`` of UTF-8.

        Returns:
            The manifest.

        Raises:
            ManifestError: If the text is too large, not TOML, has unknown or mistyped
                keys, or any field is invalid. The message names the field.
        """
        if not isinstance(text, str):
            raise ManifestError("skill.toml must be given as text")
        if len(text.encode("utf-8", "surrogatepass")) > MAX_MANIFEST_BYTES:
            raise ManifestError(f"skill.toml is larger than {MAX_MANIFEST_BYTES} bytes")
        return _parsed(text)

    def to_toml(self) -> str:
        """Render the manifest in the layout described in this module's docstring.

        Raises:
            ManifestError: If the result would exceed ``MAX_MANIFEST_BYTES``.
        """
        skill: dict[str, Any] = {
            "name": self.name,
            "version": self.version,
            "entrypoint": self.entrypoint,
            "description": self.description,
        }
        doc: dict[str, Any] = {"skill": skill, "resources": asdict(self.resources)}
        if self.config:
            doc["config"] = dict(self.config)
        for key, specs in (("inputs", self.inputs), ("outputs", self.outputs)):
            if specs:
                doc[key] = [
                    {"name": s.name, "dtype": s.dtype, "shape": list(s.shape)} for s in specs
                ]
        if self.models:
            doc["models"] = [asdict(m) for m in self.models]
        if self.splits:
            doc["split"] = split_table(self.splits)
        if self.joints:
            doc["joint"] = joint_table(self.joints)
        if self.drift is not None:
            doc["drift"] = drift_table(self.drift)
        text = tomli_w.dumps(doc)
        if len(text.encode("utf-8")) > MAX_MANIFEST_BYTES:
            raise ManifestError(f"manifest renders larger than {MAX_MANIFEST_BYTES} bytes")
        return text


def _tensor_from(raw: object, where: str) -> TensorSpec:
    table = Table(raw, where)
    name = table.get("name", str)
    dtype = table.get("dtype", str)
    shape = table.get("shape", list)
    table.done()
    with located(where):
        return TensorSpec(name=name, dtype=dtype, shape=tuple(shape))


def _variant_from(raw: object, where: str) -> ModelVariant:
    table = Table(raw, where)
    fields = {
        "model": table.get("model", str),
        "target": table.get("target", str),
        "path": table.get("path", str),
        "sha256": table.get("sha256", str, ""),
        "size": table.get("size", int, 0),
        "precision": table.get("precision", str, "fp32"),
    }
    table.done()
    with located(where):
        return ModelVariant(**fields)


def _resources_from(raw: object) -> Resources:
    table = Table(raw, "resources")
    defaults = Resources()
    resources = {
        "memory_mb": table.get("memory_mb", int, defaults.memory_mb),
        "cpu_seconds": table.get("cpu_seconds", int, defaults.cpu_seconds),
        "startup_timeout_s": table.get(
            "startup_timeout_s", (int, float), defaults.startup_timeout_s
        ),
        "max_open_files": table.get("max_open_files", int, defaults.max_open_files),
        "max_processes": table.get("max_processes", int, defaults.max_processes),
        "network": table.get("network", bool, defaults.network),
    }
    table.done()
    with located("resources"):
        return Resources(**resources)


def _manifest_from_doc(doc: dict[str, Any]) -> Manifest:
    top = Table(doc, "skill.toml")
    skill = Table(top.get("skill", dict), "skill")
    head = {
        "name": skill.get("name", str),
        "version": skill.get("version", str),
        "entrypoint": skill.get("entrypoint", str),
        "description": skill.get("description", str, ""),
    }
    skill.done()
    config = Table(top.get("config", dict, {}), "config").all_of(str)
    inputs = [
        _tensor_from(t, f"inputs[{i}]")
        for i, t in enumerate(table_list(top, "inputs", MAX_TENSORS))
    ]
    outputs = [
        _tensor_from(t, f"outputs[{i}]")
        for i, t in enumerate(table_list(top, "outputs", MAX_TENSORS))
    ]
    models = [
        _variant_from(t, f"models[{i}]")
        for i, t in enumerate(table_list(top, "models", MAX_VARIANTS))
    ]
    splits = [
        split_from(t, f"split[{i}]") for i, t in enumerate(table_list(top, "split", MAX_SPLITS))
    ]
    joints = [
        joint_from(t, f"joint[{i}]") for i, t in enumerate(table_list(top, "joint", MAX_JOINTS))
    ]
    resources = _resources_from(top.get("resources", dict, {}))
    drift_raw = top.get("drift", dict, None)
    drift = None if drift_raw is None else drift_from(drift_raw)
    top.done()
    return Manifest(
        **head,
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        resources=resources,
        models=tuple(models),
        config=config,
        splits=tuple(splits),
        joints=tuple(joints),
        drift=drift,
    )
