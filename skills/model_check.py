"""Check a skill's models before its bundle is signed: each variant loads and runs once.

A bundle's signature tells devices the hub vouches for it, so the hub first
loads every model variant in the runtime its target names and runs it on one
sample input. ONNX files (targets ``onnx-cpu``, ``onnx-cuda``, ``onnx-tensorrt``,
``onnx-cann``) go through ONNX Runtime's CPU provider, OpenVINO IR through
OpenVINO in f32, ``.tflite`` files through LiteRT.

The sample input is shaped by the manifest: a model input takes the shape of
the manifest input of the same name, or of the manifest's only input when the
model has one input too; a ``-1`` in the manifest takes the model's own size
there, or 1. A model input the manifest does not describe takes the model's
own signature with its dynamic dimensions set to 1. A manifest shape the model
cannot take is an error.

Some variants cannot run here: Ascend ``om`` files and TensorRT engines need
their own hardware, and a runtime may not be installed. Such variants are
refused unless their target is named in ``unchecked_targets``; that never
skips a variant that can be checked.

The runtimes are imported only when a variant needs them; torch never is.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import tempfile
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from skills.archive import DEFAULT_LIMITS, ArchiveLimits, safe_extract
from skills.bundle import verify_tree
from skills.drift_spec import read_reference
from skills.errors import BundleError, ManifestError
from skills.manifest import KNOWN_TARGETS, Manifest, ModelVariant, TensorSpec

__all__ = [
    "ModelCheckError",
    "check_bundle",
    "check_models",
    "check_variant",
    "parse_unchecked_targets",
    "sample_shape",
    "uncheckable_reason",
]

_ORT_DTYPES = {
    "tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
    "tensor(int8)": np.int8, "tensor(uint8)": np.uint8, "tensor(int16)": np.int16,
    "tensor(uint16)": np.uint16, "tensor(int32)": np.int32, "tensor(int64)": np.int64,
    "tensor(bool)": np.bool_, "tensor(string)": np.object_,
}  # fmt: skip


class ModelCheckError(BundleError):
    """A model variant does not load or run, or cannot be checked here.

    The message is one line; for one variant it reads like
    ``models/x.onnx (target onnx-cpu) does not load in ONNX Runtime: <reason>``.

    Attributes:
        path: The variant's file in the bundle, or ``""``.
        target: The variant's target, or ``""``.
    """

    def __init__(self, message: str, *, path: str = "", target: str = "") -> None:
        """Keep the one-line ``message`` and what it is about."""
        super().__init__(message)
        self.path = path
        self.target = target

    @classmethod
    def of(cls, variant: ModelVariant, reason: str) -> ModelCheckError:
        """An error about one variant: its file and target, then ``reason``."""
        return cls(
            f"{variant.path} (target {variant.target}) {reason}",
            path=variant.path,
            target=variant.target,
        )


@dataclass(frozen=True)
class _Port:
    """One model input: its name, its sizes (``None`` where dynamic) and its element type."""

    name: str
    dims: tuple[int | None, ...]
    dtype: np.dtype[Any]


@dataclass(frozen=True)
class _Loaded:
    inputs: tuple[_Port, ...]
    run: Callable[[dict[str, np.ndarray]], object]


@dataclass(frozen=True)
class _Runtime:
    label: str
    module: str
    load: Callable[[Path], _Loaded]


def _size(dim: object) -> int | None:
    return dim if isinstance(dim, int) and dim > 0 else None


def _load_onnx(path: Path) -> _Loaded:
    import onnxruntime as ort  # noqa: PLC0415 - loaded only for ONNX variants

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    ports = tuple(
        _Port(
            i.name,
            tuple(_size(d) for d in (i.shape or ())),
            np.dtype(_ORT_DTYPES.get(i.type, np.float32)),
        )
        for i in session.get_inputs()
    )
    return _Loaded(ports, lambda feeds: session.run(None, feeds))


def _load_openvino(path: Path) -> _Loaded:
    import openvino as ov  # noqa: PLC0415 - loaded only for OpenVINO variants

    core = ov.Core()
    if path.suffix == ".xml":
        weights = path.with_suffix(".bin")
        if not weights.is_file():
            raise FileNotFoundError(f"its weights file {weights.name} is missing")
        # Naming the weights keeps OpenVINO to its IR reader; alone it tries every frontend.
        model = core.read_model(str(path), str(weights))
    else:
        model = core.read_model(str(path))
    compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    ports = []
    for port in compiled.inputs:
        shape = port.get_partial_shape()
        dims = (
            tuple(d.get_length() if d.is_static else None for d in shape)
            if shape.rank.is_static
            else ()
        )
        names = port.get_names()
        name = port.get_any_name() if names else f"input{port.get_index()}"
        ports.append(_Port(name, dims, np.dtype(port.get_element_type().to_dtype())))
    request = compiled.create_infer_request()
    return _Loaded(tuple(ports), lambda feeds: request.infer(list(feeds.values())))


def _load_litert(path: Path) -> _Loaded:
    from ai_edge_litert.interpreter import Interpreter  # noqa: PLC0415 - only for .tflite

    interpreter = Interpreter(model_path=str(path))
    interpreter.allocate_tensors()
    details = interpreter.get_input_details()
    ports = tuple(
        _Port(
            str(d["name"]),
            tuple(_size(int(s)) for s in d.get("shape_signature", d["shape"])),
            np.dtype(d["dtype"]),
        )
        for d in details
    )

    def run(feeds: dict[str, np.ndarray]) -> object:
        resized = False
        for d in details:
            shape = feeds[str(d["name"])].shape
            if tuple(int(s) for s in d["shape"]) != shape:
                interpreter.resize_tensor_input(d["index"], list(shape))
                resized = True
        if resized:
            interpreter.allocate_tensors()
        for d in details:
            interpreter.set_tensor(d["index"], feeds[str(d["name"])])
        interpreter.invoke()
        return None

    return _Loaded(ports, run)


_ONNX = _Runtime("ONNX Runtime", "onnxruntime", _load_onnx)
_RUNTIMES: Mapping[str, _Runtime] = {
    "onnx-cpu": _ONNX,
    "onnx-cuda": _ONNX,
    "onnx-tensorrt": _ONNX,
    "onnx-cann": _ONNX,
    "openvino": _Runtime("OpenVINO", "openvino", _load_openvino),
    "tflite": _Runtime("LiteRT", "ai_edge_litert", _load_litert),
}


def parse_unchecked_targets(values: Iterable[str]) -> frozenset[str]:
    """Read the targets an operator lets through unchecked.

    Raises:
        ModelCheckError: A value is not a known target.
    """
    chosen = frozenset(values)
    unknown = sorted(chosen - set(KNOWN_TARGETS))
    if unknown:
        raise ModelCheckError(
            f"unknown target {unknown[0]!r} for --unchecked-target; known: "
            + ", ".join(KNOWN_TARGETS)
        )
    return chosen


def uncheckable_reason(variant: ModelVariant) -> str | None:
    """Why this variant cannot be run here, or ``None`` when it can.

    Ascend ``om`` files and TensorRT engines need their own hardware; other targets
    need their runtime's Python package.
    """
    if variant.target == "om":
        return "cannot be checked here: Ascend OM models run only on an Ascend device"
    if variant.target == "onnx-tensorrt" and not variant.path.endswith(".onnx"):
        return "cannot be checked here: a TensorRT engine runs only on the GPU it was built for"
    runtime = _RUNTIMES[variant.target]
    if importlib.util.find_spec(runtime.module) is None:
        return f"cannot be checked here: {runtime.module} is not installed"
    return None


def _dims_text(dims: Sequence[int | None]) -> str:
    return "[" + ", ".join("N" if d is None else str(d) for d in dims) + "]"


def sample_shape(
    model_dims: Sequence[int | None], declared: Sequence[int] | None
) -> tuple[int, ...]:
    """The shape of the sample input for one model input.

    Args:
        model_dims: The model's own sizes, ``None`` where dynamic.
        declared: The manifest's shape for this input (``-1`` = dynamic), or ``None``.

    Returns:
        The manifest's shape where it gives one, the model's size or 1 elsewhere.

    Raises:
        ValueError: The model cannot take the declared shape (rank or a fixed size differs).
    """
    if declared is None:
        return tuple(1 if d is None else d for d in model_dims)
    if len(declared) != len(model_dims):
        raise ValueError("rank differs")
    shape = []
    for want, have in zip(declared, model_dims, strict=True):
        if want == -1:
            shape.append(1 if have is None else have)
        elif have is None or have == want:
            shape.append(want)
        else:
            raise ValueError(f"size {want} where the model has {have}")
    return tuple(shape)


def _declared_for(port: _Port, manifest: Manifest, model_inputs: int) -> TensorSpec | None:
    for spec in manifest.inputs:
        if spec.name == port.name:
            return spec
    if model_inputs == 1 and len(manifest.inputs) == 1:
        return manifest.inputs[0]
    return None


def _sample(port: _Port, shape: tuple[int, ...]) -> np.ndarray:
    if port.dtype.kind == "f":
        return np.random.default_rng(0).random(shape).astype(port.dtype)
    if port.dtype.kind == "O":
        return np.full(shape, "", dtype=object)
    return np.zeros(shape, dtype=port.dtype)


def _feeds(variant: ModelVariant, loaded: _Loaded, manifest: Manifest) -> dict[str, np.ndarray]:
    feeds = {}
    for port in loaded.inputs:
        spec = _declared_for(port, manifest, len(loaded.inputs))
        try:
            shape = sample_shape(port.dims, None if spec is None else spec.shape)
        except ValueError as exc:
            assert spec is not None  # only a declared shape can be refused
            raise ModelCheckError.of(
                variant,
                f"takes input {port.name!r} of shape {_dims_text(port.dims)}, but skill.toml's "
                f"input {spec.name!r} is {list(spec.shape)} ({exc})",
            ) from exc
        feeds[port.name] = _sample(port, shape)
    return feeds


def _first_line(exc: BaseException, root: Path) -> str:
    """The first telling line of a runtime's error, with the check's own folder left out."""
    text = str(exc).replace(f"{root}/", "").replace(str(root), ".")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    telling = [line for line in lines if not line.startswith("Exception from ")]
    return (telling or lines or [type(exc).__name__])[0][:300]


def check_variant(root: Path, manifest: Manifest, variant: ModelVariant) -> None:
    """Load one variant in its runtime and run it once on a sample input.

    Raises:
        ModelCheckError: It does not load, the manifest's input does not fit it, or it
            does not run.
    """
    runtime = _RUNTIMES[variant.target]
    path = root.joinpath(*variant.path.split("/"))
    try:
        loaded = runtime.load(path)
    except Exception as exc:  # every runtime raises its own untyped errors
        raise ModelCheckError.of(
            variant, f"does not load in {runtime.label}: {_first_line(exc, root)}"
        ) from exc
    feeds = _feeds(variant, loaded, manifest)
    try:
        loaded.run(feeds)
    except Exception as exc:  # as above
        shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in feeds.items())
        raise ModelCheckError.of(
            variant,
            f"does not run in {runtime.label} on a sample input ({shapes}): "
            f"{_first_line(exc, root)}",
        ) from exc


def _source_samples(root: Path) -> dict[str, tuple[int, ...]]:
    """The sample shapes a library skill's ``sources.toml`` (shipped in its bundle) gives.

    Raises:
        ManifestError: The file is there but malformed.
    """
    from skills.model_sources import SOURCES_NAME, ModelSources  # noqa: PLC0415

    path = root / SOURCES_NAME
    if not path.is_file():
        return {}
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestError(f"cannot read {SOURCES_NAME}: {exc}") from exc
    return {m.path: m.sample for m in ModelSources.from_toml(text).models if m.sample}


def check_models(
    root: Path, manifest: Manifest, *, unchecked_targets: Collection[str] = frozenset()
) -> tuple[ModelVariant, ...]:
    """Check every model variant of a skill folder or extracted bundle.

    A one-input model that ``sources.toml`` (a library skill's, shipped in its bundle)
    gives a ``sample`` shape is run on that shape.

    Args:
        root: The folder holding ``models/``.
        manifest: Its manifest.
        unchecked_targets: Targets whose variants may pass unchecked when they cannot
            be run here.

    Returns:
        The variants let through unchecked.

    Raises:
        ModelCheckError: A variant fails its check, or cannot be checked and its
            target is not in ``unchecked_targets``.
    """
    skipped = []
    samples = _source_samples(root)
    for variant in manifest.models:
        why_not = uncheckable_reason(variant)
        if why_not is None and variant.path in samples:
            spec = TensorSpec("sample", "float32", samples[variant.path])
            check_variant(root, dataclasses.replace(manifest, inputs=(spec,)), variant)
        elif why_not is None:
            check_variant(root, manifest, variant)
        elif variant.target in unchecked_targets:
            skipped.append(variant)
        else:
            raise ModelCheckError.of(
                variant,
                f"{why_not}; pass --unchecked-target {variant.target} to sign it unchecked",
            )
    return tuple(skipped)


def check_bundle(
    bundle: Path,
    *,
    unchecked_targets: Collection[str] = frozenset(),
    limits: ArchiveLimits = DEFAULT_LIMITS,
) -> tuple[ModelVariant, ...]:
    """Extract a built bundle into a temporary folder, verify it and check its models.

    Its drift reference, if it declares one, must be valid too.

    Returns:
        The variants let through unchecked.

    Raises:
        ArchiveError: The archive is unreadable or unsafe.
        BundleError: Its content does not match its manifest.
        DriftReferenceError: Its drift reference is malformed or over a cap.
        ManifestError: Its manifest is invalid.
        ModelCheckError: A model variant fails its check (see :func:`check_models`).
    """
    with tempfile.TemporaryDirectory(prefix="edgeskill-check-") as tmp:
        root = Path(tmp) / "bundle"
        safe_extract(bundle, root, limits)
        manifest = verify_tree(root)
        if manifest.drift is not None:
            read_reference(root, manifest.drift)
        return check_models(root, manifest, unchecked_targets=unchecked_targets)
