"""Inference backends: ONNX Runtime, OpenVINO and LiteRT behind one small interface.

Each backend imports its library only inside :meth:`Backend.available` and
:meth:`Backend.load`, so importing this module costs nothing on a device that
lacks OpenVINO or LiteRT.
"""

from __future__ import annotations

import importlib
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import numpy as np

from edge_agent.errors import RuntimeBackendError
from edge_agent.profile import CPU_PROVIDER, TARGET_PROVIDERS, session_providers

__all__ = [
    "Backend",
    "LiteRtBackend",
    "LoadedModel",
    "OnnxRuntimeBackend",
    "OpenVinoBackend",
    "default_backends",
]

_log = logging.getLogger(__name__)

Runner = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


class LoadedModel:
    """A model loaded by a backend; satisfies :class:`skills.sdk.Model`.

    Attributes:
        name: The model's name (the manifest's, or the file stem).
        target: The target of the loaded variant.
        backend: The backend's name.
        precision: The loaded variant's precision, set by the runtime facade.
        provider: What actually executes it (an ONNX Runtime provider, an OpenVINO device).
        input_names: Graph input names, in order.
        output_names: Graph output names, in order.
    """

    def __init__(
        self,
        *,
        name: str,
        target: str,
        backend: str,
        provider: str,
        input_names: Sequence[str],
        output_names: Sequence[str],
        runner: Runner,
    ) -> None:
        self.name = name
        self.target = target
        self.backend = backend
        self.precision = "fp32"
        self.provider = provider
        self.input_names = tuple(input_names)
        self.output_names = tuple(output_names)
        self._runner = runner

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the model once.

        Args:
            feeds: Exactly one array per input name.

        Returns:
            One array per output name.

        Raises:
            RuntimeBackendError: The feeds do not name the inputs, or inference failed.
        """
        if set(feeds) != set(self.input_names):
            raise RuntimeBackendError(
                f"model {self.name!r} takes inputs {list(self.input_names)}, got {sorted(feeds)}"
            )
        arrays = {key: np.asarray(value) for key, value in feeds.items()}
        try:
            return self._runner(arrays)
        except Exception as exc:
            raise RuntimeBackendError(
                f"model {self.name!r} failed on {self.backend}: {exc}"
            ) from exc

    def __repr__(self) -> str:
        return f"LoadedModel({self.name!r}, target={self.target!r}, provider={self.provider!r})"


class Backend(ABC):
    """One inference library, able to load model files for some targets."""

    #: Short name recorded on loaded models.
    name: ClassVar[str]
    #: The targets whose variants this backend can load.
    targets: ClassVar[frozenset[str]]
    #: The module whose import decides availability.
    _module: ClassVar[str]

    def __init__(self) -> None:
        self._imported: ModuleType | None = None
        self._import_failed = False

    def serves(self, target: str) -> bool:
        """Whether this backend loads variants built for ``target``."""
        return target in self.targets

    def available(self) -> bool:
        """Whether the backend's library imports on this device (tried once)."""
        if self._imported is None and not self._import_failed:
            try:
                self._imported = importlib.import_module(self._module)
            except ImportError as exc:
                _log.info("backend %s unavailable: %s", self.name, exc)
                self._import_failed = True
        return self._imported is not None

    def _library(self) -> ModuleType:
        if not self.available() or self._imported is None:
            raise RuntimeBackendError(f"backend {self.name} is not installed on this device")
        return self._imported

    def load(self, path: Path, target: str, *, name: str | None = None) -> LoadedModel:
        """Load a model file built for ``target``.

        Args:
            path: The model file.
            target: The variant's target; must be one this backend serves.
            name: The model's name for messages; defaults to the file stem.

        Returns:
            The loaded model.

        Raises:
            RuntimeBackendError: The backend is missing, does not serve the target,
                or could not load the file.
        """
        if not self.serves(target):
            raise RuntimeBackendError(f"backend {self.name} does not serve target {target!r}")
        library = self._library()
        model_name = name or path.stem
        try:
            return self._load(library, path, target, model_name)
        except RuntimeBackendError:
            raise
        except Exception as exc:
            raise RuntimeBackendError(
                f"{self.name} could not load {path.name} for {target}: {exc}"
            ) from exc

    @abstractmethod
    def _load(self, library: ModuleType, path: Path, target: str, name: str) -> LoadedModel:
        """Load with the imported library; any exception is translated by :meth:`load`."""


class OnnxRuntimeBackend(Backend):
    """ONNX Runtime, with the providers the target and the device profile ask for.

    Args:
        providers: The device profile's providers, best first (a Jetson's TensorRT and
            CUDA, an Ascend's CANN); by default the CPU only. Providers the installed
            ONNX Runtime lacks are skipped with a warning; the CPU is always the last resort.
    """

    name = "onnxruntime"
    targets = frozenset({"onnx-cpu", "onnx-cuda", "onnx-tensorrt", "onnx-cann"})
    _module = "onnxruntime"

    def __init__(self, providers: Sequence[str] = (CPU_PROVIDER,)) -> None:
        super().__init__()
        self.providers = tuple(providers)

    def _load(self, library: ModuleType, path: Path, target: str, name: str) -> LoadedModel:
        present = library.get_available_providers()
        providers = session_providers(target, self.providers, present)
        _note_missing(target, self.providers, present, providers[0])
        options = library.SessionOptions()
        options.log_severity_level = 3  # errors only: ORT's warnings would flood the skill log
        session = library.InferenceSession(str(path), sess_options=options, providers=providers)
        running = session.get_providers()[0]
        if running != providers[0]:
            _log.warning("%s: ONNX Runtime fell back from %s to %s", name, providers[0], running)
        output_names = [out.name for out in session.get_outputs()]

        def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            outputs = session.run(output_names, feeds)
            return dict(zip(output_names, outputs, strict=True))

        return LoadedModel(
            name=name,
            target=target,
            backend=self.name,
            provider=running,
            input_names=[inp.name for inp in session.get_inputs()],
            output_names=output_names,
            runner=run,
        )


def _note_missing(
    target: str, profile_providers: Sequence[str], present: Sequence[str], using: str
) -> None:
    """Warn when the provider the target or the profile wants first is not in this build."""
    own = [p for p in TARGET_PROVIDERS[target] if p != CPU_PROVIDER]
    first = own[0] if own else next((p for p in profile_providers if p != CPU_PROVIDER), None)
    if first is not None and first not in present:
        _log.warning(
            "execution provider %s is not in this ONNX Runtime build (has %s); using %s",
            first,
            ", ".join(present),
            using,
        )


class OpenVinoBackend(Backend):
    """OpenVINO on the CPU, in f32 (this CPU's bf16 default changes results)."""

    name = "openvino"
    targets = frozenset({"openvino"})
    _module = "openvino"
    device = "CPU"

    def _load(self, library: ModuleType, path: Path, target: str, name: str) -> LoadedModel:
        core = library.Core()
        model = core.read_model(str(path))
        # The names the model file gives its ports: after compiling, a port may carry
        # more names (an Identity folded into the node before it), and any one of them
        # could come back from get_any_name().
        input_names = [port.get_any_name() for port in model.inputs]
        output_names = [port.get_any_name() for port in model.outputs]
        compiled = core.compile_model(model, self.device, {"INFERENCE_PRECISION_HINT": "f32"})
        request = compiled.create_infer_request()
        outputs = list(compiled.outputs)
        lock = threading.Lock()

        def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            with lock:  # one infer request, reused; it is not thread-safe
                results = request.infer(feeds)
                # copies: the request reuses its output buffers on the next call
                return {
                    key: np.array(results[port])
                    for key, port in zip(output_names, outputs, strict=True)
                }

        return LoadedModel(
            name=name,
            target=target,
            backend=self.name,
            provider=self.device,
            input_names=input_names,
            output_names=output_names,
            runner=run,
        )


class LiteRtBackend(Backend):
    """LiteRT: the TFLite interpreter from ``ai-edge-litert``, else from ``tflite-runtime``.

    Older ARM images (numpy 1.x, Python <= 3.11) only have ``tflite-runtime``; it has the
    same ``Interpreter`` API, so the same code drives both. :attr:`library` says which one
    was found.
    """

    name = "litert"
    targets = frozenset({"tflite"})
    _module = "ai_edge_litert.interpreter"
    _fallback_module: ClassVar[str] = "tflite_runtime.interpreter"

    def available(self) -> bool:
        """Whether ``ai-edge-litert`` or, failing that, ``tflite-runtime`` imports (tried once)."""
        if self._imported is None and not self._import_failed:
            for module in (self._module, self._fallback_module):
                try:
                    self._imported = importlib.import_module(module)
                    break
                except ImportError as exc:
                    _log.info("backend %s: %s does not import: %s", self.name, module, exc)
            self._import_failed = self._imported is None
        return self._imported is not None

    @property
    def library(self) -> str:
        """The interpreter module in use (``""`` before the first :meth:`available`)."""
        return self._imported.__name__ if self._imported is not None else ""

    def _load(self, library: ModuleType, path: Path, target: str, name: str) -> LoadedModel:
        interpreter = library.Interpreter(model_path=str(path))
        interpreter.allocate_tensors()
        in_details, out_details = _litert_io(interpreter)
        inputs = {key: int(d["index"]) for key, d in in_details}
        shapes = {key: tuple(d["shape"]) for key, d in in_details}
        in_quant = {key: _Quant.of(d) for key, d in in_details}
        outputs = [(key, int(d["index"]), _Quant.of(d)) for key, d in out_details]
        lock = threading.Lock()

        def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            quantized = {key: in_quant[key].quantize(array) for key, array in feeds.items()}
            with lock:  # the interpreter holds per-call state
                _set_litert_inputs(interpreter, inputs, shapes, quantized)
                interpreter.invoke()
                return {
                    key: quant.dequantize(interpreter.get_tensor(index))
                    for key, index, quant in outputs
                }

        return LoadedModel(
            name=name,
            target=target,
            backend=self.name,
            provider=f"cpu ({self.library})",
            input_names=list(inputs),
            output_names=[key for key, _, _ in outputs],
            runner=run,
        )


_Details = list[tuple[str, Mapping[str, Any]]]


def _litert_io(interpreter: Any) -> tuple[_Details, _Details]:
    """Inputs and outputs by their signature names when the model has one signature.

    A signature names tensors as the exporter was told (``image``, ``logits``); the raw
    tensor names carry prefixes (``serving_default_image:0``). Without exactly one
    signature, the raw names are used.
    """
    signatures = interpreter.get_signature_list()
    if len(signatures) == 1:
        runner = interpreter.get_signature_runner(next(iter(signatures)))
        ins, outs = runner.get_input_details(), runner.get_output_details()
        if all("index" in d for d in (*ins.values(), *outs.values())):
            return list(ins.items()), list(outs.items())
    raw_in = [(d["name"], d) for d in interpreter.get_input_details()]
    return raw_in, [(d["name"], d) for d in interpreter.get_output_details()]


class _Quant:
    """A TFLite tensor's integer quantisation (INT8 models take and give integers)."""

    def __init__(self, dtype: np.dtype[Any], scale: float, zero_point: int) -> None:
        self.dtype = dtype
        self.scale = scale
        self.zero_point = zero_point

    @classmethod
    def of(cls, detail: Mapping[str, Any]) -> _Quant:
        scale, zero_point = detail.get("quantization", (0.0, 0))
        return cls(np.dtype(detail["dtype"]), float(scale), int(zero_point))

    @property
    def integer(self) -> bool:
        return self.scale != 0.0 and np.issubdtype(self.dtype, np.integer)

    def quantize(self, array: np.ndarray) -> np.ndarray:
        """Float feeds of an integer input, scaled and rounded; others unchanged."""
        if not self.integer or np.issubdtype(array.dtype, np.integer):
            return array
        info = np.iinfo(self.dtype)
        scaled = np.round(array / self.scale) + self.zero_point
        return np.clip(scaled, info.min, info.max).astype(self.dtype)

    def dequantize(self, array: np.ndarray) -> np.ndarray:
        """An integer output back to float32; a float output copied."""
        if not self.integer:
            return np.array(array)
        return ((array.astype(np.float32) - self.zero_point) * self.scale).astype(np.float32)


def _set_litert_inputs(
    interpreter: Any,
    indices: Mapping[str, int],
    shapes: dict[str, tuple[int, ...]],
    feeds: Mapping[str, np.ndarray],
) -> None:
    """Resize inputs whose shape changed (a new batch size), then copy the feeds in."""
    resized = False
    for key, array in feeds.items():
        if shapes[key] != array.shape:
            interpreter.resize_tensor_input(indices[key], list(array.shape))
            shapes[key] = array.shape
            resized = True
    if resized:
        interpreter.allocate_tensors()
    for key, array in feeds.items():
        interpreter.set_tensor(indices[key], array)


def default_backends(providers: Sequence[str] = (CPU_PROVIDER,)) -> list[Backend]:
    """Fresh instances of every backend this agent knows, in no order of preference.

    Args:
        providers: The device profile's ONNX Runtime providers, best first.
    """
    from edge_agent.runtime.acl import AclBackend  # noqa: PLC0415 - acl.py imports this module

    return [OnnxRuntimeBackend(providers), OpenVinoBackend(), LiteRtBackend(), AclBackend()]
