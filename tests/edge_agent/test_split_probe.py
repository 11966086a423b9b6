"""The agent re-measures a link it stopped using, and believes what bounds the link.

Without traffic the link estimate cannot learn that a slow link got fast again,
so a coordinator planning device-only sends one probe per ``probe_interval_s``
to the cheapest remote cut; a request that missed its deadline bounds the
bandwidth at once instead of being dropped as an outlier; and a request faster
than the RTT estimate bounds the RTT (there are no pings to learn it from).
"""

from __future__ import annotations

import threading

import pytest

from edge_agent.split.link import LinkEstimator, RequestSample
from edge_agent.split.routes import Shared, SplitCoordinator, SplitSettings
from skills.manifest import SplitSpec
from tests.fakes.split_plans import three_segment_plan

PLAN = three_segment_plan(
    input_bytes=600_000,
    output_bytes=4_000,
    mid_bytes=120_000,
    late_bytes=5_000,
    hub_ms=5.0,
    device_ms=40.0,
)


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _route(clock: _Clock, interval_s: float = 1.0) -> SplitCoordinator:
    settings = SplitSettings(probe_interval_s=interval_s)
    shared = Shared(LinkEstimator(), threading.Lock(), settings, clock)
    spec = SplitSpec(model="net", plan="models/net/split.json", codec="fp32", deadline_ms=1000)
    return SplitCoordinator("s", "1.0.0", spec, PLAN, shared)


def _answer(
    route: SplitCoordinator, clock: _Clock, cut: str, bandwidth: float, rtt_ms: float
) -> None:
    """The hub answers a request from ``cut`` over a link of ``bandwidth`` bytes/s."""
    nbytes = next(c.nbytes for c in PLAN.cuts if c.name == cut)
    took = rtt_ms / 1000 + (nbytes + 4_000) / bandwidth
    clock.now += took
    route.succeeded(RequestSample(clock.now - took, clock.now, nbytes, 4_000))


def _slow_link(route: SplitCoordinator, clock: _Clock) -> None:
    """Ten requests on a 100 kB/s link: the device (120 ms) beats every remote cut."""
    for _ in range(10):
        _answer(route, clock, "late", 1e5, 50.0)
        clock.now += 0.1


def test_planning_device_only_probes_the_cheapest_remote_cut_once_per_interval() -> None:
    clock = _Clock()
    route = _route(clock)
    _slow_link(route, clock)
    assert route.decide() == "device"  # the last answer was just now: no probe yet
    clock.now += 1.0
    assert route.decide() == "late"  # the probe: cheapest of the remote cuts
    assert route.probes == 1
    assert route.cut_index() == 3  # the probe does not become the current cut
    for _ in range(5):
        clock.now += 0.1
        assert route.decide() == "device"  # one probe per interval
    clock.now += 0.6
    assert route.decide() == "late"
    assert route.probes == 2


def test_no_probe_while_backing_off_from_a_failed_hub() -> None:
    clock = _Clock()
    route = _route(clock, interval_s=0.5)
    _slow_link(route, clock)
    route.failed("link")  # 1 s of device-only
    clock.now += 0.9
    assert route.decide() == "device"
    assert route.probes == 0


def test_probes_find_the_link_that_got_fast_again() -> None:
    clock = _Clock()
    route = _route(clock)
    _slow_link(route, clock)
    assert route.decide() == "device"
    moved_after = None
    for step in range(100):  # 10 items a second for 10 s on a 100 MB/s link
        clock.now += 0.1
        cut = route.decide()
        if cut != "device":
            _answer(route, clock, cut, 1e8, 1.0)
        if moved_after is None and route.cut_index() != 3:
            moved_after = step / 10
    assert moved_after is not None, "the cut never left the device"
    assert moved_after < 6.0
    assert route.decide() == "input"  # 600 kB at 100 MB/s: 6 ms + the hub's 15 ms


def test_a_timed_out_request_bounds_the_bandwidth_at_once() -> None:
    estimator = LinkEstimator()
    for i in range(20):  # a fast link: 300 kB in 3 ms
        estimator.observe(RequestSample(i * 0.1, i * 0.1 + 0.003, 300_000, 4_000))
    fast = estimator.estimate().bandwidth_bps
    assert fast > 1e7
    rtt_s = estimator.estimate().rtt_ms / 1000
    # the next 300 kB request had no answer after its 1 s deadline: <= ~300 kB/s
    estimator.observe_timeout(RequestSample(2.0, 3.0, 300_000, 0))
    bound = 300_000 / (1.0 - rtt_s)
    assert estimator.estimate().bandwidth_bps == pytest.approx(bound, rel=0.01)
    # a bound above the estimate says nothing new; nor does a small request
    estimator.observe_timeout(RequestSample(3.0, 3.001, 300_000, 0))
    estimator.observe_timeout(RequestSample(3.0, 4.0, 1_000, 0))
    assert estimator.estimate().bandwidth_bps == pytest.approx(bound, rel=0.01)


def test_requests_faster_than_the_rtt_estimate_bring_it_down() -> None:
    estimator = LinkEstimator()  # the prior: 50 ms
    for i in range(10):  # 300 kB answered in 3 ms: the RTT is at most that
        estimator.observe(RequestSample(i * 0.1, i * 0.1 + 0.003, 300_000, 4_000))
    assert estimator.estimate().rtt_ms <= 3.0
    slow = LinkEstimator()
    for i in range(10):  # slower than the prior: says nothing about the RTT alone
        slow.observe(RequestSample(i * 0.5, i * 0.5 + 0.3, 300_000, 4_000))
    assert slow.estimate().rtt_ms == pytest.approx(50.0)
