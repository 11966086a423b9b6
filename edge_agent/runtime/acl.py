"""Ascend offline models (target ``om``: ``.om`` files built by Huawei's ``atc``) through pyACL.

pyACL is the ``acl`` module of the CANN toolkit (not on PyPI); where it does not import,
:meth:`AclBackend.available` is False and nothing else changes. pyACL's state is
process-wide (``acl.init`` once per process; a model is loaded, run and unloaded in one
context on one device), so one :class:`AclSession` holds it for every model. A model
allocates its device buffers when it loads and frees them when it closes or is garbage
collected. A nonzero pyACL return code becomes a :class:`RuntimeBackendError` naming the
call and the code.

Tested here only against a fake of the pyACL API (``tests/fakes/fake_acl.py``) written
from Huawei's pyACL reference; it needs a real Ascend 310 to be verified.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from edge_agent.errors import RuntimeBackendError
from edge_agent.runtime.acl_session import (
    ACL_MEM_MALLOC_HUGE_FIRST,
    ACL_MEMCPY_DEVICE_TO_DEVICE,
    ACL_MEMCPY_DEVICE_TO_HOST,
    ACL_MEMCPY_HOST_TO_DEVICE,
    DEVICE_ID_ENV,
    AclSession,
    Undo,
    check_ret,
    non_null,
    ret_value,
    shared_session,
    unwind,
)
from edge_agent.runtime.backends import Backend, LoadedModel

__all__ = ["ACL_DTYPES", "DEVICE_ID_ENV", "AclBackend", "AclModel", "AclSession", "TensorSpec"]

_log = logging.getLogger(__name__)

#: ``aclDataType`` values and the numpy types they hold (5 is unused in CANN's enum).
ACL_DTYPES: Mapping[int, np.dtype[Any]] = {
    0: np.dtype("float32"),
    1: np.dtype("float16"),
    2: np.dtype("int8"),
    3: np.dtype("int32"),
    4: np.dtype("uint8"),
    6: np.dtype("int16"),
    7: np.dtype("uint16"),
    8: np.dtype("uint32"),
    9: np.dtype("int64"),
    10: np.dtype("uint64"),
    11: np.dtype("float64"),
    12: np.dtype("bool"),
}


@dataclass(frozen=True)
class TensorSpec:
    """A model input or output as the model description gives it.

    Attributes:
        name: The tensor's name.
        shape: Its dims (static: ``atc`` dynamic shapes are not supported).
        dtype: Its element type.
        nbytes: The size of its device buffer.
    """

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    nbytes: int


class _Model:
    """A loaded ``.om`` model's pyACL resources, freed by :meth:`close`."""

    def __init__(self, acl: Any, session: AclSession, path: Path) -> None:
        self._acl = acl
        self._session = session
        self._lock = threading.Lock()
        self._undo: list[Undo] = []
        self.closed = False
        session.acquire(acl)
        self._undo.append(("releasing the device", session.release))
        try:
            session.bind()
            self._load(path)
        except Exception as exc:  # pyACL's own TypeErrors too: free what was allocated
            for error in unwind(self._undo):
                exc.add_note(f"while cleaning up: {error}")
            raise
        on_host = session.host_run_mode  # on the board, "host" memory is device memory
        self._copy_in = ACL_MEMCPY_HOST_TO_DEVICE if on_host else ACL_MEMCPY_DEVICE_TO_DEVICE
        self._copy_out = ACL_MEMCPY_DEVICE_TO_HOST if on_host else ACL_MEMCPY_DEVICE_TO_DEVICE
        session.opened(self)

    def _push(self, call: str, undo: Callable[[], object]) -> None:
        self._undo.append((call, undo))

    def _load(self, path: Path) -> None:
        acl = self._acl
        model_id = ret_value(acl.mdl.load_from_file(str(path)), "acl.mdl.load_from_file")
        self._push("acl.mdl.unload", functools.partial(acl.mdl.unload, model_id))
        desc = non_null(acl.mdl.create_desc(), "acl.mdl.create_desc")
        self._push("acl.mdl.destroy_desc", functools.partial(acl.mdl.destroy_desc, desc))
        check_ret(acl.mdl.get_desc(desc, model_id), "acl.mdl.get_desc")
        self._model_id = model_id
        self._in_set, self._inputs = self._dataset(desc, "input")
        self._out_set, self._outputs = self._dataset(desc, "output")
        self.inputs = [spec for spec, _ in self._inputs]
        self.outputs = [spec for spec, _ in self._outputs]

    def _dataset(self, desc: int, side: str) -> tuple[int, list[tuple[TensorSpec, int]]]:
        """A dataset with a fresh device buffer for each input (or output), and the buffers."""
        acl, buffers = self._acl, []
        dataset = non_null(acl.mdl.create_dataset(), "acl.mdl.create_dataset")
        self._push("acl.mdl.destroy_dataset", functools.partial(acl.mdl.destroy_dataset, dataset))
        for index in range(getattr(acl.mdl, f"get_num_{side}s")(desc)):
            spec = _spec(acl.mdl, desc, side, index)
            pointer = ret_value(
                acl.rt.malloc(spec.nbytes, ACL_MEM_MALLOC_HUGE_FIRST), "acl.rt.malloc"
            )
            self._push("acl.rt.free", functools.partial(acl.rt.free, pointer))
            buffer = non_null(
                acl.create_data_buffer(pointer, spec.nbytes), "acl.create_data_buffer"
            )
            self._push(
                "acl.destroy_data_buffer", functools.partial(acl.destroy_data_buffer, buffer)
            )
            ret_value(acl.mdl.add_dataset_buffer(dataset, buffer), "acl.mdl.add_dataset_buffer")
            buffers.append((spec, pointer))
        return dataset, buffers

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Copy the feeds in, execute, copy the outputs back (one run at a time).

        Raises:
            RuntimeBackendError: A feed does not fit its input, a pyACL call failed,
                or the model is closed.
        """
        arrays = [(spec, device, _conform(spec, feeds[spec.name])) for spec, device in self._inputs]
        acl = self._acl
        with self._lock:
            if self.closed:
                raise RuntimeBackendError("the model is closed")
            self._session.bind()
            for spec, device, array in arrays:
                self._write(spec, device, array)
            check_ret(
                acl.mdl.execute(self._model_id, self._in_set, self._out_set), "acl.mdl.execute"
            )
            return {spec.name: self._read(spec, device) for spec, device in self._outputs}

    def _write(self, spec: TensorSpec, device: int, array: np.ndarray) -> None:
        util = self._acl.util
        # Newer CANN deprecates numpy_to_ptr (with a warning) for bytes_to_ptr; the
        # host copy must outlive the synchronous memcpy, which it does in this frame.
        host: Any = array.tobytes() if hasattr(util, "bytes_to_ptr") else array
        pointer = util.bytes_to_ptr(host) if isinstance(host, bytes) else util.numpy_to_ptr(host)
        ret = self._acl.rt.memcpy(device, spec.nbytes, pointer, array.nbytes, self._copy_in)
        check_ret(ret, f"acl.rt.memcpy (input {spec.name!r})")

    def _read(self, spec: TensorSpec, device: int) -> np.ndarray:
        acl, size = self._acl, spec.nbytes
        call = f"acl.rt.memcpy (output {spec.name!r})"
        if not hasattr(acl.util, "ptr_to_bytes"):  # older CANN: copy straight into numpy
            out = np.empty(spec.shape, spec.dtype)
            check_ret(
                acl.rt.memcpy(acl.util.numpy_to_ptr(out), size, device, size, self._copy_out), call
            )
            return out
        host = ret_value(acl.rt.malloc_host(size), "acl.rt.malloc_host")
        try:
            check_ret(acl.rt.memcpy(host, size, device, size, self._copy_out), call)
            data = acl.util.ptr_to_bytes(host, size)
        finally:
            freed = acl.rt.free_host(host)
        check_ret(freed, "acl.rt.free_host")
        return np.frombuffer(data, dtype=spec.dtype).reshape(spec.shape).copy()

    def close(self) -> None:
        """Unload the model and free its device memory (again: nothing).

        Every step is tried even when one fails.

        Raises:
            RuntimeBackendError: Some pyACL calls failed; the message names them all.
        """
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self._session.closed(self)
            errors = []
            try:
                self._session.bind()
            except RuntimeBackendError as exc:
                errors.append(str(exc))
            errors += unwind(self._undo)
        if errors:
            raise RuntimeBackendError("; ".join(errors))

    def close_quietly(self) -> None:
        """:meth:`close`, logging failures: for the garbage collector and exit."""
        try:
            self.close()
        except RuntimeBackendError as exc:
            _log.warning("closing an Ascend model: %s", exc)


def _spec(mdl: Any, desc: int, side: str, index: int) -> TensorSpec:
    """One input's (or output's) description, refused if this backend cannot feed it."""
    name = str(getattr(mdl, f"get_{side}_name_by_index")(desc, index))
    dims = ret_value(getattr(mdl, f"get_{side}_dims")(desc, index), f"acl.mdl.get_{side}_dims")
    shape = tuple(int(d) for d in dims["dims"])
    code = int(getattr(mdl, f"get_{side}_data_type")(desc, index))
    size = int(getattr(mdl, f"get_{side}_size_by_index")(desc, index))
    if code not in ACL_DTYPES:
        raise RuntimeBackendError(f"{side} {name!r} has ACL data type {code}, not supported")
    if any(d < 0 for d in shape):
        raise RuntimeBackendError(
            f"{side} {name!r} has dynamic dims {list(shape)}; only static shapes are supported"
        )
    dtype = ACL_DTYPES[code]
    if math.prod(shape) * dtype.itemsize != size:
        raise RuntimeBackendError(
            f"{side} {name!r}: dims {list(shape)} of {dtype} make "
            f"{math.prod(shape) * dtype.itemsize} bytes, but its buffer has {size} "
            "(an AIPP input?); not supported"
        )
    return TensorSpec(name, shape, dtype, size)


def _conform(spec: TensorSpec, array: np.ndarray) -> np.ndarray:
    """The feed as the input's dtype, C-contiguous, after checking shape and castability."""
    if array.shape != spec.shape:
        raise RuntimeBackendError(
            f"input {spec.name!r} takes shape {list(spec.shape)}, got {list(array.shape)}"
        )
    if array.dtype != spec.dtype:
        if not np.can_cast(array.dtype, spec.dtype, casting="safe"):
            raise RuntimeBackendError(
                f"input {spec.name!r} takes {spec.dtype}; {array.dtype} does not cast to it safely"
            )
        array = array.astype(spec.dtype)
    array = np.ascontiguousarray(array)
    if array.nbytes != spec.nbytes:  # follows from the checks above and _spec; a guard
        raise RuntimeBackendError(f"input {spec.name!r} takes {spec.nbytes} B, got {array.nbytes}")
    return array


class AclModel(LoadedModel):
    """A loaded ``.om`` model; :meth:`close`, or garbage collection, unloads it.

    Attributes:
        inputs: The inputs as the model description gives them, in order.
        outputs: The outputs likewise.
    """

    def __init__(
        self, model: _Model, *, name: str, target: str, backend: str, provider: str
    ) -> None:
        super().__init__(
            name=name,
            target=target,
            backend=backend,
            provider=provider,
            input_names=[spec.name for spec in model.inputs],
            output_names=[spec.name for spec in model.outputs],
            runner=model.run,
        )
        self.inputs = tuple(model.inputs)
        self.outputs = tuple(model.outputs)
        self._model = model
        self._finalizer = weakref.finalize(self, model.close_quietly)

    @property
    def closed(self) -> bool:
        """Whether the model has been unloaded."""
        return self._model.closed

    def close(self) -> None:
        """Unload the model and free its device memory; closing again does nothing.

        Raises:
            RuntimeBackendError: Some pyACL calls failed (every step is still tried).
        """
        self._finalizer.detach()
        self._model.close()

    def __enter__(self) -> AclModel:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class AclBackend(Backend):
    """Ascend offline models (target ``om``) through pyACL, on one NPU.

    Args:
        session: The pyACL session to load into; by default the process's own
            (:func:`shared_session`).
    """

    name = "acl"
    targets = frozenset({"om"})
    _module = "acl"

    def __init__(self, session: AclSession | None = None) -> None:
        super().__init__()
        self._session = session

    @property
    def session(self) -> AclSession:
        """The session models are loaded into.

        Raises:
            RuntimeBackendError: ``$ASCEND_DEVICE_ID`` is not a device number.
        """
        if self._session is None:
            self._session = shared_session()
        return self._session

    def _load(self, library: ModuleType, path: Path, target: str, name: str) -> LoadedModel:
        session = self.session
        try:
            model = _Model(library, session, path)
        except RuntimeBackendError as exc:
            raise RuntimeBackendError(f"{self.name} could not load {path.name}: {exc}") from exc
        provider = f"ascend:{session.device_id}"
        return AclModel(model, name=name, target=target, backend=self.name, provider=provider)
