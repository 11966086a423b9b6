"""Per-model state of split and joint inference on the agent: costs, plan, back-off.

No I/O and no asyncio: the runtime (:mod:`edge_agent.split.runtime`) asks a
route for the plan before each item, has it check and encode a tail request,
and tells it how the request went. Time comes from a clock passed in.

A :class:`SplitCoordinator` (one per skill version and split model) keeps the
model's :class:`~edge_agent.split.planner.CostTable`: device time per segment
from the control process's profiling run (or the plan's reference until then),
hub time from the plan scaled by what the hub reports (``hub_ms``), the hub's
queueing (``queue_ms``), bytes from the plan and the manifest's codec. Each
request it plans with hysteresis on the agent's shared link estimate. A failed
request (refused, timed out, link lost) makes it plan device-only for a back-off
that doubles on each further failure; the first request after it is the probe.
A :class:`JointRoute` does the same back-off for a joint pair.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from edge_agent.split.link import LinkEstimator, RequestSample
from edge_agent.split.planner import (
    DEFAULT_HYSTERESIS,
    CostTable,
    CutCost,
    Hysteresis,
    plan,
)
from protos import pb
from skills.codec_limits import BYTES_PER_FP32, DEFAULT_LIMITS, CodecLimits
from skills.errors import TensorCodecError

if TYPE_CHECKING:
    import numpy as np

    from edge_agent.split.segments import CutLike, PlanLike
    from skills.manifest import JointSpec, SplitSpec

__all__ = [
    "DEVICE",
    "JOINT",
    "JointRoute",
    "Route",
    "Shared",
    "SplitCoordinator",
    "SplitRefused",
    "SplitSettings",
]

#: The plan value (and cut name) of running wholly on the device.
DEVICE = "device"
#: The plan value of a joint pair whose hard inputs may go to the hub.
JOINT = "joint"
_JOINT_CODEC = "fp32"


class SplitRefused(ValueError):
    """A tail request does not fit the skill's own plan; it never reaches the hub."""


@dataclass(frozen=True)
class SplitSettings:
    """How the agent plans and backs off; conservative defaults.

    Attributes:
        backoff_first_s: Device-only time after a first failure.
        backoff_max_s: The longest back-off (it doubles on each failed probe).
        hysteresis: Margins that keep the current cut.
        probe_interval_s: While the plan is device-only with the hub usable, one request
            this often goes to the cheapest remote cut anyway, so that the link estimate
            (learned only from requests) sees the link get better again.
        ping_interval_s: While a skill has split or joint models, the agent times a
            ping to the hub this often (the RTT estimate's own samples).
        ping_timeout_s: A ping not answered within this long is forgotten.
        pessimism: Plan on the link this many deviations worse than estimated.
        smoothing: Weight of each new hub time and queue time in their running means.
        limits: Caps on what is encoded and decoded.
    """

    backoff_first_s: float = 1.0
    backoff_max_s: float = 30.0
    hysteresis: Hysteresis = DEFAULT_HYSTERESIS
    probe_interval_s: float = 1.0
    ping_interval_s: float = 1.0
    ping_timeout_s: float = 2.0
    pessimism: float = 0.0
    smoothing: float = 0.3
    limits: CodecLimits = field(default_factory=lambda: DEFAULT_LIMITS)


@dataclass(frozen=True)
class Shared:
    """What every route of one agent shares.

    Attributes:
        link: The agent's link estimator (one link to one hub).
        lock: Guards the link and every route's state: the event loop writes them,
            the threads waiting for items read them.
        settings: Planning settings.
        clock: Monotonic seconds.
    """

    link: LinkEstimator
    lock: threading.Lock
    settings: SplitSettings
    clock: Callable[[], float]


class Route:
    """What a split model and a joint pair share: back-off, counters, link feeding.

    Args:
        skill: The skill's name.
        version: Its version.
        model: The model's name (a joint pair's small model).
        deadline_ms: The manifest's deadline for the hub's answer.
        shared: The agent's link, lock, settings and clock.
    """

    def __init__(
        self, skill: str, version: str, model: str, deadline_ms: int, shared: Shared
    ) -> None:
        self.skill, self.version, self.model = skill, version, model
        self.deadline_s = max(deadline_ms, 1) / 1000.0
        self.link = shared.link
        self.lock = shared.lock
        self.settings = shared.settings
        self.clock = shared.clock
        self._retry_at = 0.0
        self._wait_s = self.settings.backoff_first_s
        #: When the hub last answered or failed a request (the link was last measured).
        self.last_contact: float | None = None
        #: Requests by outcome: ``ok``, ``refused``, ``timeout``, ``link``, ``bad-response``.
        self.outcomes: dict[str, int] = {}

    @property
    def hub_model(self) -> str:
        """The model the hub runs for this route."""
        return self.model

    @property
    def output_names(self) -> Sequence[str]:
        """The names to give outputs the hub did not name."""
        return ()

    def decide(self) -> str:
        """The plan for the next request.

        Raises:
            NotImplementedError: Always; subclasses decide.
        """
        raise NotImplementedError

    def encode(self, split: str, tensors: Mapping[str, np.ndarray]) -> list[pb.TensorProto]:
        """Check and encode a request's tensors.

        Raises:
            NotImplementedError: Always; subclasses encode.
        """
        raise NotImplementedError

    def hub_usable(self, now: float) -> bool:
        """Whether the hub may be asked now (no back-off running)."""
        return now >= self._retry_at

    def succeeded(self, sample: RequestSample) -> None:
        """A request was answered: learn the link, end any back-off."""
        with self.lock:
            self.link.observe(sample)
            self._wait_s = self.settings.backoff_first_s
            self._retry_at = 0.0
            self.last_contact = self.clock()
            self.outcomes["ok"] = self.outcomes.get("ok", 0) + 1

    def failed(self, kind: str, sample: RequestSample | None = None) -> None:
        """A request failed (``kind``): back off; a timed-out one still says the link is slow."""
        with self.lock:
            if sample is not None:  # it timed out: the link is at most this fast
                self.link.observe_timeout(sample)
            self.last_contact = self.clock()
            self._retry_at = self.last_contact + self._wait_s
            self._wait_s = min(self._wait_s * 2, self.settings.backoff_max_s)
            self.outcomes[kind] = self.outcomes.get(kind, 0) + 1

    def decode(self, response: pb.InferResponse, names: Sequence[str]) -> dict[str, np.ndarray]:
        """The hub's outputs by name (its names when it gave them, else ``names``).

        Raises:
            TensorCodecError: The outputs do not decode or break a cap.
        """
        given = [proto.name for proto in response.outputs]
        if all(given) and len(set(given)) == len(given):
            names = given
        elif len(names) != len(given):
            raise TensorCodecError(f"{len(given)} outputs came back, {len(names)} expected")
        from skills.tensor_codec import decode_protos  # noqa: PLC0415 - numpy: a split skill runs

        return decode_protos(list(response.outputs), list(names), self.settings.limits)


class SplitCoordinator(Route):
    """Plans the cut of one split model and prices it from what it learns.

    Args:
        skill: The skill's name.
        version: Its version.
        spec: The model's ``[[split]]`` section.
        split_plan: Its ``split.json``.
        shared: The agent's link, lock, settings and clock.
    """

    def __init__(
        self, skill: str, version: str, spec: SplitSpec, split_plan: PlanLike, shared: Shared
    ) -> None:
        super().__init__(skill, version, spec.model, spec.deadline_ms, shared)
        self.spec = spec
        self.plan = split_plan
        count = len(split_plan.segments)
        self._hub = _per_segment(split_plan.hub_ms, count)
        self._device = _per_segment(split_plan.device_ms or split_plan.hub_ms, count)
        self.profiled = False
        self.hub_scale = 1.0
        #: Real device times over the profile's (the profile runs back to back, warm).
        self.device_scale = 1.0
        self.queue_ms = 0.0
        self.current: int | None = None
        self._cuts = sorted(split_plan.cuts, key=lambda c: c.after)
        self._last_remote: float | None = None
        #: Requests sent to a remote cut only to re-measure the link (see ``probe_interval_s``).
        self.probes = 0

    @property
    def output_names(self) -> Sequence[str]:
        """The model's outputs, in the plan's order."""
        return self.plan.output_names

    def set_profile(self, segment_ms: Sequence[float]) -> None:
        """Use the device's own per-segment times (ms) from now on.

        Raises:
            ValueError: Not one time per segment.
        """
        if len(segment_ms) != len(self._device):
            raise ValueError(f"{len(segment_ms)} times for {len(self._device)} segments")
        with self.lock:
            self._device = tuple(float(t) for t in segment_ms)
            self.profiled = True

    def table(self) -> CostTable:
        """The candidate cuts as priced now, hub-only first, device-only last."""
        cuts = [
            CutCost(
                name=cut.name,
                device_ms=sum(self._device[: cut.after + 1]) * self.device_scale,
                hub_ms=sum(self._hub[cut.after + 1 :]) * self.hub_scale,
                bytes_up=int(cut.nbytes * BYTES_PER_FP32[self.codec_of(cut)])
                + 8 * len(cut.tensors),
                bytes_down=self.plan.output_bytes,
                remote=True,
            )
            for cut in self._cuts
        ]
        cuts.append(CutCost(DEVICE, sum(self._device) * self.device_scale, 0.0, 0, 0, remote=False))
        return CostTable(self.model, tuple(cuts))

    def decide(self) -> str:
        """The cut for the next request (hysteresis against the last one), or ``device``.

        When the plan is device-only because of the link (not a back-off), a probe
        goes to the cheapest remote cut once per ``probe_interval_s``: with no
        request the link estimate would never learn that the link got better. The
        probe does not become the current cut.
        """
        with self.lock:
            now = self.clock()
            table = self.table()
            link = self.link.estimate().pessimistic(self.settings.pessimism)
            usable = self.hub_usable(now)
            decision = plan(
                table,
                link,
                self.queue_ms,
                current=self.current,
                hysteresis=self.settings.hysteresis,
                hub_reachable=usable,
            )
            self.current = decision.cut
            chosen = decision.cut
            if table.cuts[chosen].local and usable and len(table.cuts) > 1:
                last = max(self._last_remote or -math.inf, self.last_contact or -math.inf)
                if now - last >= self.settings.probe_interval_s:
                    remote = range(len(table.cuts) - 1)
                    chosen = min(remote, key=lambda i: decision.estimates[i].total_ms)
                    self.probes += 1
            if not table.cuts[chosen].local or self._last_remote is None:
                self._last_remote = now
            return table.cuts[chosen].name

    def codec_of(self, cut: CutLike) -> str:
        """The codec ``cut`` travels in: the manifest's, or under ``auto`` the plan's."""
        return self.spec.codec_at(cut.codec)

    def encode(self, split: str, tensors: Mapping[str, np.ndarray]) -> list[pb.TensorProto]:
        """Check the tensors against cut ``split`` and encode them in the cut's codec.

        Raises:
            SplitRefused: No such cut, other tensors than the cut's, or over a cap.
        """
        cut = next((c for c in self._cuts if c.name == split), None)
        if cut is None:
            raise SplitRefused(f"model {self.model!r} has no cut {split[:64]!r}")
        from skills.tensor_codec import encode_protos  # noqa: PLC0415 - numpy: a split skill runs

        try:
            codec = self.codec_of(cut)
            protos = encode_protos(tensors, list(cut.tensors), codec, self.settings.limits)
        except TensorCodecError as exc:
            raise SplitRefused(f"cut {split!r}: {exc}") from exc
        for proto, name in zip(protos, cut.tensors, strict=True):
            proto.name = name
        return protos

    def learn_hub(self, split: str, hub_ms: float, queue_ms: float) -> None:
        """Fold the hub's reported times for a tail from ``split`` into the table."""
        cut = next((c for c in self._cuts if c.name == split), None)
        weight = self.settings.smoothing
        with self.lock:
            if math.isfinite(queue_ms) and queue_ms >= 0:
                self.queue_ms += weight * (queue_ms - self.queue_ms)
            expected = sum(self._hub[cut.after + 1 :]) if cut is not None else 0.0
            if expected > 0 and math.isfinite(hub_ms) and hub_ms > 0:
                ratio = min(max(hub_ms / expected, 0.05), 100.0)
                self.hub_scale += weight * (ratio - self.hub_scale)

    def learn_device(self, split: str, device_ms: float) -> None:
        """Fold a real run's device time into the table.

        Args:
            split: The cut the call crossed at, or :data:`DEVICE` (or ``""``) when
                every segment ran on the device.
            device_ms: The time its device segments took.
        """
        cut = next((c for c in self._cuts if c.name == split), None)
        weight = self.settings.smoothing
        with self.lock:
            expected = sum(self._device[: cut.after + 1] if cut is not None else self._device)
            if expected > 0 and math.isfinite(device_ms) and device_ms > 0:
                ratio = min(max(device_ms / expected, 0.05), 100.0)
                self.device_scale += weight * (ratio - self.device_scale)

    def cut_index(self) -> int:
        """The index of the current cut in :meth:`table` (device-only until planned)."""
        return len(self._cuts) if self.current is None else self.current


class JointRoute(Route):
    """Whether a joint pair's hard inputs may go to the hub now.

    Args:
        skill: The skill's name.
        version: Its version.
        spec: The pair's ``[[joint]]`` section.
        shared: The agent's link, lock, settings and clock.
    """

    def __init__(self, skill: str, version: str, spec: JointSpec, shared: Shared) -> None:
        super().__init__(skill, version, spec.small, spec.deadline_ms, shared)
        self.big = spec.big

    @property
    def hub_model(self) -> str:
        """The pair's big model, which the hub runs."""
        return self.big

    def decide(self) -> str:
        """``joint`` while the hub may be asked, ``device`` during a back-off."""
        with self.lock:
            return JOINT if self.hub_usable(self.clock()) else DEVICE

    def encode(self, split: str, tensors: Mapping[str, np.ndarray]) -> list[pb.TensorProto]:
        """Encode the small model's input for the hub's big model.

        Raises:
            SplitRefused: ``split`` is not ``joint``, or the tensors break a cap.
        """
        if split != JOINT:
            raise SplitRefused(f"model {self.model!r} is a joint model; it has no cut {split!r}")
        names = sorted(tensors)
        from skills.tensor_codec import encode_protos  # noqa: PLC0415 - numpy: a joint skill runs

        try:
            protos = encode_protos(tensors, names, _JOINT_CODEC, self.settings.limits)
        except TensorCodecError as exc:
            raise SplitRefused(f"joint input: {exc}") from exc
        for proto, name in zip(protos, names, strict=True):
            proto.name = name
        return protos


def _per_segment(times: Sequence[float], count: int) -> tuple[float, ...]:
    """``times`` as one finite time per segment (zeros where missing or bad)."""
    values = [float(t) if math.isfinite(t) and t >= 0 else 0.0 for t in times][:count]
    return (*values, *([0.0] * (count - len(values))))
