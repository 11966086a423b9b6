"""The caps of :mod:`skills.tensor_codec`, without numpy.

The agent sizes its messages and its split settings with these while idle; the
codec itself (numpy) is imported only once a tensor is encoded or decoded.
:mod:`skills.tensor_codec` re-exports every name here.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "BYTES_PER_FP32",
    "CODECS",
    "DEFAULT_LIMITS",
    "MAX_INFER_BYTES",
    "WIRE_LIMITS",
    "CodecLimits",
]

CODECS = ("fp32", "fp16", "int8")
#: Each codec's payload per float32 byte (int8's scale and zero point aside).
BYTES_PER_FP32 = {"fp32": 1.0, "fp16": 0.5, "int8": 0.25}


@dataclass(frozen=True)
class CodecLimits:
    """Caps on one payload.

    Attributes:
        max_tensors: Most tensors.
        max_elements: Most values over all tensors.
        max_bytes: Largest encoded payload.
        max_ndim: Most dimensions per tensor.
        max_name_bytes: Longest tensor name (UTF-8).
    """

    max_tensors: int = 16
    max_elements: int = 16 * 1024 * 1024
    max_bytes: int = 64 * 1024 * 1024
    max_ndim: int = 8
    max_name_bytes: int = 256

    def __post_init__(self) -> None:
        """Check the caps are positive.

        Raises:
            ValueError: A cap is not positive.
        """
        for name in ("max_tensors", "max_elements", "max_bytes", "max_ndim", "max_name_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"CodecLimits.{name} must be positive")


DEFAULT_LIMITS = CodecLimits()
#: Largest ``InferRequest`` or ``InferResponse`` either side sends or accepts, on either
#: transport (under the hub's 1 MiB gRPC receive cap and the broker's packet cap).
MAX_INFER_BYTES = 1000 * 1024
#: Caps on the tensors of one inference message: what fits in :data:`MAX_INFER_BYTES`.
WIRE_LIMITS = CodecLimits(max_tensors=64, max_bytes=MAX_INFER_BYTES - 16 * 1024)
