"""The link's RTT and bandwidth, estimated from the agent's real requests.

Pure: no I/O and no clock; the agent passes each finished request's times (its
own monotonic clock, seconds) and sizes, and the hub's reported time for it.
A request's *network time* is its wall time minus the hub's time; it is
``rtt + bytes / bandwidth``. One request cannot split that sum, so each one
updates whichever term it says most about:

* a ping the agent times itself (:meth:`observe_rtt`), or a request of at most
  ``small_bytes`` (a packet or so), is an **RTT sample**;
* any larger request is a **bandwidth sample**: its bytes over its network time
  less the RTT estimate (at least ``min_transfer_share`` of the network time, so
  a request that took no longer than the RTT reads as a fast link, not an
  infinite one).

Each term is filtered twice. A **trimmed mean** of the last few samples
(``window``; a quarter dropped at each end) throws away lone outliers — a GC
pause, a retransmission — while a real change wins it after half a window. An
**EWMA with time-based decay** then follows that mean: a sample ``dt`` seconds
after the last moves the estimate by ``1 - exp(-dt / time_constant_s)`` of the
gap, so the estimate forgets at the same pace in wall time whatever the request
rate (the bandwidth is filtered in log space, so halving and doubling are
followed alike). With the defaults and requests every 50 ms, a ×10 bandwidth
change is followed to within ~10 % in under a second of traffic. Every estimate
stays inside a floor and a ceiling.

A link with a token-bucket shaper in its path (``tc``'s tbf, a cellular
scheduler, the project's link emulator) lets a burst through at once, so a
request that fits the bucket reads as a very fast link, and a cut that sends
much more would be priced far too cheaply. So the estimator also keeps the
**marginal rate**: the median slope of network time over bytes between the
largest recent requests and those at most ``1 / marginal_spread`` of their
size (Theil–Sen over those pairs), i.e. what one more byte costs at the top of
the sizes seen. A shaper's burst cancels out of that slope. When there is one
(``marginal_min_pairs`` pairs within ``marginal_horizon_s``), the estimate is
the lower of the two rates: the cautious side, and on a link without a burst
both read the same. An agent that sends one cut only has no spread, and the
per-request rate rules.

Without pings or small requests the RTT can only fall, when a request takes
less time than the RTT estimate (it bounds the RTT); otherwise a change of RTT
shows up as a change of bandwidth: the time of requests of the usual size is
still right, but a cut that sends much more or much less is mispriced, so feed
the agent's pings (heartbeats, acknowledgements) when it has them. Requests
whose transfer is short next to the RTT say little about the bandwidth: the
trimmed mean tames their noise, and the floor on their transfer share makes the
estimate lean low, the cautious side.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from edge_agent.split.planner import LinkEstimate

__all__ = ["LinkConfig", "LinkEstimator", "RequestSample"]

#: Requests within this share of a size count as that size for the marginal rate.
_SAME_SIZE = 0.8


@dataclass(frozen=True)
class LinkConfig:
    """How the estimator filters; conservative defaults.

    Attributes:
        time_constant_s: The EWMA's time constant: after this long of traffic at a new
            level, 63 % of the gap is closed (98 % after four).
        window: Samples in the outlier-rejecting trimmed mean; until that many have
            come, the estimate is their mean (the prior is only a guess).
        small_bytes: A request of at most this many bytes (both ways) is an RTT sample.
        min_transfer_share: The least share of a request's network time taken as its
            transfer when reading a bandwidth sample.
        min_bandwidth_bps: The bandwidth floor (bytes/s).
        max_bandwidth_bps: The bandwidth ceiling (bytes/s).
        min_rtt_ms: The RTT floor.
        max_rtt_ms: The RTT ceiling.
        prior: The estimate before any sample.
        marginal_window: Bandwidth samples the marginal rate is fitted over.
        marginal_spread: How much smaller the lower requests of the slope must be.
        marginal_min_pairs: The fewest such pairs for a marginal rate.
        marginal_horizon_s: Samples older than this (seconds) no longer count for it.

    Raises:
        ValueError: a value is out of range.
    """

    time_constant_s: float = 0.2
    window: int = 7
    small_bytes: int = 2048
    min_transfer_share: float = 0.05
    min_bandwidth_bps: float = 1e3
    max_bandwidth_bps: float = 1.25e10
    min_rtt_ms: float = 0.01
    max_rtt_ms: float = 10_000.0
    prior: LinkEstimate = field(default_factory=lambda: LinkEstimate(50.0, 1.25e6))
    marginal_window: int = 16
    marginal_spread: float = 2.0
    marginal_min_pairs: int = 3
    marginal_horizon_s: float = 2.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.time_constant_s) and self.time_constant_s > 0):
            raise ValueError("time_constant_s must be finite and > 0")
        if self.window < 1:
            raise ValueError("window must be >= 1")
        if self.small_bytes < 0:
            raise ValueError("small_bytes must be >= 0")
        if not 0 < self.min_transfer_share <= 1:
            raise ValueError("min_transfer_share must be in (0, 1]")
        if not 0 < self.min_bandwidth_bps <= self.max_bandwidth_bps:
            raise ValueError("need 0 < min_bandwidth_bps <= max_bandwidth_bps")
        if not 0 < self.min_rtt_ms <= self.max_rtt_ms:
            raise ValueError("need 0 < min_rtt_ms <= max_rtt_ms")
        if not 2 <= self.marginal_window <= 64:
            raise ValueError("marginal_window must be in [2, 64]")
        if not (math.isfinite(self.marginal_spread) and self.marginal_spread > 1):
            raise ValueError("marginal_spread must be finite and > 1")
        if self.marginal_min_pairs < 1:
            raise ValueError("marginal_min_pairs must be >= 1")
        if not (math.isfinite(self.marginal_horizon_s) and self.marginal_horizon_s > 0):
            raise ValueError("marginal_horizon_s must be finite and > 0")


@dataclass(frozen=True)
class RequestSample:
    """One finished request, as the agent saw it.

    Attributes:
        start: When the agent began sending (seconds, its monotonic clock).
        end: When the whole answer had arrived.
        bytes_up: Bytes sent.
        bytes_down: Bytes received.
        hub_ms: The hub's own time on it (queue + tail), as the hub reported.

    Raises:
        ValueError: ``end`` before ``start``, or a negative or non-finite value.
    """

    start: float
    end: float
    bytes_up: int
    bytes_down: int
    hub_ms: float = 0.0

    def __post_init__(self) -> None:
        values = (self.start, self.end, self.bytes_up, self.bytes_down, self.hub_ms)
        if not all(math.isfinite(v) for v in values):
            raise ValueError("request sample values must be finite")
        if self.end < self.start or min(self.bytes_up, self.bytes_down, self.hub_ms) < 0:
            raise ValueError("request sample: end before start or a negative value")

    @property
    def network_ms(self) -> float:
        """The request's wall time less the hub's: what the link took."""
        return (self.end - self.start) * 1000.0 - self.hub_ms


class _Tracker:
    """A trimmed mean of the last samples, followed by a time-decayed EWMA, with a deviation."""

    def __init__(self, initial: float, window: int, time_constant_s: float) -> None:
        self.value = initial
        self.deviation = 0.0
        self._recent: deque[float] = deque(maxlen=window)
        self._window = window
        self._tau = time_constant_s
        self._last: float | None = None

    def update(self, now: float, sample: float) -> None:
        self._recent.append(sample)
        ordered = sorted(self._recent)
        trim = len(ordered) // 4
        kept = ordered[trim : len(ordered) - trim]
        middle = math.fsum(kept) / len(kept)  # not statistics: it loads decimal (0.4 MB)
        if self._last is None or len(self._recent) < self._window:
            # Warming up: the prior is a guess, so the first window of samples rules.
            self.value, self._last = middle, max(now, self._last or now)
            return
        weight = 1.0 - math.exp(-max(0.0, now - self._last) / self._tau)
        self._last = max(self._last, now)
        self.deviation += weight * (abs(sample - self.value) - self.deviation)
        self.value += weight * (middle - self.value)


class LinkEstimator:
    """Follows the link's RTT and bandwidth from the agent's requests and pings.

    Args:
        config: Filter settings and bounds.
    """

    def __init__(self, config: LinkConfig | None = None) -> None:
        self._config = config or LinkConfig()
        prior = self._config.prior
        self._rtt = _Tracker(prior.rtt_ms, self._config.window, self._config.time_constant_s)
        self._log_bandwidth = _Tracker(
            math.log(prior.bandwidth_bps), self._config.window, self._config.time_constant_s
        )
        self.rtt_samples = 0
        self.bandwidth_samples = 0
        #: Recent bandwidth samples as (when, bytes, network ms), for the marginal rate.
        self._sized: deque[tuple[float, int, float]] = deque(maxlen=self._config.marginal_window)
        self._marginal: float | None = None

    @property
    def config(self) -> LinkConfig:
        """The filter settings."""
        return self._config

    def observe(self, sample: RequestSample) -> None:
        """Learn from one finished request (at ``sample.end``)."""
        current = self.estimate()
        size = sample.bytes_up + sample.bytes_down
        network = max(sample.network_ms, self._config.min_rtt_ms)
        if size <= self._config.small_bytes:
            self._add_rtt(sample.end, network - 1000.0 * size / current.bandwidth_bps)
            return
        if network < current.rtt_ms:
            # Faster than the RTT estimate: that estimate (the prior, say) is too high, and
            # this request's time bounds the RTT. Without pings nothing else would lower it.
            self._add_rtt(sample.end, network)
        transfer = max(network - current.rtt_ms, self._config.min_transfer_share * network)
        self._add_bandwidth(sample.end, size / (transfer / 1000.0))
        self._sized.append((sample.end, size, network))
        self._marginal = self._marginal_rate(sample.end)

    @property
    def marginal_bps(self) -> float | None:
        """The marginal rate (bytes/s) from the recent samples' sizes, if they allow one."""
        return self._marginal

    def _marginal_rate(self, now: float) -> float | None:
        """The median ms per byte between the largest recent requests and the next size down.

        A shaper's cost curve is flat up to its burst and straight after it, so
        the slope that prices the cuts larger than the burst is the one at the
        top of the sizes seen: between the requests within a fifth of the largest
        and the largest ones at most ``1 / marginal_spread`` of it (Theil–Sen over
        those pairs: a lone outlier does not move the median).
        """
        cfg = self._config
        recent = [(b, ms) for t, b, ms in self._sized if now - t <= cfg.marginal_horizon_s]
        if not recent:
            return None
        top = max(b for b, _ in recent)
        below = [(b, ms) for b, ms in recent if b * cfg.marginal_spread <= top]
        if not below:
            return None
        floor = max(b for b, _ in below)
        upper = [(b, ms) for b, ms in recent if b >= _SAME_SIZE * top]
        lower = [(b, ms) for b, ms in below if b >= _SAME_SIZE * floor]
        slopes = sorted((m2 - m1) / (b2 - b1) for b2, m2 in upper for b1, m1 in lower)
        if len(slopes) < cfg.marginal_min_pairs:
            return None
        middle = len(slopes) // 2
        slope = slopes[middle] if len(slopes) % 2 else (slopes[middle - 1] + slopes[middle]) / 2
        if slope <= 0:
            return None  # no measurable cost per byte: the per-request rate rules
        return min(max(1000.0 / slope, cfg.min_bandwidth_bps), cfg.max_bandwidth_bps)

    def observe_timeout(self, sample: RequestSample) -> None:
        """Learn from a request that had not finished by ``sample.end`` (its deadline).

        Its reading is an upper bound: the link is at most this fast. A bound
        above the estimate says nothing new and is ignored. A bound below it
        means the estimate is wrong now (the link got slower than every sample
        in the window), so the bandwidth filter starts again from the bound
        rather than treating it as a lone outlier the trimmed mean would drop:
        otherwise an agent would have to time out half a window of requests,
        each after a growing back-off, before it stopped sending the cut that
        no longer fits the link.
        """
        current = self.estimate()
        size = sample.bytes_up + sample.bytes_down
        network = max(sample.network_ms, self._config.min_rtt_ms)
        if size <= self._config.small_bytes:
            return  # a small request says nothing about the bandwidth
        transfer = max(network - current.rtt_ms, self._config.min_transfer_share * network)
        bound = size / (transfer / 1000.0)
        if bound >= current.bandwidth_bps:
            return
        self._sized.clear()  # from a faster link than this one
        self._marginal = None
        cfg = self._config
        self._log_bandwidth = _Tracker(
            math.log(min(max(bound, cfg.min_bandwidth_bps), cfg.max_bandwidth_bps)),
            cfg.window,
            cfg.time_constant_s,
        )
        self._log_bandwidth.update(sample.end, self._log_bandwidth.value)
        self.bandwidth_samples += 1

    def observe_rtt(self, now: float, rtt_ms: float) -> None:
        """Learn from a round trip of a message too small to take transfer time (a ping).

        Raises:
            ValueError: ``rtt_ms`` or ``now`` is negative or not finite.
        """
        if not (math.isfinite(now) and math.isfinite(rtt_ms) and rtt_ms >= 0):
            raise ValueError(f"bad RTT sample {rtt_ms!r} at {now!r}")
        self._add_rtt(now, rtt_ms)

    def estimate(self) -> LinkEstimate:
        """The current estimate, inside the configured floor and ceiling."""
        cfg = self._config
        rtt = min(max(self._rtt.value, cfg.min_rtt_ms), cfg.max_rtt_ms)
        bandwidth = min(
            max(math.exp(self._log_bandwidth.value), cfg.min_bandwidth_bps),
            cfg.max_bandwidth_bps,
        )
        if self._marginal is not None:
            bandwidth = min(bandwidth, self._marginal)
        return LinkEstimate(
            rtt_ms=rtt,
            bandwidth_bps=bandwidth,
            rtt_dev_ms=self._rtt.deviation,
            bandwidth_rel_dev=math.expm1(self._log_bandwidth.deviation),
        )

    def _add_rtt(self, now: float, rtt_ms: float) -> None:
        cfg = self._config
        self._rtt.update(now, min(max(rtt_ms, cfg.min_rtt_ms), cfg.max_rtt_ms))
        self.rtt_samples += 1

    def _add_bandwidth(self, now: float, bandwidth_bps: float) -> None:
        cfg = self._config
        clamped = min(max(bandwidth_bps, cfg.min_bandwidth_bps), cfg.max_bandwidth_bps)
        self._log_bandwidth.update(now, math.log(clamped))
        self.bandwidth_samples += 1
