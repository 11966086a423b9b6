"""Drift samples from devices: checked on arrival, before anything is stored.

An agent may send (opt-in per deployment) a ``DriftSamples`` envelope: inputs a
running skill was least sure of, with its answer, its confidence and the true
label where one came back. Everything in it comes from outside, so
:func:`samples_from_wire` checks it all under :class:`SampleCaps` and refuses
the whole envelope when one sample is bad (nothing partial is stored). Each
input tensor is decoded with :func:`skills.tensor_codec.decode_protos` under
caps, which checks its dtype, shape and data length before allocating.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cloud.errors import ValidationError
from cloud.store import checks as check
from protos import pb
from protos.errors import ProtocolError
from skills.errors import TensorCodecError
from skills.tensor_codec import CodecLimits, decode_protos

__all__ = [
    "DEFAULT_CAPS",
    "MAX_LABEL",
    "SampleBatch",
    "SampleCaps",
    "SampleDraft",
    "decode_input",
    "samples_from_wire",
]

#: Labels (and predicted classes) are below this; -1 means "no label came back".
MAX_LABEL = 1024


@dataclass(frozen=True)
class SampleCaps:
    """Caps on one ``DriftSamples`` envelope.

    Attributes:
        max_samples: Most samples in one envelope.
        max_tensor_bytes: Largest input tensor (its data bytes).
        max_ndim: Most dimensions of an input tensor.
    """

    max_samples: int = 64
    max_tensor_bytes: int = 64 * 1024
    max_ndim: int = 6

    @property
    def codec(self) -> CodecLimits:
        """The tensor codec's caps for one input."""
        return CodecLimits(
            max_tensors=1,
            max_elements=self.max_tensor_bytes,
            max_bytes=self.max_tensor_bytes,
            max_ndim=self.max_ndim,
        )


DEFAULT_CAPS = SampleCaps()


@dataclass(frozen=True)
class SampleDraft:
    """One checked sample, ready to store.

    Attributes:
        tensor: The input's ``TensorProto``, serialised (as it was checked).
        shape: The input's shape.
        predicted: The class the skill answered.
        confidence: Its confidence, in ``[0, 1]``.
        label: The true class, or -1 when none came back.
        seen_at_ms: When the device saw the input (0: not said).
    """

    tensor: bytes
    shape: tuple[int, ...]
    predicted: int
    confidence: float
    label: int
    seen_at_ms: int


@dataclass(frozen=True)
class SampleBatch:
    """The checked samples of one envelope, all of one skill version."""

    skill: str
    version: str
    samples: tuple[SampleDraft, ...]


def _refuse(message: str) -> ProtocolError:
    return ProtocolError(f"drift samples refused: {message}")


def decode_input(tensor: pb.TensorProto, caps: SampleCaps = DEFAULT_CAPS) -> tuple[int, ...]:
    """Check one input tensor under the caps; its shape.

    Raises:
        ProtocolError: Over the byte cap, an unknown dtype, a shape that does
            not match the data, bad int8 parameters or too many dimensions.
    """
    if len(tensor.data) > caps.max_tensor_bytes:
        raise _refuse(f"an input of {len(tensor.data)} bytes, over {caps.max_tensor_bytes}")
    unnamed = pb.TensorProto()
    unnamed.CopyFrom(tensor)
    unnamed.name = ""  # matched by position: the name is the device's own
    try:
        arrays = decode_protos([unnamed], ["input"], caps.codec)
    except TensorCodecError as exc:
        raise _refuse(f"a bad input tensor: {exc}") from exc
    array = arrays["input"]
    if array.size == 0 or not bool(math.isfinite(float(array.sum(dtype="float64")))):
        raise _refuse("an input tensor that is empty or not finite")
    return tuple(int(d) for d in array.shape)


def _sample(sample: pb.DriftSample, caps: SampleCaps) -> SampleDraft:
    shape = decode_input(sample.input, caps)
    confidence = float(sample.confidence)
    if not (math.isfinite(confidence) and 0.0 <= confidence <= 1.0):
        raise _refuse(f"confidence {confidence!r} is not in [0, 1]")
    if not 0 <= sample.predicted < MAX_LABEL:
        raise _refuse(f"predicted class {sample.predicted} is not in [0, {MAX_LABEL})")
    if not -1 <= sample.label < MAX_LABEL:
        raise _refuse(f"label {sample.label} is not in [-1, {MAX_LABEL})")
    if sample.seen_at_ms < 0:
        raise _refuse(f"seen_at_ms {sample.seen_at_ms} is negative")
    return SampleDraft(
        tensor=sample.input.SerializeToString(deterministic=True),
        shape=shape,
        predicted=int(sample.predicted),
        confidence=confidence,
        label=int(sample.label),
        seen_at_ms=int(sample.seen_at_ms),
    )


def samples_from_wire(msg: pb.DriftSamples, caps: SampleCaps = DEFAULT_CAPS) -> SampleBatch:
    """Check a ``DriftSamples`` body; all its samples or none.

    Raises:
        ProtocolError: No samples or more than ``caps.max_samples``, a bad skill
            name or version, or a bad sample (tensor, confidence, class, label, time).
    """
    count = len(msg.samples)
    if not 1 <= count <= caps.max_samples:
        raise _refuse(f"{count} samples; an envelope carries 1..{caps.max_samples}")
    try:
        check.name(msg.skill, "skill name")
        check.version(msg.version)
    except ValidationError as exc:
        raise _refuse(str(exc)) from exc
    return SampleBatch(msg.skill, msg.version, tuple(_sample(s, caps) for s in msg.samples))
