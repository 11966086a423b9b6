"""Capped samples of the inputs a running skill was least sure of, one message per window.

Opt-in per deployment, in the deployment's skill config (the desired state's
``SkillSpec.config``; a bundle's own ``[config]`` defaults cannot turn it on):

- ``drift.samples = "on"``: upload samples (anything else but ``"off"`` is bad);
- ``drift.samples_max``: most samples per telemetry window (default 16);
- ``drift.samples_bytes``: most bytes of samples per window (default 64 KiB);
- ``drift.samples_below``: only results less confident than this (default 0.6).

Every value is parsed strictly; a bad one (or an unknown ``drift.samples*`` key,
a typo) turns sampling off for that version, logged once. Whatever the hub
asks, the agent's own :class:`SampleCaps` (at most :data:`HARD_MAX_COUNT` and
:data:`HARD_MAX_BYTES`, which the device owner can lower) bound it.

A :class:`SampleCollector` keeps, within one window, the lowest-confidence
inputs under the count and byte caps (a bounded heap whose top is the most
confident kept sample, the first to make room). An input is the item's array
named by the manifest's first input, encoded with :mod:`skills.tensor_codec`
(fp16 when the array is fp16, else fp32); one that is not a numeric array, is
empty or not finite, or would alone exceed a cap is skipped whole, never cut.
:class:`SampleWatch` holds the collectors of the versions an agent runs; at
each telemetry window the agent takes one ``pb.DriftSamples`` per version that
kept anything and sends it up through its durable outbox. Pure: no I/O.
"""

from __future__ import annotations

import heapq
import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from edge_agent.errors import AgentError
from protos import pb
from protos.limits import MAX_ENVELOPE_BYTES
from skills.codec_limits import CodecLimits
from skills.errors import TensorCodecError
from skills.manifest import Manifest

__all__ = [
    "HARD_MAX_BYTES",
    "HARD_MAX_COUNT",
    "INPUT_PROBLEMS",
    "MAX_INPUT_BYTES",
    "SampleCaps",
    "SampleCollector",
    "SampleConfigError",
    "SampleSettings",
    "SampleWatch",
    "parse_settings",
]

log = logging.getLogger(__name__)

#: Most samples in one window's message, whatever a deployment asks.
HARD_MAX_COUNT = 64
#: Most bytes of samples in one window's message: 256 KiB less room for the envelope
#: around them (ids, device, skill, version), so the envelope stays under its cap.
HARD_MAX_BYTES = MAX_ENVELOPE_BYTES - 2048
#: Largest input (its tensor data) one sample carries; the hub refuses larger ones.
MAX_INPUT_BYTES = 64 * 1024
#: Most dimensions of a sampled input, and classes below this (the hub's caps).
MAX_INPUT_NDIM = 6
MAX_CLASS = 1024

_PREFIX = "drift.samples"
_KEYS = frozenset({_PREFIX, f"{_PREFIX}_max", f"{_PREFIX}_bytes", f"{_PREFIX}_below"})
_INT_RE = re.compile(r"[0-9]{1,9}")
_FLOAT_RE = re.compile(r"[0-9]{1,3}(\.[0-9]{1,9})?|\.[0-9]{1,9}")
_LIMITS = CodecLimits(
    max_tensors=1, max_elements=MAX_INPUT_BYTES, max_bytes=MAX_INPUT_BYTES, max_ndim=MAX_INPUT_NDIM
)
#: What :meth:`SampleCollector.offer` says of an input it could not take.
INPUT_PROBLEMS = frozenset({"no-input", "too-large", "not-finite"})

#: A running skill version: ``(name, version)``.
Key = tuple[str, str]


class SampleConfigError(AgentError):
    """A deployment's ``drift.samples*`` config is malformed."""


@dataclass(frozen=True)
class SampleCaps:
    """The device owner's caps on samples, per window; deployments can only ask less.

    Attributes:
        max_count: Most samples (0: this device uploads none).
        max_bytes: Most bytes of samples.
    """

    max_count: int = HARD_MAX_COUNT
    max_bytes: int = HARD_MAX_BYTES

    def __post_init__(self) -> None:
        """Check the caps.

        Raises:
            ValueError: A cap is negative or above the hard cap.
        """
        if not 0 <= self.max_count <= HARD_MAX_COUNT:
            raise ValueError(f"max_count must be 0..{HARD_MAX_COUNT}, got {self.max_count}")
        if not 0 <= self.max_bytes <= HARD_MAX_BYTES:
            raise ValueError(f"max_bytes must be 0..{HARD_MAX_BYTES}, got {self.max_bytes}")


@dataclass(frozen=True)
class SampleSettings:
    """What one deployment asks for (see the module's docstring).

    Attributes:
        max_count: Most samples per window.
        max_bytes: Most bytes of samples per window.
        below: Only results with a confidence below this are sampled.
    """

    max_count: int = 16
    max_bytes: int = 64 * 1024
    below: float = 0.6

    def __post_init__(self) -> None:
        """Check the settings.

        Raises:
            ValueError: A cap is negative or the threshold is not in ``(0, 1]``.
        """
        if self.max_count < 0 or self.max_bytes < 0:
            raise ValueError(f"caps must not be negative: {self.max_count}, {self.max_bytes}")
        if not 0.0 < self.below <= 1.0:
            raise ValueError(f"below must be in (0, 1], got {self.below}")

    def within(self, caps: SampleCaps) -> SampleSettings:
        """These settings, lowered to ``caps``."""
        return replace(
            self,
            max_count=min(self.max_count, caps.max_count),
            max_bytes=min(self.max_bytes, caps.max_bytes),
        )


def parse_settings(config: Mapping[str, str]) -> SampleSettings | None:
    """A deployment's sample settings; ``None`` unless ``drift.samples`` is ``"on"``.

    Raises:
        SampleConfigError: ``drift.samples`` is neither ``"on"`` nor ``"off"``, a count
            or a byte cap is not a positive integer, the threshold is not a decimal
            in ``(0, 1]``, or a ``drift.samples*`` key is unknown.
    """
    unknown = sorted(k for k in config if k.startswith(_PREFIX) and k not in _KEYS)
    if unknown:
        raise SampleConfigError(f"unknown config keys {unknown[:4]}")
    switch = config.get(_PREFIX, "off")
    if switch not in ("on", "off"):
        raise SampleConfigError(f"{_PREFIX} must be 'on' or 'off', got {switch[:32]!r}")
    if switch == "off":
        return None
    defaults = SampleSettings()
    below = config.get(f"{_PREFIX}_below")
    return SampleSettings(
        max_count=_positive(config, f"{_PREFIX}_max", defaults.max_count),
        max_bytes=_positive(config, f"{_PREFIX}_bytes", defaults.max_bytes),
        below=defaults.below if below is None else _threshold(below),
    )


def _positive(config: Mapping[str, str], key: str, default: int) -> int:
    text = config.get(key)
    if text is None:
        return default
    if not _INT_RE.fullmatch(text) or int(text) == 0:
        raise SampleConfigError(f"{key} must be a positive integer, got {text[:32]!r}")
    return int(text)


def _threshold(text: str) -> float:
    value = float(text) if _FLOAT_RE.fullmatch(text) else math.nan
    if not 0.0 < value <= 1.0:
        raise SampleConfigError(f"{_PREFIX}_below must be in (0, 1], got {text[:32]!r}")
    return value


def _framed(size: int) -> int:
    """Bytes a message of ``size`` bytes takes as one element of a repeated field."""
    return 1 + max(1, (size.bit_length() + 6) // 7) + size


def _answer(result: object) -> tuple[int, float] | None:
    """The predicted class and confidence of a result; ``None`` when it has no answer.

    Raises:
        ValueError: The class is not an integer in ``[0, MAX_CLASS)`` or the
            confidence not a number in ``[0, 1]``.
    """
    if not isinstance(result, Mapping) or "label" not in result or "confidence" not in result:
        return None
    import numpy as np  # noqa: PLC0415 - results come only from a running skill

    predicted, confidence = result["label"], result["confidence"]
    if isinstance(predicted, bool) or not isinstance(predicted, int | np.integer):
        raise ValueError(f"a class of type {type(predicted).__name__}, not an integer")
    if not 0 <= int(predicted) < MAX_CLASS:
        raise ValueError(f"class {int(predicted)} outside [0, {MAX_CLASS})")
    if isinstance(confidence, bool) or not isinstance(confidence, int | float | np.number):
        raise ValueError(f"a confidence of type {type(confidence).__name__}")
    value = float(confidence)
    if not 0.0 <= value <= 1.0:  # NaN fails this too
        raise ValueError(f"confidence {value!r} outside [0, 1]")
    return int(predicted), value


class SampleCollector:
    """The lowest-confidence inputs of one skill version in the current window.

    Args:
        skill: The skill's name.
        version: Its version.
        input_name: The item key (the manifest's first input) whose array is sampled.
        settings: The caps and threshold, already within the device's caps.
    """

    def __init__(self, skill: str, version: str, input_name: str, settings: SampleSettings) -> None:
        self.skill, self.version, self.input_name = skill, version, input_name
        self.settings = settings
        #: ``(-confidence, order, framed size, sample)``: the most confident kept on top.
        self._heap: list[tuple[float, int, int, pb.DriftSample]] = []
        self._bytes = 0
        self._order = 0

    @property
    def kept_bytes(self) -> int:
        """Bytes the window's samples take in their message."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._heap)

    def offer(
        self, item: Mapping[str, Any], result: object, label: int | None, seen_at_ms: int
    ) -> str:
        """Consider one answered item for the window's samples.

        Args:
            item: What the skill was given.
            result: What it answered.
            label: The item's true class, when the source knows it.
            seen_at_ms: When the item was seen, ms since the epoch.

        Returns:
            ``"kept"``, or why not: ``"no-answer"``, ``"confident"`` (not below the
            threshold), ``"outranked"`` (the kept ones are all less confident), or an
            input problem (:data:`INPUT_PROBLEMS`).

        Raises:
            ValueError: The result's class or confidence cannot be sampled.
        """
        answer = _answer(result)
        if answer is None:
            return "no-answer"
        predicted, confidence = answer
        if confidence >= self.settings.below:
            return "confident"
        if len(self._heap) >= self.settings.max_count and confidence >= -self._heap[0][0]:
            return "outranked"  # before any encoding: the common case stays cheap
        tensor = self._tensor(item.get(self.input_name))
        if isinstance(tensor, str):
            return tensor
        sample = pb.DriftSample(
            input=tensor,
            predicted=predicted,
            confidence=confidence,
            label=label if label is not None and 0 <= label < MAX_CLASS else -1,
            seen_at_ms=max(0, seen_at_ms),
        )
        size = _framed(sample.ByteSize())
        if size > self.settings.max_bytes:
            return "too-large"
        return self._keep(confidence, size, sample)

    def _tensor(self, value: object) -> pb.TensorProto | str:
        """The input as a tensor message, or the problem with it."""
        import numpy as np  # noqa: PLC0415 - only a running skill's inputs are sampled

        from skills.tensor_codec import encode_protos  # noqa: PLC0415 - numpy, as above

        if not isinstance(value, np.ndarray) or value.dtype.kind not in "biuf" or value.size == 0:
            return "no-input"
        codec = "fp16" if value.dtype == np.float16 else "fp32"
        data_bytes = value.size * (2 if codec == "fp16" else 4)
        too_big = data_bytes > min(MAX_INPUT_BYTES, self.settings.max_bytes)
        if too_big or value.ndim > MAX_INPUT_NDIM:
            return "too-large"  # checked before any copy, so a huge frame costs nothing
        with np.errstate(over="ignore"):
            array = np.ascontiguousarray(value, dtype=np.float32)
        if not np.isfinite(array).all():
            return "not-finite"
        try:
            (tensor,) = encode_protos({self.input_name: array}, [self.input_name], codec, _LIMITS)
        except TensorCodecError:
            return "too-large"  # a shape over the codec's caps
        return tensor

    def _full(self, size: int) -> bool:
        """Whether one more sample of ``size`` bytes is over a cap."""
        settings = self.settings
        return len(self._heap) >= settings.max_count or self._bytes + size > settings.max_bytes

    def _keep(self, confidence: float, size: int, sample: pb.DriftSample) -> str:
        evicted = []
        # Only more confident samples make room; equally sure ones keep their place.
        while self._heap and -self._heap[0][0] > confidence and self._full(size):
            evicted.append(heapq.heappop(self._heap))
            self._bytes -= evicted[-1][2]
        if self._full(size):
            for entry in evicted:  # not enough room even so: the window stays as it was
                heapq.heappush(self._heap, entry)
                self._bytes += entry[2]
            return "outranked"
        self._order += 1
        heapq.heappush(self._heap, (-confidence, self._order, size, sample))
        self._bytes += size
        return "kept"

    def flush(self) -> pb.DriftSamples | None:
        """Close the window: its samples, least confident first, or ``None`` if none."""
        if not self._heap:
            return None
        kept = sorted(self._heap, key=lambda entry: (-entry[0], entry[1]))
        self._heap, self._bytes = [], 0
        return pb.DriftSamples(
            skill=self.skill, version=self.version, samples=[entry[3] for entry in kept]
        )


class SampleWatch:
    """The sample collectors of the skill versions an agent runs.

    Call it on the agent's event loop only; nothing here blocks.

    Args:
        caps: The device owner's caps, bounding every deployment's settings.
    """

    def __init__(self, caps: SampleCaps | None = None) -> None:
        self.caps = caps or SampleCaps()
        self._collectors: dict[Key, SampleCollector] = {}
        #: A stopped version's last window, waiting for the next telemetry window.
        self._ready: dict[Key, pb.DriftSamples] = {}
        self._logged: set[tuple[Key, str]] = set()

    def sampling(self, name: str, version: str) -> SampleSettings | None:
        """The settings that version is sampled with, or ``None`` when it is not."""
        collector = self._collectors.get((name, version))
        return None if collector is None else collector.settings

    def attach(
        self, name: str, version: str, manifest: Manifest, config: Mapping[str, str]
    ) -> None:
        """Start sampling a started version when its deployment's ``config`` asks for it."""
        key = (name, version)
        try:
            asked = parse_settings(config)
        except SampleConfigError as exc:
            self._log_once(key, "config", "uploads no drift samples: bad config: %s", exc)
            return
        if asked is None:
            return
        settings = asked.within(self.caps)
        if settings.max_count == 0 or settings.max_bytes == 0 or not manifest.inputs:
            why = "this device allows none" if manifest.inputs else "its manifest has no input"
            self._log_once(key, "off", "uploads no drift samples: %s", why)
            return
        if settings != asked:
            self._log_once(key, "capped", "drift samples capped by this device to %s", settings)
        self._collectors[key] = SampleCollector(name, version, manifest.inputs[0].name, settings)

    def detach(self, name: str) -> None:
        """Stop sampling every version of a stopped skill; their last windows are kept."""
        for key in [k for k in self._collectors if k[0] == name]:
            message = self._collectors.pop(key).flush()
            if message is not None:  # a second stop in one window loses its samples
                self._ready.setdefault(key, message)

    def observe(
        self,
        key: Key,
        item: Mapping[str, Any],
        result: object,
        label: int | None,
        seen_at_ms: int,
    ) -> None:
        """Offer one answered item of a version (ignored when that version is not sampled)."""
        collector = self._collectors.get(key)
        if collector is None:
            return
        try:
            outcome = collector.offer(item, result, label, seen_at_ms)
        except ValueError as exc:
            self._log_once(key, "results", "returns results drift samples cannot use: %s", exc)
            return
        if outcome in INPUT_PROBLEMS:
            self._log_once(key, outcome, "has inputs drift samples skip: %s", outcome)

    def flush_all(self) -> list[pb.DriftSamples]:
        """Close every version's window: one message per version that kept samples."""
        ready, self._ready = self._ready, {}
        for key, collector in self._collectors.items():
            # Behind a stopped run's window, the restarted run's waits for the next one.
            message = None if key in ready else collector.flush()
            if message is not None:
                ready[key] = message
        return list(ready.values())

    def _log_once(self, key: Key, what: str, message: str, detail: object) -> None:
        if (key, what) not in self._logged:
            self._logged.add((key, what))
            log.warning("skill %s %s " + message, key[0], key[1], detail)
