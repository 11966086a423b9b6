"""The split planner: a model's cost table, the link and the hub's load in; a cut out.

A pure function with no I/O, no asyncio and no clock (like the reconcile rule in
:mod:`edge_agent.planner`), so it can be property-tested. A model offers an ordered
list of candidate cuts (:class:`CostTable`): index 0 is *hub-only* (the raw input
crosses), the last is *device-only* (nothing crosses; the result stays local).
Each cut carries the device's head time, the hub's tail time and the bytes that
cross each way. :func:`plan` prices every cut as Neurosurgeon does::

    device_ms + rtt_ms + bytes_up / bandwidth + hub_ms + queue_ms + bytes_down / bandwidth

(the device-only cut pays only ``device_ms``: it never talks to the hub) and
returns the cheapest, with **hysteresis**: a current cut is kept unless the best
one is cheaper by both a relative and an absolute margin (:class:`Hysteresis`),
so estimates that wobble with the traffic do not make the cut flap, while a real
change of link or load still moves it.

DAG-shaped models (skip connections) are priced from a cost graph by
:mod:`edge_agent.split.graph`, which also finds the exact optimum over every
valid partition with a min-cut.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

__all__ = [
    "DEFAULT_HYSTERESIS",
    "CostTable",
    "CutCost",
    "Decision",
    "Estimate",
    "Hysteresis",
    "LinkEstimate",
    "estimate",
    "plan",
    "slow_down",
]


def _check_finite(name: str, value: float, *, positive: bool = False) -> None:
    """Raise unless ``value`` is a finite number ``>= 0`` (``> 0`` when ``positive``)."""
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"{name} must be finite and {bound}, got {value!r}")


@dataclass(frozen=True)
class CutCost:
    """The link-independent costs of one candidate cut.

    Attributes:
        name: A label for the cut (the tensor it cuts at, ``hub-only``, ``device-only``).
        device_ms: The device's time for the head, from the input up to the cut.
        hub_ms: The hub's time for the tail, from the cut to the output.
        bytes_up: Bytes sent to the hub: the activation at the cut, after its codec.
        bytes_down: Bytes sent back: the result.
        remote: Whether the hub runs part of the model; None infers it from the costs
            (none means local). A partition with hub nodes of zero cost still pays the
            round trip, so a cost graph says so explicitly.

    Raises:
        ValueError: a time or size is negative or not finite.
    """

    name: str
    device_ms: float
    hub_ms: float
    bytes_up: int
    bytes_down: int
    remote: bool | None = None

    def __post_init__(self) -> None:
        _check_finite("device_ms", self.device_ms)
        _check_finite("hub_ms", self.hub_ms)
        _check_finite("bytes_up", self.bytes_up)
        _check_finite("bytes_down", self.bytes_down)

    @property
    def local(self) -> bool:
        """Whether the cut runs wholly on the device: no hub work and nothing crosses."""
        if self.remote is not None:
            return not self.remote
        return self.hub_ms == 0 and self.bytes_up == 0 and self.bytes_down == 0


@dataclass(frozen=True)
class CostTable:
    """A model's candidate cuts, from hub-only (index 0) to device-only (the last).

    Attributes:
        model: The model's name.
        cuts: The candidates in order; the last must be local (:attr:`CutCost.local`), so
            there is always a cut that works without the hub.

    Raises:
        ValueError: no cuts, or the last one is not local.
    """

    model: str
    cuts: tuple[CutCost, ...]

    def __post_init__(self) -> None:
        if not self.cuts:
            raise ValueError(f"{self.model}: a cost table needs at least one cut")
        if not self.cuts[-1].local:
            raise ValueError(f"{self.model}: the last cut must be device-only")

    def index(self, name: str) -> int:
        """The position of the cut called ``name``.

        Raises:
            KeyError: no cut has that name.
        """
        for position, cut in enumerate(self.cuts):
            if cut.name == name:
                return position
        raise KeyError(name)


@dataclass(frozen=True)
class LinkEstimate:
    """What the device knows of its link to the hub.

    Attributes:
        rtt_ms: The round-trip time of a small message.
        bandwidth_bps: Bytes per second device→hub.
        down_bandwidth_bps: Bytes per second hub→device; ``None`` means the same as up.
        rtt_dev_ms: A spread of the RTT (mean absolute deviation); 0 when unknown.
        bandwidth_rel_dev: A spread of the bandwidth, relative to it; 0 when unknown.

    Raises:
        ValueError: a value is negative or not finite, or a bandwidth is not positive.
    """

    rtt_ms: float
    bandwidth_bps: float
    down_bandwidth_bps: float | None = None
    rtt_dev_ms: float = 0.0
    bandwidth_rel_dev: float = 0.0

    def __post_init__(self) -> None:
        _check_finite("rtt_ms", self.rtt_ms)
        _check_finite("bandwidth_bps", self.bandwidth_bps, positive=True)
        if self.down_bandwidth_bps is not None:
            _check_finite("down_bandwidth_bps", self.down_bandwidth_bps, positive=True)
        _check_finite("rtt_dev_ms", self.rtt_dev_ms)
        _check_finite("bandwidth_rel_dev", self.bandwidth_rel_dev)

    @property
    def down_bps(self) -> float:
        """Bytes per second hub→device."""
        return self.bandwidth_bps if self.down_bandwidth_bps is None else self.down_bandwidth_bps

    def pessimistic(self, k: float) -> LinkEstimate:
        """The link ``k`` spreads worse: RTT up by ``k`` deviations, bandwidth down likewise.

        The bandwidth never drops below a tenth of the estimate, whatever ``k``.

        Raises:
            ValueError: ``k`` is negative or not finite.
        """
        _check_finite("k", k)
        shrink = max(0.1, 1.0 - k * self.bandwidth_rel_dev)
        down = None if self.down_bandwidth_bps is None else self.down_bandwidth_bps * shrink
        return replace(
            self,
            rtt_ms=self.rtt_ms + k * self.rtt_dev_ms,
            bandwidth_bps=self.bandwidth_bps * shrink,
            down_bandwidth_bps=down,
        )


@dataclass(frozen=True)
class Hysteresis:
    """How much better another cut must be before the planner leaves the current one.

    It switches only when the best cut saves **both** ``relative`` of the current
    cut's cost **and** ``absolute_ms``. The defaults (10 %, 1 ms): the link
    estimator's bandwidth wobbles by a few percent between seconds of steady
    traffic, and a cut change costs a warm-up of another head and tail, so smaller
    gains are noise or not worth it; a ms floor stops sub-ms flapping on fast links.
    A real change of link (×2 bandwidth, say) moves totals by far more than either.

    Attributes:
        relative: The fraction of the current cost to save, in ``[0, 1)``.
        absolute_ms: The ms to save.

    Raises:
        ValueError: a margin is out of range.
    """

    relative: float = 0.10
    absolute_ms: float = 1.0

    def __post_init__(self) -> None:
        if not 0 <= self.relative < 1:
            raise ValueError(f"relative must be in [0, 1), got {self.relative!r}")
        _check_finite("absolute_ms", self.absolute_ms)

    def worth_switching(self, current_ms: float, best_ms: float) -> bool:
        """Whether moving from a cut costing ``current_ms`` to one costing ``best_ms`` pays."""
        if not math.isfinite(current_ms):
            return math.isfinite(best_ms)
        gain = current_ms - best_ms
        return gain >= self.absolute_ms and gain >= self.relative * current_ms


#: The margins :func:`plan` uses unless told otherwise.
DEFAULT_HYSTERESIS = Hysteresis()


@dataclass(frozen=True)
class Estimate:
    """One cut's expected latency, by part (ms). Infinite when the hub is unreachable."""

    device_ms: float
    transfer_ms: float
    hub_ms: float
    queue_ms: float

    @property
    def total_ms(self) -> float:
        """The end-to-end latency."""
        return self.device_ms + self.transfer_ms + self.hub_ms + self.queue_ms


@dataclass(frozen=True)
class Decision:
    """The planner's answer.

    Attributes:
        cut: The index of the cut to run.
        best: The index of the cheapest cut (differs from ``cut`` when hysteresis held).
        expected_ms: The estimated latency of ``cut``.
        best_ms: The estimated latency of ``best``.
        switched: Whether ``cut`` differs from the current cut given.
        estimates: Every cut's estimate, in table order.
    """

    cut: int
    best: int
    expected_ms: float
    best_ms: float
    switched: bool
    estimates: tuple[Estimate, ...]


def estimate(
    cut: CutCost, link: LinkEstimate, queue_ms: float = 0.0, *, hub_reachable: bool = True
) -> Estimate:
    """One cut's expected latency on ``link`` with the hub ``queue_ms`` behind.

    Args:
        cut: The cut's costs.
        link: The link to the hub.
        queue_ms: The hub's queueing delay before a tail runs.
        hub_reachable: ``False`` prices every cut that needs the hub as infinite.

    Returns:
        The estimate; a local cut pays only its device time.

    Raises:
        ValueError: ``queue_ms`` is negative or not finite.
    """
    _check_finite("queue_ms", queue_ms)
    if cut.local:
        return Estimate(cut.device_ms, 0.0, 0.0, 0.0)
    if not hub_reachable:
        return Estimate(cut.device_ms, math.inf, cut.hub_ms, queue_ms)
    transfer = link.rtt_ms + 1000.0 * (
        cut.bytes_up / link.bandwidth_bps + cut.bytes_down / link.down_bps
    )
    return Estimate(cut.device_ms, transfer, cut.hub_ms, queue_ms)


def plan(
    table: CostTable,
    link: LinkEstimate,
    queue_ms: float = 0.0,
    *,
    current: int | None = None,
    hysteresis: Hysteresis = DEFAULT_HYSTERESIS,
    hub_reachable: bool = True,
) -> Decision:
    """The cut to run next for ``table`` on ``link``.

    Args:
        table: The model's candidate cuts.
        link: The link estimate (pass ``link.pessimistic(k)`` to plan for a worse link).
        queue_ms: The hub's reported queueing delay.
        current: The index of the cut running now, or ``None`` (then the cheapest wins).
        hysteresis: The margins that keep ``current`` against a slightly cheaper cut.
        hub_reachable: ``False`` when the hub is away: only the device-only cut is finite.

    Returns:
        The decision. Ties go to the later cut (more on the device, less on the hub).

    Raises:
        ValueError: ``current`` is not an index of the table, or ``queue_ms`` is invalid.
    """
    if current is not None and not 0 <= current < len(table.cuts):
        raise ValueError(f"current cut {current} is not in 0..{len(table.cuts) - 1}")
    estimates = tuple(
        estimate(cut, link, queue_ms, hub_reachable=hub_reachable) for cut in table.cuts
    )
    totals = [e.total_ms for e in estimates]
    best = min(range(len(totals)), key=lambda i: (totals[i], -i))
    chosen = best
    if current is not None and not hysteresis.worth_switching(totals[current], totals[best]):
        chosen = current
    return Decision(
        cut=chosen,
        best=best,
        expected_ms=totals[chosen],
        best_ms=totals[best],
        switched=current is not None and chosen != current,
        estimates=estimates,
    )


def slow_down(table: CostTable, factor: float) -> CostTable:
    """The table for a device ``factor`` times slower than the one it was measured on.

    Use it where the device cannot really be throttled (see
    :class:`edgeskill.linkemu.DeviceSlowdown`): every head time is multiplied.

    Raises:
        ValueError: ``factor`` is not positive and finite.
    """
    _check_finite("factor", factor, positive=True)
    cuts = tuple(replace(cut, device_ms=cut.device_ms * factor) for cut in table.cuts)
    return replace(table, cuts=cuts)
