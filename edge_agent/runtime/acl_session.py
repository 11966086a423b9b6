"""pyACL's process-wide state for :mod:`edge_agent.runtime.acl`, and its error handling.

``acl.init`` may run once per process, and a model is loaded, run and unloaded in one
context on one device, so one :class:`AclSession` holds that state for every model. Every
nonzero pyACL return code becomes a :class:`RuntimeBackendError` naming the call and the
code (:func:`check_ret`, :func:`ret_value`, :func:`non_null`); :func:`unwind` undoes what
a failed step had made.

Tested here only against a fake of the pyACL API (``tests/fakes/fake_acl.py``) written
from Huawei's pyACL reference; it needs a real Ascend 310 to be verified.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any, Protocol, TypeVar

from edge_agent.errors import RuntimeBackendError

__all__ = [
    "ACL_HOST",
    "ACL_MEMCPY_DEVICE_TO_DEVICE",
    "ACL_MEMCPY_DEVICE_TO_HOST",
    "ACL_MEMCPY_HOST_TO_DEVICE",
    "ACL_MEM_MALLOC_HUGE_FIRST",
    "DEVICE_ID_ENV",
    "AclSession",
    "Closable",
    "Undo",
    "check_ret",
    "non_null",
    "ret_value",
    "shared_session",
    "unwind",
]

_log = logging.getLogger(__name__)

#: The environment variable naming the NPU to use (CANN's own convention).
DEVICE_ID_ENV = "ASCEND_DEVICE_ID"

ACL_SUCCESS = 0
ACL_ERROR_REPEAT_INITIALIZE = 100002
ACL_MEM_MALLOC_HUGE_FIRST = 0
ACL_MEMCPY_HOST_TO_DEVICE = 1
ACL_MEMCPY_DEVICE_TO_HOST = 2
ACL_MEMCPY_DEVICE_TO_DEVICE = 3
ACL_HOST = 1  # acl.rt.get_run_mode(); 0 (ACL_DEVICE): the app runs on the board's own CPU

_T = TypeVar("_T")
#: An undo step: the pyACL call's name (for messages) and the call.
Undo = tuple[str, Callable[[], object]]


class Closable(Protocol):
    """A model the session closes at exit if its owner did not."""

    def close_quietly(self) -> None:
        """Free the model's resources, logging (not raising) what fails."""


def check_ret(ret: int, call: str) -> None:
    """Raise :class:`RuntimeBackendError` for a nonzero pyACL return code."""
    if ret != ACL_SUCCESS:
        raise RuntimeBackendError(f"{call} failed with ACL error {ret}")


def ret_value(result: tuple[_T, int], call: str) -> _T:
    """The value of a pyACL ``(value, ret)`` pair, once ``ret`` is checked."""
    value, ret = result
    check_ret(ret, call)
    return value


def non_null(value: _T, call: str) -> _T:
    """A handle from a pyACL constructor that signals failure with a null (0) pointer."""
    if not value:
        raise RuntimeBackendError(f"{call} returned a null handle")
    return value


def unwind(steps: list[Undo]) -> list[str]:
    """Run undo steps, last first, all of them; the failures, as messages."""
    errors = []
    while steps:
        call, undo = steps.pop()
        try:
            ret = undo()
        except RuntimeBackendError as exc:
            errors.append(str(exc))
            continue
        if isinstance(ret, int) and ret != ACL_SUCCESS:
            errors.append(f"{call} failed with ACL error {ret}")
    return errors


def _device_id() -> int:
    raw = os.environ.get(DEVICE_ID_ENV, "0")
    if not raw.strip().isdigit():
        raise RuntimeBackendError(f"{DEVICE_ID_ENV} must be a device number, got {raw!r}")
    return int(raw)


class AclSession:
    """pyACL's process-wide state: initialised once, one device and context for all models.

    ``acl.init`` may run only once per process, so it is undone only at exit (an
    ``atexit`` hook calls :meth:`shutdown`). The device and its context are counted:
    opened for the first model, closed when the last one closes.

    Args:
        device_id: The NPU to use; by default ``$ASCEND_DEVICE_ID``, else 0.

    Raises:
        RuntimeBackendError: ``$ASCEND_DEVICE_ID`` is not a device number.
    """

    def __init__(self, device_id: int | None = None) -> None:
        self.device_id = _device_id() if device_id is None else device_id
        #: Whether the app runs on a host beside the NPU (a card) rather than on the board.
        self.host_run_mode = True
        self._lock = threading.RLock()
        self._acl: Any = None
        self._owns_init = False
        self._context: Any = None
        self._users = 0
        self._open: set[Closable] = set()

    def acquire(self, acl: ModuleType) -> None:
        """Initialise pyACL (once) and open the device, for one more model.

        Raises:
            RuntimeBackendError: A pyACL call failed; nothing is left open by this call.
        """
        with self._lock:
            if self._acl is None:
                ret = acl.init()
                if ret == ACL_ERROR_REPEAT_INITIALIZE:  # someone else's; theirs to finalize
                    _log.info("pyACL was already initialised in this process")
                else:
                    check_ret(ret, "acl.init")
                    self._owns_init = True
                self._acl = acl
                atexit.register(self.shutdown)
            if self._users == 0:
                self._open_device()
            self._users += 1

    def _open_device(self) -> None:
        acl = self._acl
        check_ret(acl.rt.set_device(self.device_id), f"acl.rt.set_device({self.device_id})")
        undo: list[Undo] = [("acl.rt.reset_device", lambda: acl.rt.reset_device(self.device_id))]
        try:
            context = ret_value(acl.rt.create_context(self.device_id), "acl.rt.create_context")
            undo.append(("acl.rt.destroy_context", lambda: acl.rt.destroy_context(context)))
            run_mode = ret_value(acl.rt.get_run_mode(), "acl.rt.get_run_mode")
        except Exception as exc:
            for error in unwind(undo):
                exc.add_note(f"while cleaning up: {error}")
            raise
        self._context = context
        self.host_run_mode = run_mode == ACL_HOST

    def release(self) -> None:
        """One model fewer; the last one closes the context and resets the device.

        Raises:
            RuntimeBackendError: Closing the context or resetting the device failed.
        """
        with self._lock:
            self._users -= 1
            if self._users > 0:
                return
            acl, context, self._context = self._acl, self._context, None
            errors = unwind(
                [
                    ("acl.rt.reset_device", lambda: acl.rt.reset_device(self.device_id)),
                    ("acl.rt.destroy_context", lambda: acl.rt.destroy_context(context)),
                ]
            )
        if errors:
            raise RuntimeBackendError("; ".join(errors))

    def bind(self) -> None:
        """Make the session's context current in the calling thread (contexts are per thread).

        Raises:
            RuntimeBackendError: ``acl.rt.set_context`` failed.
        """
        check_ret(self._acl.rt.set_context(self._context), "acl.rt.set_context")

    def shutdown(self) -> None:
        """Close the models still open, then finalize pyACL if this session initialised it.

        Called at exit; failures are logged, since nothing is left to raise them to.
        """
        with self._lock:
            still_open = list(self._open)
        for model in still_open:
            model.close_quietly()
        with self._lock:
            if self._acl is not None and self._owns_init:
                ret = self._acl.finalize()
                if ret != ACL_SUCCESS:
                    _log.warning("acl.finalize failed with ACL error %s", ret)
            self._acl, self._owns_init = None, False

    def opened(self, model: Closable) -> None:
        """Track an open model, closed by :meth:`shutdown` if still open at exit."""
        with self._lock:
            self._open.add(model)

    def closed(self, model: Closable) -> None:
        """Stop tracking a closed model."""
        with self._lock:
            self._open.discard(model)


_shared: AclSession | None = None
_shared_lock = threading.Lock()


def shared_session() -> AclSession:
    """The process's session, made on first use (reading ``$ASCEND_DEVICE_ID`` then).

    Raises:
        RuntimeBackendError: ``$ASCEND_DEVICE_ID`` is not a device number.
    """
    global _shared  # noqa: PLW0603 - pyACL's state is process-wide, so the session is too
    with _shared_lock:
        if _shared is None:
            _shared = AclSession()
        return _shared
