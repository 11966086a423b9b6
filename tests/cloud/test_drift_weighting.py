"""The hub weighs each device's drift evidence by its window's samples and ignores tiny windows.

Property tests: windows under the policy's ``min_samples`` change no decision
(so a tiny window never opens an incident, however wild its PSI), the fleet
share and PSI are the sample-weighted ones recomputed from the device states,
and scaling every window's samples scales nothing the policy decides.
Example tests pin what the weighting changes against one vote per device.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloud.drift import (
    Decision,
    DriftAggregate,
    DriftKey,
    DriftPolicy,
    DriftWindow,
    OpenIncident,
    evaluate,
    open_incident,
)

T0 = 1_704_067_200_000
MIN = 60_000
KEY = DriftKey("digits", "1.0.0", "cameras")
POLICY = DriftPolicy()  # 100 samples, 3 devices, 20 %
#: Policies a tiny window must not move, down to one device and a 1 % share.
POLICIES = (
    POLICY,
    DriftPolicy(min_devices=2, window_s=300, hold_s=240, cooldown_s=0, min_samples=30),
    DriftPolicy(min_devices=1, min_share=0.01, hold_s=120, cooldown_s=0, min_samples=20),
)


def window(
    device: str,
    end_ms: int,
    n: int,
    psi: float = 0.05,
    *,
    alarms: int = 0,
    labelled: int = 0,
    accuracy: float | None = None,
) -> DriftWindow:
    """A window of KEY; ``psi`` is the class-mix PSI."""
    return DriftWindow(
        device, KEY.skill, KEY.version, KEY.group, end_ms, n, psi, None, alarms, labelled, accuracy
    )


def agg(windows: list[DriftWindow]) -> DriftAggregate:
    return DriftAggregate(KEY, 0.9).add(windows)


@st.composite
def windows_st(
    draw: st.DrawFn, *, n: st.SearchStrategy[int], devices: int = 6
) -> list[DriftWindow]:
    """Windows of ``cam-0..`` over 20 minutes with drawn sizes, PSIs, alarms and labels."""
    out = []
    for _ in range(draw(st.integers(0, 30))):
        size = draw(n)
        labelled = draw(st.integers(0, size))
        out.append(
            window(
                f"cam-{draw(st.integers(0, devices - 1))}",
                T0 + draw(st.integers(0, 40)) * MIN // 2,
                size,
                psi=draw(st.sampled_from([0.0, 0.1, 0.3, 0.9, 40.0])),
                alarms=draw(st.sampled_from([0, 0, 3])),
                labelled=labelled,
                accuracy=draw(st.sampled_from([0.0, 0.5, 0.95])) if labelled else None,
            )
        )
    return out


def without_reporting(decisions: list[Decision]) -> list[Decision]:
    """The decisions with ``reporting`` blanked: a tiny window's device still reports."""
    return [replace(d, numbers=replace(d.numbers, reporting=0)) for d in decisions]


@settings(max_examples=200, deadline=None)
@given(
    big=windows_st(n=st.sampled_from([100, 150, 400, 2000])),
    tiny=windows_st(n=st.integers(0, 19), devices=9),
    at=st.integers(0, 25 * MIN),
)
def test_windows_under_min_samples_change_no_decision(
    big: list[DriftWindow], tiny: list[DriftWindow], at: int
) -> None:
    now = T0 + at
    old = open_incident(1, KEY, "drift", T0 - 10 * MIN)  # an untouched incident the hold may close
    for policy in POLICIES:
        for incidents in ([], [old]):
            alone = evaluate(policy, [agg(big)], incidents, now)
            mixed = evaluate(policy, [agg(big + tiny)], incidents, now)
            assert without_reporting(mixed) == without_reporting(alone)
            assert evaluate(policy, [agg(tiny)], incidents, now) == []  # never opens, never closes


@settings(max_examples=200, deadline=None)
@given(
    windows=windows_st(n=st.sampled_from([0, 5, 50, 100, 1000, 5000])), at=st.integers(0, 25 * MIN)
)
def test_the_fleet_weighs_each_device_by_its_samples(windows: list[DriftWindow], at: int) -> None:
    a = agg(windows)
    for policy in POLICIES:
        states = a.devices(policy, T0 + at).values()
        counted = [s.window for s in states if s.counts]
        hot = [s.window for s in states if s.drifting]
        f = a.fleet(policy, T0 + at)
        assert all(w.n >= policy.min_samples for w in counted)
        assert (f.samples, f.drifting_samples) == (sum(w.n for w in counted), sum(w.n for w in hot))
        assert f.share == (f.drifting_samples / f.samples if f.samples else 0.0)
        psis = [(w.n, w.psi) for w in counted if w.psi is not None]
        if psis:
            mean = sum(n * p for n, p in psis) / sum(n for n, _ in psis)
            assert f.mean_psi == pytest.approx(mean)
            assert min(p for _, p in psis) - 1e-9 <= (f.mean_psi or 0) <= max(p for _, p in psis)


@settings(max_examples=150, deadline=None)
@given(
    windows=windows_st(n=st.sampled_from([20, 40, 100, 300])),
    k=st.integers(2, 9),
    at=st.integers(0, 25 * MIN),
)
def test_scaling_every_window_decides_the_same(windows: list[DriftWindow], k: int, at: int) -> None:
    """Only the ratio of the devices' samples matters, not how many there were."""
    scaled = [replace(w, n=w.n * k, labelled=w.labelled * k) for w in windows]
    for policy in POLICIES:
        bigger = replace(
            policy, min_samples=policy.min_samples * k, min_labelled=policy.min_labelled * k
        )
        f, g = agg(windows).fleet(policy, T0 + at), agg(scaled).fleet(bigger, T0 + at)
        assert (g.counted, g.drifting, g.samples) == (f.counted, f.drifting, f.samples * k)
        assert g.share == pytest.approx(f.share)
        ours = evaluate(policy, [agg(windows)], [], T0 + at)
        theirs = evaluate(bigger, [agg(scaled)], [], T0 + at)
        assert [type(d) for d in theirs] == [type(d) for d in ours]


# --- examples ------------------------------------------------------------------------------


def fleet(drifting: tuple[int, int], calm: tuple[int, int]) -> DriftAggregate:
    """``(devices, samples each)`` drifting (PSI 0.6) and calm, every window ending at T0."""
    hot = [window(f"hot-{i}", T0, drifting[1], psi=0.6) for i in range(drifting[0])]
    return agg(hot + [window(f"calm-{i}", T0, calm[1]) for i in range(calm[0])])


def test_devices_that_saw_little_weigh_little() -> None:
    # 3 of 10 devices drift (30 % of devices), but they saw 300 of 14,300 inputs (2 %)
    a = fleet(drifting=(3, 100), calm=(7, 2000))
    assert a.fleet(POLICY, T0).share == pytest.approx(300 / 14_300)
    assert evaluate(POLICY, [a], [], T0) == []
    # 3 of 20 devices (15 %), but they saw 30,000 of 31,700 inputs
    b = fleet(drifting=(3, 10_000), calm=(17, 100))
    [opened] = evaluate(POLICY, [b], [], T0)
    assert isinstance(opened, OpenIncident)
    assert "3 of 20 devices drifting (95% of samples >= 20%)" in opened.reason
    assert (opened.numbers.samples, opened.numbers.drifting_samples) == (31_700, 30_000)


def test_one_huge_device_is_still_one_device() -> None:
    a = fleet(drifting=(1, 1_000_000), calm=(2, 100))
    assert math.isclose(a.fleet(POLICY, T0).share, 1e6 / (1e6 + 200))
    assert evaluate(POLICY, [a], [], T0) == []  # min_devices counts devices, not samples


def test_the_fleet_psi_is_weighted_by_samples() -> None:
    a = agg([window("a", T0, 900, psi=0.1), window("b", T0, 100, psi=1.1)])
    assert a.fleet(POLICY, T0).mean_psi == pytest.approx(0.2)  # not the 0.6 of one vote each


def test_a_five_sample_window_opens_nothing_and_hides_nothing() -> None:
    one_device = DriftPolicy(min_devices=1, min_share=0.01)
    noisy = agg([window("cam-0", T0, 5, psi=50.0, alarms=1)])
    assert evaluate(one_device, [noisy], [], T0) == []
    # a newer tiny calm window does not hide the device's drifting window of 500 samples
    drifting = [window(f"cam-{i}", T0, 500, psi=0.6) for i in range(3)]
    calm_blips = [window(f"cam-{i}", T0 + MIN, 5, psi=0.0) for i in range(3)]
    a = agg(drifting + calm_blips)
    assert all(s.window.n == 500 and s.drifting for s in a.devices(POLICY, T0 + MIN).values())
    assert len(evaluate(POLICY, [a], [], T0 + MIN)) == 1
