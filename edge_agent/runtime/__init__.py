"""The runtime facade: the best model variant and backend for this device.

Importing this package imports neither OpenVINO, LiteRT nor pyACL; each backend
loads its library the first time it is asked whether it is available. The pyACL
backend (Ascend ``.om`` models, :mod:`edge_agent.runtime.acl`) is one of the
default backends.
"""

from edge_agent.runtime.backends import (
    Backend,
    LiteRtBackend,
    LoadedModel,
    OnnxRuntimeBackend,
    OpenVinoBackend,
    default_backends,
)
from edge_agent.runtime.facade import Runtime
from edge_agent.runtime.selection import backend_for, select_variant

__all__ = [
    "Backend",
    "LiteRtBackend",
    "LoadedModel",
    "OnnxRuntimeBackend",
    "OpenVinoBackend",
    "Runtime",
    "backend_for",
    "default_backends",
    "select_variant",
]
