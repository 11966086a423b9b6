"""The drift policy is pure: windows, aggregates, open/close decisions and incident stages.

Property tests check that the aggregate does not depend on how windows
arrive, that its timeline matches the fleet numbers recomputed from scratch,
and that one noisy device never opens an incident; example tests pin the
debounce, the hold, and the incident's stages and links.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloud.drift import (
    CloseIncident,
    DriftAggregate,
    DriftKey,
    DriftPolicy,
    DriftWindow,
    IllegalTransitionError,
    IncidentState,
    OpenIncident,
    Stage,
    clear,
    evaluate,
    fail,
    mark_built,
    open_incident,
    promote,
    roll_back,
    start_canary,
    start_retraining,
)
from cloud.errors import ValidationError

T0 = 1_704_067_200_000  # 2024-01-01 00:00 UTC
KEY = DriftKey("face-detect", "1.0.0", "cameras")
MIN = 60_000
POLICY = DriftPolicy()  # psi 0.25, 3 devices, 20 %, 100 samples, 10 min span, 15 min hold


def window(
    device: str,
    end_ms: int,
    *,
    n: int = 500,
    psi: float = 0.05,
    psi_confidence: float | None = None,
    alarms: int = 0,
    labelled: int = 0,
    accuracy: float | None = None,
) -> DriftWindow:
    """A window of KEY; ``psi`` is the class-mix PSI."""
    return DriftWindow(
        device, *(KEY.skill, KEY.version, KEY.group), end_ms, n, psi, psi_confidence, alarms,
        labelled, accuracy,
    )  # fmt: skip


def fleet_windows(end_ms: int, drifting: int, calm: int, n: int = 500) -> list[DriftWindow]:
    """``drifting`` devices over the PSI threshold and ``calm`` ones under it, at ``end_ms``."""
    hot = [window(f"hot-{i}", end_ms, n=n, psi=0.6) for i in range(drifting)]
    return hot + [window(f"calm-{i}", end_ms, n=n) for i in range(calm)]


def every_minute(start: int, stop: int, drifting: int, size: int = 10) -> list[DriftWindow]:
    """Devices ``cam-i`` report each minute in ``[start, stop)``; the first ``drifting`` drift."""
    return [
        window(f"cam-{i}", T0 + m * MIN, psi=0.6 if i < drifting else 0.05)
        for m in range(start, stop)
        for i in range(size)
    ]


def agg(windows: list[DriftWindow], reference: float | None = 0.9) -> DriftAggregate:
    return DriftAggregate(KEY, reference).add(windows)


# --- windows -------------------------------------------------------------------------------


def test_window_reads_the_metrics_map() -> None:
    metrics = {
        "drift.n": 1000.0,
        "drift.psi_class": 0.31,
        "drift.psi_confidence": 0.12,
        "drift.alarms": 1.0,
        "drift.labelled": 40.0,
        "drift.accuracy": 0.85,
        "latency.p95": 12.0,  # not drift: ignored
    }
    w = DriftWindow.from_metrics("cam-1", "face-detect", "1.0.0", "cameras", T0, metrics)
    assert w == DriftWindow(
        "cam-1", "face-detect", "1.0.0", "cameras", T0, 1000, 0.31, 0.12, 1, 40, 0.85
    )
    assert w.key == KEY
    assert w.psi == 0.31
    assert isinstance(w.n, int)


def test_window_without_samples_is_no_drift_report() -> None:
    metrics = {"drift.psi_class": 0.9, "latency.p95": 12.0}
    assert DriftWindow.from_metrics("cam-1", "s", "1", "g", T0, metrics) is None


def test_window_measures_are_optional() -> None:
    w = DriftWindow.from_metrics("cam-1", "s", "1", "g", T0, {"drift.n": 5.0})
    assert w is not None
    assert (w.psi, w.alarms, w.labelled, w.accuracy) == (None, 0, 0, None)


@pytest.mark.parametrize(
    "metrics",
    [
        {"drift.n": -1.0},
        {"drift.n": 10.5},
        {"drift.n": math.inf},
        {"drift.n": math.nan},
        {"drift.n": 2.0**60},
        {"drift.n": True},
        {"drift.n": "100"},
        {"drift.n": 100.0, "drift.psi_class": math.nan},
        {"drift.n": 100.0, "drift.psi_confidence": math.inf},
        {"drift.n": 100.0, "drift.psi_class": -0.1},
        {"drift.n": 100.0, "drift.alarms": -1.0},
        {"drift.n": 100.0, "drift.labelled": 101.0, "drift.accuracy": 0.5},
        {"drift.n": 100.0, "drift.labelled": 10.0, "drift.accuracy": 1.5},
        {"drift.n": 100.0, "drift.labelled": 10.0, "drift.accuracy": -0.1},
        {"drift.n": 100.0, "drift.accuracy": 0.5},  # an accuracy of no labels
        {"drift.n": 100.0, "drift.labelled": 10.0},  # labels without their accuracy
    ],
)
def test_window_refuses_values_no_device_measured(metrics: dict[str, float]) -> None:
    with pytest.raises(ValidationError):
        DriftWindow.from_metrics("cam-1", "s", "1", "g", T0, metrics)


@pytest.mark.parametrize(
    "fields", [{"device_id": ""}, {"skill": ""}, {"group": ""}, {"end_ms": -1}, {"end_ms": 1.5}]
)
def test_window_refuses_bad_names_and_times(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        replace(window("cam-1", T0), **fields)


def test_aggregate_refuses_a_window_of_another_version() -> None:
    other = replace(window("cam-1", T0), version="2.0.0")
    with pytest.raises(ValidationError, match="got a window of"):
        agg([window("cam-2", T0), other])
    with pytest.raises(ValidationError):
        DriftAggregate(KEY, reference_accuracy=1.2)


# --- policy settings -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [
        {"psi_threshold": 0.0},
        {"psi_threshold": math.nan},
        {"accuracy_drop": -0.01},
        {"accuracy_drop": 1.5},
        {"min_devices": 0},
        {"min_devices": 2.5},
        {"min_devices": True},
        {"min_share": 0.0},
        {"min_share": 1.01},
        {"min_samples": 0},
        {"min_labelled": 0},
        {"cooldown_s": -1.0},
        {"cooldown_s": math.inf},
        {"window_s": 0.0},
        {"window_s": 0.0001},
        {"hold_s": -5.0},
        {"release_ratio": 0.0},
        {"release_ratio": 1.5},
        {"psi_threshold": "0.25"},
    ],
)
def test_policy_refuses_settings_out_of_range(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        DriftPolicy(**fields)  # type: ignore[arg-type]


def test_policy_defaults() -> None:
    p = DriftPolicy()
    assert (p.psi_threshold, p.accuracy_drop, p.min_devices, p.min_share) == (0.25, 0.05, 3, 0.2)
    assert (p.cooldown_s, p.window_ms, p.retention_ms) == (3600.0, 600_000, 1_500_000)


# --- the aggregate -------------------------------------------------------------------------


def test_device_state_is_its_newest_window_in_the_span() -> None:
    a = agg([window("cam-1", T0, psi=0.6), window("cam-1", T0 + MIN, psi=0.1)])
    assert not a.devices(POLICY, T0 + MIN)["cam-1"].drifting
    assert a.devices(POLICY, T0 + MIN - 1)["cam-1"].drifting  # the newer one is not in yet
    assert "cam-1" in a.devices(POLICY, T0 + MIN + POLICY.window_ms - 1)
    assert a.devices(POLICY, T0 + MIN + POLICY.window_ms) == {}  # aged out


def test_why_a_device_drifts() -> None:
    a = agg(
        [
            window("psi", T0, psi=0.26),
            window("conf", T0, psi=0.0, psi_confidence=0.4),
            window("alarm", T0, alarms=1),
            window("acc", T0, labelled=50, accuracy=0.8),  # 0.9 - 0.05 = 0.85 > 0.8
            window("few-labels", T0, labelled=5, accuracy=0.2),  # under min_labelled
            window("fine", T0, psi=0.25, labelled=50, accuracy=0.87),
            window("small", T0, n=99, psi=0.9),
        ]
    )
    causes = {d: s.causes for d, s in a.devices(POLICY, T0).items()}
    assert causes == {
        "psi": {"psi"},
        "conf": {"psi"},
        "alarm": {"alarm"},
        "acc": {"accuracy"},
        "few-labels": set(),
        "fine": set(),
        "small": {"psi"},
    }
    assert not a.devices(POLICY, T0)["small"].drifting  # it does not count
    no_ref = DriftAggregate(KEY).add(a.windows)
    assert not no_ref.devices(POLICY, T0)["acc"].causes


def test_fleet_numbers() -> None:
    a = agg(
        [
            window("a", T0, psi=0.6, labelled=100, accuracy=0.5),
            window("b", T0, psi=0.2, labelled=300, accuracy=0.9),
            window("c", T0, psi=0.1),
            window("tiny", T0, n=10, psi=5.0, labelled=10, accuracy=0.0),  # does not count
        ]
    )
    f = a.fleet(POLICY, T0)
    assert (f.reporting, f.counted, f.drifting) == (4, 3, 1)  # only a drifts (psi and accuracy)
    assert f.share == pytest.approx(1 / 3)
    assert f.mean_psi == pytest.approx(0.3)
    assert f.accuracy == pytest.approx((50 + 270) / 400)  # pooled, not the mean of 0.5 and 0.9
    assert f.labelled == 400


def test_a_tie_on_the_end_time_goes_to_the_worse_news() -> None:
    # eight devices each sent a calm and a drifting window ending at the same moment
    pairs = [window(f"cam-{i}", T0, psi=p) for i in range(8) for p in (0.05, 0.6)]
    for arrived in (pairs, pairs[::-1]):
        a = agg(arrived)
        assert all(s.drifting for s in a.devices(POLICY, T0).values())
        assert list(a.timeline(POLICY, T0, T0 + MIN)) == [(T0, 8, 8, 8 * 500, 8 * 500)]
    alarm = [window("cam-0", T0, psi=0.9), window("cam-0", T0, psi=0.0, alarms=1)]
    assert agg(alarm).devices(POLICY, T0)["cam-0"].window.alarms == 1


def test_windows_from_the_future_are_not_seen_yet() -> None:
    a = agg(fleet_windows(T0 + MIN, drifting=5, calm=0))
    assert a.fleet(POLICY, T0).reporting == 0
    assert evaluate(POLICY, [a], [], T0) == []


VALUES = st.fixed_dictionaries(
    {
        "n": st.sampled_from([0, 50, 100, 1000]),
        "psi": st.sampled_from([0.0, 0.1, 0.3, 0.9]),
        "alarms": st.sampled_from([0, 0, 1]),
        "acc": st.sampled_from([None, (10, 0.1), (40, 0.95), (40, 0.5)]),
    }
)


@st.composite
def windows_st(draw: st.DrawFn, devices: int = 6) -> list[DriftWindow]:
    rows = draw(
        st.lists(st.tuples(st.integers(0, devices - 1), st.integers(0, 40), VALUES), max_size=40)
    )
    out = []
    for device, minute, v in rows:
        labelled, accuracy = v["acc"] or (0, None)
        out.append(
            window(
                f"cam-{device}",
                T0 + minute * MIN // 2,
                n=max(v["n"], labelled),
                psi=v["psi"],
                alarms=v["alarms"],
                labelled=labelled,
                accuracy=accuracy,
            )
        )
    return out


SMALL = DriftPolicy(min_devices=2, window_s=300, hold_s=240, cooldown_s=600)


@settings(max_examples=150, deadline=None)
@given(windows=windows_st(), seed=st.integers(0, 2**32), at=st.integers(0, 25 * MIN))
def test_reordered_or_repeated_windows_give_the_same_aggregate(
    windows: list[DriftWindow], seed: int, at: int
) -> None:
    rng = random.Random(seed)
    arrived = windows + rng.sample(windows, len(windows) // 2)  # some twice
    rng.shuffle(arrived)
    cut = rng.randint(0, len(arrived))
    piecewise = DriftAggregate(KEY, 0.9).add(arrived[:cut]).add(arrived[cut:])
    whole = agg(windows)
    assert piecewise == whole
    now = T0 + at
    assert piecewise.devices(SMALL, now) == whole.devices(SMALL, now)
    assert piecewise.fleet(SMALL, now) == whole.fleet(SMALL, now)
    # the same windows, added in reverse, decide the same
    backwards = DriftAggregate(KEY, 0.9).add(reversed(arrived))
    assert evaluate(SMALL, [backwards], [], now) == evaluate(SMALL, [whole], [], now)


@settings(max_examples=150, deadline=None)
@given(windows=windows_st(), start=st.integers(0, 25 * MIN), hold=st.integers(0, 10 * MIN))
def test_timeline_matches_the_fleet_recomputed_at_every_moment(
    windows: list[DriftWindow], start: int, hold: int
) -> None:
    a = agg(windows)
    begin, end = T0 + start, T0 + start + hold
    steps = list(a.timeline(SMALL, begin, end))
    times = [s.at_ms for s in steps]
    assert times[0] == begin
    assert times == sorted(set(times))
    assert all(begin <= t <= end for t in times)
    probes = {begin, end, *times}
    probes |= {t + d for t in times for d in (-1, 1) if begin <= t + d <= end}
    for t in sorted(probes):
        step = max(s for s in steps if s.at_ms <= t)
        f = a.fleet(SMALL, t)
        assert step[1:] == (f.counted, f.drifting, f.samples, f.drifting_samples), t
        assert step.share == f.share, t


def test_pruning_keeps_what_the_policy_still_needs() -> None:
    old, recent = window("cam-1", T0), window("cam-1", T0 + 30 * MIN)
    a = agg([old, recent]).prune(T0 + 30 * MIN - POLICY.retention_ms + 1)
    assert a.windows == {recent}


# --- opening: debounce ---------------------------------------------------------------------


def test_enough_drifting_devices_open_an_incident() -> None:
    now = T0 + MIN
    [decision] = evaluate(POLICY, [agg(fleet_windows(T0, drifting=3, calm=7))], [], now)
    assert isinstance(decision, OpenIncident)
    assert (decision.skill, decision.version, decision.group) == (KEY.skill, "1.0.0", "cameras")
    assert decision.devices == ("hot-0", "hot-1", "hot-2")
    assert (decision.numbers.drifting, decision.numbers.counted) == (3, 10)
    assert "3 of 10" in decision.reason
    assert "psi on 3" in decision.reason


@pytest.mark.parametrize(
    ("drifting", "calm", "opens"),
    [
        (3, 7, True),  # 3 devices, 30 %
        (2, 2, False),  # 50 %, but only 2 devices
        (3, 17, False),  # 3 devices, but only 15 %
        (4, 16, True),  # 4 devices, 20 %: both met exactly
    ],
)
def test_min_devices_and_min_share_are_both_required(drifting: int, calm: int, opens: bool) -> None:
    decisions = evaluate(POLICY, [agg(fleet_windows(T0, drifting, calm))], [], T0)
    assert bool(decisions) == opens


def test_devices_below_min_samples_do_not_count() -> None:
    small = fleet_windows(T0, drifting=5, calm=0, n=99)
    assert evaluate(POLICY, [agg(small)], [], T0) == []
    # nor do they dilute the share: 3 of 10 counted devices drift, with 90 small calm ones
    diluted = fleet_windows(T0, drifting=3, calm=7)
    diluted += [window(f"small-{i}", T0, n=10) for i in range(90)]
    [decision] = evaluate(POLICY, [agg(diluted)], [], T0)
    assert decision.numbers.reporting == 100
    assert decision.numbers.counted == 10


@settings(max_examples=150, deadline=None)
@given(windows=windows_st(devices=1), calm=st.integers(0, 5), at=st.integers(0, 25 * MIN))
def test_a_single_noisy_device_never_opens_an_incident(
    windows: list[DriftWindow], calm: int, at: int
) -> None:
    noisy = [replace(w, n=1000, psi_class=9.0, alarms=5) for w in windows]
    others = [window(f"calm-{i}", T0 + m * MIN, n=1000) for i in range(calm) for m in range(25)]
    for policy in (POLICY, SMALL, DriftPolicy(min_devices=2, min_share=0.01)):
        assert evaluate(policy, [agg(noisy + others)], [], T0 + at) == []


def test_an_open_incident_blocks_a_second_one() -> None:
    a = agg(fleet_windows(T0, drifting=6, calm=4))
    incident = open_incident(1, KEY, "drift", T0 - MIN)
    for stage in (incident, start_retraining(incident, 5, T0)):
        assert evaluate(POLICY, [a], [stage], T0 + MIN) == []
    # an incident elsewhere does not block this one
    other = open_incident(2, replace(KEY, group="gateways"), "drift", T0 - MIN)
    assert len(evaluate(POLICY, [a], [other], T0 + MIN)) == 1


def test_cooldown_is_honoured_after_an_incident_closes() -> None:
    closed_at = T0 + 2 * MIN
    incident = fail(open_incident(1, KEY, "drift", T0), closed_at, "job broke")
    cooldown_ms = round(POLICY.cooldown_s * 1000)
    late = closed_at + cooldown_ms
    a = agg(fleet_windows(late - MIN, drifting=5, calm=5) + fleet_windows(T0, 5, 5))
    assert evaluate(POLICY, [a], [incident], late - MIN) == []
    assert evaluate(POLICY, [a], [incident], late - 1) == []
    [decision] = evaluate(POLICY, [a], [incident], late)
    assert isinstance(decision, OpenIncident)


def test_two_aggregates_for_one_key_are_refused() -> None:
    with pytest.raises(ValidationError, match="two"):
        evaluate(POLICY, [agg([]), agg([])], [], T0)


# --- closing: the hold and the hysteresis --------------------------------------------------


def test_closing_needs_the_whole_hold() -> None:
    incident = open_incident(1, KEY, "drift", T0)
    # 5 of 10 drifting for 10 minutes, then all calm from minute 10 on
    a = agg(every_minute(0, 10, drifting=5) + every_minute(10, 60, drifting=0))
    calm_from = T0 + 10 * MIN
    hold_ms = round(POLICY.hold_s * 1000)
    assert evaluate(POLICY, [a], [incident], calm_from + hold_ms - 1) == []
    [decision] = evaluate(POLICY, [a], [incident], calm_from + hold_ms)
    assert isinstance(decision, CloseIncident)
    assert decision.incident_id == 1
    assert "calm" in decision.reason
    cleared = clear(incident, calm_from + hold_ms, decision.reason)
    assert cleared.stage is Stage.CLEARED
    assert cleared.closed_ms == calm_from + hold_ms
    # and now the cooldown keeps a relapse from reopening at once
    relapse = a.add(fleet_windows(calm_from + hold_ms + MIN, 6, 4))
    assert evaluate(POLICY, [relapse], [cleared], calm_from + hold_ms + MIN) == []


def test_an_incident_is_not_closed_within_the_hold_of_its_opening() -> None:
    a = agg(every_minute(0, 60, drifting=0))  # calm all along (an operator opened it)
    opened = T0 + 30 * MIN
    incident = open_incident(1, KEY, "opened by hand", opened)
    hold_ms = round(POLICY.hold_s * 1000)
    assert evaluate(POLICY, [a], [incident], opened + hold_ms - 1) == []
    assert len(evaluate(POLICY, [a], [incident], opened + hold_ms)) == 1


def test_a_share_between_release_and_trigger_neither_opens_nor_closes() -> None:
    # 3 of 20 = 15 %: under the 20 % that opens, over the 10 % that closes
    a = agg(every_minute(0, 60, drifting=3, size=20))
    now = T0 + 59 * MIN
    assert evaluate(POLICY, [a], [], now) == []
    assert evaluate(POLICY, [a], [open_incident(1, KEY, "drift", T0)], now) == []


def test_a_relapse_during_the_hold_restarts_it() -> None:
    incident = open_incident(1, KEY, "drift", T0)
    blip = T0 + 20 * MIN
    relapsed = [window(f"cam-{i}", blip, psi=0.6) for i in range(2)]  # worse news wins the tie
    a = agg(every_minute(0, 60, drifting=0) + relapsed)  # 2 of 10 drifting for a minute
    hold_ms = round(POLICY.hold_s * 1000)
    assert evaluate(POLICY, [a], [incident], blip + MIN + hold_ms - 1) == []
    assert len(evaluate(POLICY, [a], [incident], blip + MIN + hold_ms)) == 1


def test_a_silent_fleet_closes_nothing() -> None:
    incident = open_incident(1, KEY, "drift", T0)
    a = agg(every_minute(0, 5, drifting=5))
    assert evaluate(POLICY, [a], [incident], T0 + 120 * MIN) == []


def test_work_in_progress_is_not_closed_by_calm() -> None:
    a = agg(every_minute(0, 60, drifting=0))
    incident = start_retraining(open_incident(1, KEY, "drift", T0), 3, T0 + MIN)
    assert evaluate(POLICY, [a], [incident], T0 + 59 * MIN) == []


# --- incident stages and links -------------------------------------------------------------


def test_the_link_chain_is_kept() -> None:
    incident = open_incident(4, KEY, "4 of 10 devices drifting", T0)
    incident = start_retraining(incident, job_id=17, at_ms=T0 + 1)
    incident = mark_built(incident, model_id=23, skill_version="1.1.0", at_ms=T0 + 2)
    incident = start_canary(incident, deployment_id=31, at_ms=T0 + 3)
    done = promote(incident, at_ms=T0 + 4)
    assert (done.job_id, done.model_id, done.skill_version, done.deployment_id) == (
        17,
        23,
        "1.1.0",
        31,
    )
    assert [(c.stage, c.at_ms) for c in done.history] == [
        (Stage.OPEN, T0),
        (Stage.RETRAINING, T0 + 1),
        (Stage.BUILT, T0 + 2),
        (Stage.CANARY, T0 + 3),
        (Stage.PROMOTED, T0 + 4),
    ]
    assert [c.note for c in done.history[1:4]] == [
        "job 17",
        "model 23 as face-detect 1.1.0",
        "deployment 31",
    ]
    assert (done.closed_ms, done.outcome, done.entered_ms(Stage.BUILT)) == (
        T0 + 4,
        "promoted",
        T0 + 2,
    )
    assert done.entered_ms(Stage.ROLLED_BACK) is None
    back = roll_back(incident, T0 + 5, "accuracy gate failed")
    assert (back.stage, back.closed_ms, back.deployment_id) == (Stage.ROLLED_BACK, T0 + 5, 31)
    assert back.outcome == "accuracy gate failed"
    assert incident.closed_ms is None  # records are values: the canary one is unchanged


MOVES = {
    "retrain": lambda i: start_retraining(i, 1, T0 + 10),
    "built": lambda i: mark_built(i, 2, "1.1.0", T0 + 10),
    "canary": lambda i: start_canary(i, 3, T0 + 10),
    "promote": lambda i: promote(i, T0 + 10),
    "roll_back": lambda i: roll_back(i, T0 + 10, "gate"),
    "fail": lambda i: fail(i, T0 + 10, "broke"),
    "clear": lambda i: clear(i, T0 + 10, "calm"),
}
LEGAL = {
    Stage.OPEN: {"retrain", "fail", "clear"},
    Stage.RETRAINING: {"built", "fail"},
    Stage.BUILT: {"canary", "fail"},
    Stage.CANARY: {"promote", "roll_back", "fail"},
}


def _at_stage(stage: Stage) -> IncidentState:
    i = open_incident(1, KEY, "drift", T0)
    path = {
        Stage.OPEN: [],
        Stage.RETRAINING: ["retrain"],
        Stage.BUILT: ["retrain", "built"],
        Stage.CANARY: ["retrain", "built", "canary"],
        Stage.PROMOTED: ["retrain", "built", "canary", "promote"],
        Stage.ROLLED_BACK: ["retrain", "built", "canary", "roll_back"],
        Stage.FAILED: ["fail"],
        Stage.CLEARED: ["clear"],
    }[stage]
    for move in path:
        i = MOVES[move](i)
    return i


@pytest.mark.parametrize("stage", list(Stage))
@pytest.mark.parametrize("move", list(MOVES))
def test_only_legal_stage_transitions_are_allowed(stage: Stage, move: str) -> None:
    incident = _at_stage(stage)
    assert incident.stage is stage
    if move in LEGAL.get(stage, set()):
        assert MOVES[move](incident).history[-1].at_ms == T0 + 10
    else:
        with pytest.raises(IllegalTransitionError, match=f"is {stage}"):
            MOVES[move](incident)


def test_bad_transition_arguments_are_refused() -> None:
    incident = start_retraining(open_incident(1, KEY, "drift", T0), 5, T0 + MIN)
    with pytest.raises(ValidationError, match="before"):
        mark_built(incident, 2, "1.1.0", T0)  # back in time
    with pytest.raises(ValidationError, match="version"):
        mark_built(incident, 2, "1.0.0", T0 + 2 * MIN)  # the drifting version itself
    with pytest.raises(ValidationError, match="model"):
        mark_built(incident, -2, "1.1.0", T0 + 2 * MIN)
    with pytest.raises(ValidationError, match="job"):
        start_retraining(open_incident(1, KEY, "drift", T0), True, T0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "fields",
    [
        {"closed_ms": T0},  # closed while open
        {"stage": Stage.RETRAINING},  # a stage the history never reached
        {"job_id": 3},  # a link for a stage it never reached
        {"id": -1},
        {"opened_ms": -5},
    ],
)
def test_inconsistent_records_are_refused(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        replace(open_incident(1, KEY, "drift", T0), **fields)
