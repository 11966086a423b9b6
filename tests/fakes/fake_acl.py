"""A fake of pyACL (Huawei's ``acl`` module): just the calls ``edge_agent.runtime.acl`` makes.

It follows the pyACL reference's calling conventions: every call returns an error code
(0 is success), alone or as the last item of a ``(value, ret)`` pair; constructors
(``create_desc``, ``create_dataset``, ``create_data_buffer``) return a handle, 0 on
failure; pointers and handles are ints. Device memory is a dict of bytearrays, so
:meth:`FakeAcl.leaks` can count what is still allocated.

A "model file" is JSON describing a model that computes ``y = x * scale + bias``::

    {"inputs": [{"name": "x", "dims": [2, 3], "type": 0}],
     "outputs": [{"name": "y", "dims": [2, 3], "type": 0}],
     "scale": 2, "bias": 1}

An input or output may also give ``"size"`` (its buffer's bytes, when not dims x
itemsize). Every output is computed from the first input.

:meth:`FakeAcl.fail` makes a named call (``"acl.rt.malloc"``) return an error code,
optionally after some successful calls and only a number of times.
"""

from __future__ import annotations

import itertools
import json
import math
import threading
from collections import Counter
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np

ACL_ERROR_INVALID_PARAM = 100000
ACL_ERROR_UNINITIALIZE = 100001
ACL_ERROR_REPEAT_INITIALIZE = 100002
ACL_ERROR_INVALID_FILE = 100003
ACL_ERROR_INVALID_MODEL_ID = 100011
ACL_ERROR_BAD_ALLOC = 200000
ACL_ERROR_INVALID_RESOURCE_HANDLE = 200005
ACL_DEVICE, ACL_HOST = 0, 1
H2D, D2H, D2D = 1, 2, 3
#: aclDataType -> numpy, as the pyACL reference lists them.
DTYPES = {
    0: np.float32,
    1: np.float16,
    2: np.int8,
    3: np.int32,
    4: np.uint8,
    6: np.int16,
    7: np.uint16,
    8: np.uint32,
    9: np.int64,
    10: np.uint64,
    11: np.float64,
    12: np.bool_,
}


def write_model(path: Path, inputs: list[dict[str, Any]], outputs: list[dict[str, Any]],
                scale: float = 2.0, bias: float = 1.0) -> Path:  # fmt: skip
    """Write a fake ``.om`` file; each tensor is ``{"name", "dims", "type"[, "size"]}``."""
    path.write_text(
        json.dumps({"inputs": inputs, "outputs": outputs, "scale": scale, "bias": bias})
    )
    return path


def _size(tensor: dict[str, Any]) -> int:
    if "size" in tensor:
        return int(tensor["size"])
    return math.prod(tensor["dims"]) * np.dtype(DTYPES.get(tensor["type"], np.uint8)).itemsize


class FakeAcl(ModuleType):
    """The fake ``acl`` module; put it in ``sys.modules["acl"]``.

    Args:
        run_mode: What ``acl.rt.get_run_mode`` answers: ``ACL_HOST`` (a card in a
            server) or ``ACL_DEVICE`` (the app runs on the board).
        legacy_util: Offer only ``numpy_to_ptr`` (older CANN) instead of
            ``bytes_to_ptr``/``ptr_to_bytes``.
    """

    def __init__(self, run_mode: int = ACL_HOST, *, legacy_util: bool = False) -> None:
        super().__init__("acl")
        self.run_mode = run_mode
        self.calls: Counter[str] = Counter()
        self._failures: dict[str, tuple[int, int, int]] = {}  # call -> (code, from, to)
        self._ids = itertools.count(0x1000, 0x100)
        self.initialised = False
        self.devices: set[int] = set()
        self.contexts: dict[int, int] = {}  # context -> device
        self._current = threading.local()
        self.device_memory: dict[int, bytearray] = {}
        self.host_memory: dict[int, bytearray] = {}  # malloc_host allocations
        self._views: dict[int, memoryview] = {}  # host pointers from bytes/numpy_to_ptr
        self.models: dict[int, dict[str, Any]] = {}
        self.descs: dict[int, int | None] = {}  # desc -> model id
        self.datasets: dict[int, list[int]] = {}
        self.buffers: dict[int, tuple[int, int]] = {}  # data buffer -> (pointer, size)
        self.executed: list[tuple[int, int]] = []  # (model id, context) per execute
        self.rt = SimpleNamespace(
            **{n: getattr(self, f"_rt_{n}") for n in _RT},
        )
        self.mdl = SimpleNamespace(**{n: getattr(self, f"_mdl_{n}") for n in _MDL})
        util = ["numpy_to_ptr"] if legacy_util else ["numpy_to_ptr", "bytes_to_ptr", "ptr_to_bytes"]
        self.util = SimpleNamespace(**{n: getattr(self, f"_util_{n}") for n in util})

    # -- test controls ---------------------------------------------------------------

    def fail(
        self, call: str, code: int = ACL_ERROR_BAD_ALLOC, *, after: int = 0, times: int = 10**9
    ) -> None:
        """Make ``call`` (``"acl.rt.malloc"``) return ``code``, ``times`` times, from its
        ``after``-th call on."""
        start = self.calls[call] + after
        self._failures[call] = (code, start, start + times)

    def leaks(self) -> dict[str, int]:
        """What is still allocated or loaded, by kind (empty when everything was freed)."""
        counts = {
            "device memory": len(self.device_memory),
            "host memory": len(self.host_memory),
            "models": len(self.models),
            "descs": len(self.descs),
            "datasets": len(self.datasets),
            "data buffers": len(self.buffers),
            "contexts": len(self.contexts),
            "devices": len(self.devices),
        }
        return {kind: n for kind, n in counts.items() if n}

    def _enter(self, call: str) -> int:
        """Count the call; the injected error code if it is due to fail, else 0."""
        code, start, end = self._failures.get(call, (0, 0, 0))
        done = self.calls[call]
        self.calls[call] += 1
        if code and start <= done < end:
            return code
        if call != "acl.init" and not self.initialised:
            return ACL_ERROR_UNINITIALIZE
        return 0

    def _new_id(self) -> int:
        return next(self._ids)

    @property
    def current_context(self) -> int | None:
        return getattr(self._current, "context", None)

    # -- acl ---------------------------------------------------------------------------

    def init(self, config_path: str | None = None) -> int:
        if code := self._enter("acl.init"):
            return code
        if self.initialised:
            return ACL_ERROR_REPEAT_INITIALIZE
        self.initialised = True
        return 0

    def finalize(self) -> int:
        if code := self._enter("acl.finalize"):
            return code
        self.initialised = False
        return 0

    def create_data_buffer(self, pointer: int, size: int) -> int:
        if self._enter("acl.create_data_buffer"):
            return 0
        handle = self._new_id()
        self.buffers[handle] = (pointer, size)
        return handle

    def destroy_data_buffer(self, buffer: int) -> int:
        if code := self._enter("acl.destroy_data_buffer"):
            return code
        return 0 if self.buffers.pop(buffer, None) else ACL_ERROR_INVALID_PARAM

    # -- acl.rt ------------------------------------------------------------------------

    def _rt_set_device(self, device: int) -> int:
        if code := self._enter("acl.rt.set_device"):
            return code
        self.devices.add(device)
        return 0

    def _rt_reset_device(self, device: int) -> int:
        if code := self._enter("acl.rt.reset_device"):
            return code
        if device not in self.devices or device in self.contexts.values():
            return ACL_ERROR_INVALID_PARAM  # contexts are to be destroyed first
        self.devices.discard(device)
        return 0

    def _rt_create_context(self, device: int) -> tuple[int, int]:
        if code := self._enter("acl.rt.create_context"):
            return 0, code
        if device not in self.devices:
            return 0, ACL_ERROR_INVALID_PARAM
        context = self._new_id()
        self.contexts[context] = device
        self._current.context = context  # a new context is current in its thread
        return context, 0

    def _rt_set_context(self, context: int) -> int:
        if code := self._enter("acl.rt.set_context"):
            return code
        if context not in self.contexts:
            return ACL_ERROR_INVALID_RESOURCE_HANDLE
        self._current.context = context
        return 0

    def _rt_destroy_context(self, context: int) -> int:
        if code := self._enter("acl.rt.destroy_context"):
            return code
        return 0 if self.contexts.pop(context, None) is not None else ACL_ERROR_INVALID_PARAM

    def _rt_get_run_mode(self) -> tuple[int, int]:
        return self.run_mode, self._enter("acl.rt.get_run_mode")

    def _rt_malloc(self, size: int, policy: int) -> tuple[int, int]:
        if code := self._enter("acl.rt.malloc"):
            return 0, code
        if size <= 0 or policy not in (0, 1, 2) or self.current_context is None:
            return 0, ACL_ERROR_INVALID_PARAM
        pointer = self._new_id()
        self.device_memory[pointer] = bytearray(size)
        return pointer, 0

    def _rt_free(self, pointer: int) -> int:
        if code := self._enter("acl.rt.free"):
            return code
        return 0 if self.device_memory.pop(pointer, None) is not None else ACL_ERROR_INVALID_PARAM

    def _rt_malloc_host(self, size: int) -> tuple[int, int]:
        if code := self._enter("acl.rt.malloc_host"):
            return 0, code
        pointer = self._new_id()
        self.host_memory[pointer] = bytearray(size)
        return pointer, 0

    def _rt_free_host(self, pointer: int) -> int:
        if code := self._enter("acl.rt.free_host"):
            return code
        return 0 if self.host_memory.pop(pointer, None) is not None else ACL_ERROR_INVALID_PARAM

    def _rt_memcpy(self, dst: int, dest_max: int, src: int, count: int, kind: int) -> int:
        if code := self._enter("acl.rt.memcpy"):
            return code
        on_device = self.device_memory
        # On the board (ACL_DEVICE) every buffer is device memory: only D2D is right.
        if self.run_mode == ACL_DEVICE:
            ok = kind == D2D
        else:
            ok = (kind == H2D and dst in on_device and src not in on_device) or (
                kind == D2H and src in on_device and dst not in on_device
            )
        target, source = self._memory(dst), self._memory(src)
        if not ok or target is None or source is None or count > dest_max:
            return ACL_ERROR_INVALID_PARAM
        if count > len(target) or count > len(source) or target.readonly:
            return ACL_ERROR_INVALID_PARAM
        target[:count] = source[:count]
        return 0

    def _memory(self, pointer: int) -> memoryview | None:
        for pool in (self.device_memory, self.host_memory):
            if pointer in pool:
                return memoryview(pool[pointer])
        return self._views.get(pointer)

    # -- acl.util ----------------------------------------------------------------------

    def _util_bytes_to_ptr(self, data: bytes) -> int:
        if not isinstance(data, bytes):
            raise ValueError("needs an byte as argument")  # pyACL's own message
        pointer = self._new_id()
        self._views[pointer] = memoryview(data)
        return pointer

    def _util_numpy_to_ptr(self, array: np.ndarray) -> int:
        if not isinstance(array, np.ndarray) or not array.flags.c_contiguous:
            raise ValueError("needs a C-contiguous ndarray")
        pointer = self._new_id()
        self._views[pointer] = memoryview(array.reshape(-1).view(np.uint8))
        return pointer

    def _util_ptr_to_bytes(self, pointer: int, size: int) -> bytes:
        memory = self._memory(pointer)
        if memory is None:
            raise ValueError("not a pointer this fake handed out")
        return bytes(memory[:size])

    # -- acl.mdl -----------------------------------------------------------------------

    def _mdl_load_from_file(self, path: str) -> tuple[int, int]:
        if code := self._enter("acl.mdl.load_from_file"):
            return 0, code
        try:
            spec = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            return 0, ACL_ERROR_INVALID_FILE
        if self.current_context is None:
            return 0, ACL_ERROR_INVALID_PARAM
        model_id = self._new_id()
        self.models[model_id] = spec | {"context": self.current_context}
        return model_id, 0

    def _mdl_unload(self, model_id: int) -> int:
        if code := self._enter("acl.mdl.unload"):
            return code
        model = self.models.get(model_id)
        if model is None or model["context"] != self.current_context:
            return ACL_ERROR_INVALID_MODEL_ID  # load, execute and unload share one context
        del self.models[model_id]
        return 0

    def _mdl_create_desc(self) -> int:
        if self._enter("acl.mdl.create_desc"):
            return 0
        desc = self._new_id()
        self.descs[desc] = None
        return desc

    def _mdl_get_desc(self, desc: int, model_id: int) -> int:
        if code := self._enter("acl.mdl.get_desc"):
            return code
        if desc not in self.descs or model_id not in self.models:
            return ACL_ERROR_INVALID_PARAM
        self.descs[desc] = model_id
        return 0

    def _mdl_destroy_desc(self, desc: int) -> int:
        if code := self._enter("acl.mdl.destroy_desc"):
            return code
        return 0 if self.descs.pop(desc, 0) != 0 else ACL_ERROR_INVALID_PARAM

    def _tensor(self, desc: int, side: str, index: int) -> dict[str, Any]:
        return self.models[self.descs[desc] or 0][side][index]  # type: ignore[no-any-return]

    def _mdl_get_num_inputs(self, desc: int) -> int:
        return len(self.models[self.descs[desc] or 0]["inputs"])

    def _mdl_get_num_outputs(self, desc: int) -> int:
        return len(self.models[self.descs[desc] or 0]["outputs"])

    def _dims(self, desc: int, side: str, index: int) -> tuple[dict[str, Any], int]:
        if code := self._enter(f"acl.mdl.get_{side[:-1]}_dims"):
            return {}, code
        tensor = self._tensor(desc, side, index)
        dims = list(tensor["dims"])
        return {"name": tensor["name"], "dimCount": len(dims), "dims": dims}, 0

    def _mdl_get_input_dims(self, desc: int, index: int) -> tuple[dict[str, Any], int]:
        return self._dims(desc, "inputs", index)

    def _mdl_get_output_dims(self, desc: int, index: int) -> tuple[dict[str, Any], int]:
        return self._dims(desc, "outputs", index)

    def _mdl_get_input_name_by_index(self, desc: int, index: int) -> str:
        return str(self._tensor(desc, "inputs", index)["name"])

    def _mdl_get_output_name_by_index(self, desc: int, index: int) -> str:
        return str(self._tensor(desc, "outputs", index)["name"])

    def _mdl_get_input_data_type(self, desc: int, index: int) -> int:
        return int(self._tensor(desc, "inputs", index)["type"])

    def _mdl_get_output_data_type(self, desc: int, index: int) -> int:
        return int(self._tensor(desc, "outputs", index)["type"])

    def _mdl_get_input_size_by_index(self, desc: int, index: int) -> int:
        return _size(self._tensor(desc, "inputs", index))

    def _mdl_get_output_size_by_index(self, desc: int, index: int) -> int:
        return _size(self._tensor(desc, "outputs", index))

    def _mdl_create_dataset(self) -> int:
        if self._enter("acl.mdl.create_dataset"):
            return 0
        dataset = self._new_id()
        self.datasets[dataset] = []
        return dataset

    def _mdl_add_dataset_buffer(self, dataset: int, buffer: int) -> tuple[int, int]:
        if code := self._enter("acl.mdl.add_dataset_buffer"):
            return dataset, code
        if dataset not in self.datasets or buffer not in self.buffers:
            return dataset, ACL_ERROR_INVALID_PARAM
        self.datasets[dataset].append(buffer)
        return dataset, 0

    def _mdl_destroy_dataset(self, dataset: int) -> int:
        if code := self._enter("acl.mdl.destroy_dataset"):
            return code
        return 0 if self.datasets.pop(dataset, None) is not None else ACL_ERROR_INVALID_PARAM

    def _mdl_execute(self, model_id: int, inputs: int, outputs: int) -> int:
        if code := self._enter("acl.mdl.execute"):
            return code
        model = self.models.get(model_id)
        if model is None or model["context"] != self.current_context:
            return ACL_ERROR_INVALID_MODEL_ID
        in_buffers, out_buffers = self.datasets.get(inputs), self.datasets.get(outputs)
        if in_buffers is None or out_buffers is None:
            return ACL_ERROR_INVALID_PARAM
        if len(in_buffers) != len(model["inputs"]) or len(out_buffers) != len(model["outputs"]):
            return ACL_ERROR_INVALID_PARAM
        x = self._array(in_buffers[0], model["inputs"][0]).astype(np.float64)
        for buffer, tensor in zip(out_buffers, model["outputs"], strict=True):
            y = (x * model["scale"] + model["bias"]).astype(DTYPES[tensor["type"]])
            pointer, size = self.buffers[buffer]
            self.device_memory[pointer][:size] = y.tobytes()[:size]
        self.executed.append((model_id, model["context"]))
        return 0

    def _array(self, buffer: int, tensor: dict[str, Any]) -> np.ndarray:
        pointer, size = self.buffers[buffer]
        raw = bytes(self.device_memory[pointer][:size])
        return np.frombuffer(raw, DTYPES[tensor["type"]]).reshape(tensor["dims"])


_RT = [
    "set_device", "reset_device", "create_context", "set_context", "destroy_context",
    "get_run_mode", "malloc", "free", "malloc_host", "free_host", "memcpy",
]  # fmt: skip
_MDL = [
    "load_from_file", "unload", "create_desc", "get_desc", "destroy_desc",
    "get_num_inputs", "get_num_outputs", "get_input_dims", "get_output_dims",
    "get_input_name_by_index", "get_output_name_by_index",
    "get_input_data_type", "get_output_data_type",
    "get_input_size_by_index", "get_output_size_by_index",
    "create_dataset", "add_dataset_buffer", "destroy_dataset", "execute",
]  # fmt: skip
