"""Rollout plans, maintenance windows and gates: parsing, refusals, and verdicts (pure)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloud.errors import ValidationError
from cloud.rollout.gates import (
    DEFAULT_GATES,
    Gate,
    GateKind,
    KpiTotals,
    Observations,
    Verdict,
    evaluate_gate,
)
from cloud.rollout.plan import (
    DAYS,
    PlanStrategy,
    Rolling,
    RolloutPlan,
    parse_plan,
    parse_window,
    plan_from_dict,
)

EXAMPLE = """
strategy = "canary"
canary = "10%"
then = "waves"
soak_s = 600
windows = ["mon-fri 01:00-05:00"]
priority = 7
[waves]
base_rate_per_min = 10
increment_factor = 2.0
max_per_min = 500
[gates]
install_failure = "10%"
accuracy_drop = 2.0
p95_ratio = { max = 1.5, min_samples = 200, soak_s = 900 }
"""


def test_the_documented_example_reads_as_written() -> None:
    plan = parse_plan(EXAMPLE)
    assert plan.strategy is PlanStrategy.CANARY
    assert plan.canary is not None and plan.canary.percent == 10 and plan.canary.then == "waves"
    assert plan.waves is not None and plan.waves.max_per_min == 500
    assert plan.soak_s == 600 and plan.priority == 7
    assert [g.kind for g in plan.gates] == [
        GateKind.INSTALL_FAILURE,
        GateKind.ACCURACY_DROP,
        GateKind.P95_RATIO,
    ]
    assert plan.gates[0].limit == pytest.approx(0.1)
    assert plan.gates[2] == Gate(GateKind.P95_RATIO, 1.5, min_samples=200, soak_s=900)


@pytest.mark.parametrize("name", [s.value for s in PlanStrategy if s is not PlanStrategy.AB])
def test_a_bare_strategy_name_is_a_plan_with_defaults(name: str) -> None:
    plan = parse_plan(f"  {name}\n")
    assert plan.strategy == name
    assert plan.gates == DEFAULT_GATES
    assert not plan.windows and plan.in_window(0)


def test_an_empty_plan_is_all_at_once() -> None:
    assert plan_from_dict({}) == RolloutPlan()


@pytest.mark.parametrize(
    ("data", "named"),
    [
        ({"strategy": "blue-green"}, "'blue-green'"),
        ({"strategy": "canary", "canary": "0%"}, "'0%'"),
        ({"strategy": "canary", "canary": "ten%"}, "'ten%'"),
        ({"strategy": "canary", "canary": -3}, "-3"),
        ({"strategy": "canary", "canary": 3, "min_samples": 10}, "3 devices"),
        (
            {
                "strategy": "canary",
                "canary": 15,
                "gates": {"health": {"max": 0.1, "min_samples": 30}},
            },
            "30 samples",
        ),
        ({"strategy": "canary", "then": "later"}, "'later'"),
        ({"strategy": "waves", "waves": {"increment_factor": 9}}, "9"),
        ({"strategy": "waves", "waves": {"base": 3}}, "'base'"),
        ({"strategy": "waves", "waves": {"base_rate_per_min": 50, "max_per_min": 5}}, "5"),
        ({"strategy": "rolling", "rolling": {"max_in_flight": 0}}, "0"),
        ({"strategy": "rolling", "rolling": {"max_in_flight": 2.5}}, "2.5"),
        ({"strategy": "rolling", "rolling": {"size": 3}}, "'size'"),
        ({"strategy": "waves", "rolling": {"max_in_flight": 3}}, "rolling"),
        ({"strategy": "ab"}, "None"),
        ({"strategy": "ab", "ab": {"control": "1.0", "weight": 100}}, "100"),
        ({"canary": "10%"}, "canary"),
        ({"waves": {}}, "waves"),
        ({"soak": 5}, "'soak'"),
        ({"soak_s": -1}, "-1"),
        ({"min_samples": 0}, "0"),
        ({"priority": "high"}, "'high'"),
        ({"windows": "mon 01:00-02:00"}, "'mon 01:00-02:00'"),
        ({"windows": ["someday 01:00-02:00"]}, "'someday'"),
        ({"windows": ["mon 25:00-26:00"]}, "25:00"),
        ({"windows": ["mon 03:00-03:00"]}, "'mon 03:00-03:00'"),
        ({"windows": ["mon"]}, "'mon'"),
        ({"gates": {"latency": 2}}, "'latency'"),
        ({"gates": {"install_failure": 1.5}}, "1.5"),
        ({"gates": {"install_failure": "lots"}}, "'lots'"),
        ({"gates": {"p95_ratio": 0.5}}, "0.5"),
        ({"gates": {"health": {"max": 0.1, "wait": 3}}}, "'wait'"),
        ({"gates": {"health": {"max": 0.1, "min_samples": 2.5}}}, "2.5"),
        ({"gates": "strict"}, "'strict'"),
    ],
)
def test_a_bad_plan_is_refused_in_one_line_naming_the_value(data: dict, named: str) -> None:
    with pytest.raises(ValidationError) as err:
        plan_from_dict(data)
    message = str(err.value)
    assert named in message
    assert "\n" not in message


def test_unreadable_toml_is_refused_in_one_line() -> None:
    with pytest.raises(ValidationError, match="not valid TOML") as err:
        parse_plan('strategy = "canary\n')
    assert "\n" not in str(err.value)


def test_a_rolling_plan_reads_its_places() -> None:
    plan = parse_plan('strategy = "rolling"\nsoak_s = 30\n[rolling]\nmax_in_flight = 300')
    assert plan.strategy is PlanStrategy.ROLLING and plan.rolling == Rolling(300)
    assert plan.soak_s == 30 and plan.waves is None
    assert parse_plan("rolling").rolling == Rolling(100)


def test_canary_and_wave_sizes() -> None:
    plan = parse_plan('strategy = "canary"\ncanary = "10%"\nmin_samples = 20\nthen = "waves"')
    assert plan.canary is not None and plan.waves is not None
    assert plan.canary.size(200, plan.min_samples) == 20
    assert plan.canary.size(1000, plan.min_samples) == 100
    assert plan.canary.size(50, plan.min_samples) == 20  # at least min_samples
    assert plan.canary.size(7, plan.min_samples) == 7  # never more than the group
    sizes = [plan.waves.size(k) for k in range(12)]
    assert sizes[:4] == [10, 20, 40, 80]
    assert max(sizes) == 1000 and sizes == sorted(sizes)
    assert plan.waves.size(10_000) == 1000  # no overflow far along


windows_st = st.builds(
    lambda days, start, stop: (
        f"{days} {start // 60:02d}:{start % 60:02d}-{stop // 60:02d}:{stop % 60:02d}"
    ),
    st.one_of(
        st.just("daily"),
        st.sampled_from(DAYS),
        st.tuples(st.sampled_from(DAYS), st.sampled_from(DAYS)).map("-".join),
        st.lists(st.sampled_from(DAYS), min_size=1, max_size=3, unique=True).map(",".join),
    ),
    st.integers(0, 1439),
    st.integers(1, 1440),
).filter(lambda text: text.split()[1][:5] != text.split()[1][6:])


def _expected_days(spec: str) -> set[int]:
    if spec == "daily":
        return set(range(7))
    days: set[int] = set()
    for part in spec.split(","):
        first, _, last = part.partition("-")
        a, b = DAYS.index(first), DAYS.index(last or first)
        i = a
        days.add(i)
        while i != b:
            i = (i + 1) % 7
            days.add(i)
    return days


def _oracle(text: str, now_ms: int) -> bool:
    """Whether ``now_ms`` is in the window, worked out with datetime, day by day."""
    spec, times = text.split()
    start = int(times[0:2]) * 60 + int(times[3:5])
    stop = int(times[6:8]) * 60 + int(times[9:11])
    at = datetime.fromtimestamp(now_ms / 1000, UTC)
    minute = at.hour * 60 + at.minute
    days = _expected_days(spec)
    if start < stop:
        return at.weekday() in days and start <= minute < stop
    yesterday = (at.weekday() - 1) % 7
    return (at.weekday() in days and minute >= start) or (yesterday in days and minute < stop)


@settings(max_examples=300, deadline=None)
@given(text=windows_st, now_ms=st.integers(0, 4_000_000_000_000))
def test_a_window_contains_exactly_the_minutes_datetime_says(text: str, now_ms: int) -> None:
    window = parse_window(text)
    assert window.contains(now_ms) == _oracle(text, now_ms)
    plan = plan_from_dict({"windows": [text]})
    assert plan.in_window(now_ms) == window.contains(now_ms)


def test_window_examples() -> None:
    night = parse_window("mon-fri 01:00-05:00")
    monday_3am = int(datetime(2024, 1, 1, 3, 0, tzinfo=UTC).timestamp() * 1000)
    saturday_3am = int(datetime(2024, 1, 6, 3, 0, tzinfo=UTC).timestamp() * 1000)
    monday_5am = int(datetime(2024, 1, 1, 5, 0, tzinfo=UTC).timestamp() * 1000)
    assert night.contains(monday_3am)
    assert not night.contains(saturday_3am)
    assert not night.contains(monday_5am)  # the end is not in the window
    late = parse_window("fri 22:00-02:00")  # runs into Saturday
    assert late.contains(int(datetime(2024, 1, 6, 1, 59, tzinfo=UTC).timestamp() * 1000))
    assert not late.contains(int(datetime(2024, 1, 5, 1, 0, tzinfo=UTC).timestamp() * 1000))


gates_st = st.dictionaries(
    st.sampled_from([k.value for k in GateKind]),
    st.one_of(
        st.floats(0, 1).map(lambda x: round(x, 3)),
        st.fixed_dictionaries(
            {"max": st.floats(0, 1).map(lambda x: round(x, 3))},
            optional={"min_samples": st.integers(1, 500), "soak_s": st.integers(0, 3600)},
        ),
    ),
).map(lambda d: {k: _fit_ratio(k, v) for k, v in d.items()})


def _fit_ratio(kind: str, value: object) -> object:
    if kind != GateKind.P95_RATIO:
        return value
    if isinstance(value, dict):
        return {**value, "max": 1 + value["max"]}
    return 1 + float(value)  # type: ignore[arg-type]


plans_st = (
    st.fixed_dictionaries(
        {"strategy": st.sampled_from(["all-at-once", "waves"])},
        optional={
            "gates": gates_st,
            "soak_s": st.integers(0, 3600),
            "min_samples": st.integers(1, 50),
            "install_timeout_s": st.integers(1, 3600),
            "wave_interval_s": st.integers(0, 600),
            "windows": st.lists(windows_st, max_size=3),
            "priority": st.integers(-100, 100),
            "baseline_since_ms": st.none() | st.integers(0, 2**53),
        },
    )
    | st.builds(
        lambda canary, then: {
            "strategy": "canary",
            "canary": canary,
            "then": then,
            "min_samples": 1,
        },
        st.one_of(st.integers(1, 50), st.integers(1, 99).map(lambda p: f"{p}%")),
        st.sampled_from(["all", "waves"]),
    )
    | st.builds(
        lambda size: {"strategy": "rolling", "rolling": {"max_in_flight": size}},
        st.integers(1, 100_000),
    )
    | st.builds(
        lambda weight: {"strategy": "ab", "ab": {"control": "1.0.0", "weight": weight}},
        st.integers(1, 99),
    )
)


@settings(max_examples=200, deadline=None)
@given(data=plans_st)
def test_a_plan_survives_its_stored_form(data: dict) -> None:
    plan = plan_from_dict(data)
    assert plan_from_dict(plan.to_dict()) == plan
    assert plan.priority == data.get("priority", 0)


# --- gates -----------------------------------------------------------------------------------


def _obs(**kw: object) -> Observations:
    return Observations(**kw)  # type: ignore[arg-type]


def _judge(gate: Gate, obs: Observations, soaked_s: float = 10_000) -> tuple[Verdict, str]:
    result = evaluate_gate(gate, obs, min_samples=20, soak_s=600, soaked_s=soaked_s)
    return result.verdict, result.reason


def test_install_failures_wait_for_samples_then_fail_at_once_even_before_the_soak() -> None:
    gate = Gate(GateKind.INSTALL_FAILURE, 0.1)
    assert _judge(gate, _obs(admitted=30, finished=19, install_failed=19)) == (
        Verdict.WAIT,
        "install_failure: waiting for samples (19 of 20)",
    )
    verdict, reason = _judge(gate, _obs(admitted=30, finished=20, install_failed=4), soaked_s=0)
    assert verdict is Verdict.FAIL
    assert reason == "install failures 20.0% (4 of 20), limit 10.0%"
    assert _judge(gate, _obs(admitted=30, finished=20, install_failed=2), soaked_s=30)[0] is (
        Verdict.WAIT
    )
    assert _judge(gate, _obs(admitted=30, finished=20, install_failed=2))[0] is Verdict.PASS


def test_device_gates_need_no_more_samples_than_admitted_devices_can_give() -> None:
    install = Gate(GateKind.INSTALL_FAILURE, 0.1)
    assert _judge(install, _obs(admitted=5, finished=4))[0] is Verdict.WAIT
    assert _judge(install, _obs(admitted=5, finished=5))[0] is Verdict.PASS
    health = Gate(GateKind.HEALTH, 0.1)  # devices that failed to install can never run
    assert _judge(health, _obs(admitted=20, finished=20, install_failed=1, ran=19))[0] is (
        Verdict.PASS
    )


def test_offline_and_health_shares() -> None:
    offline = Gate(GateKind.OFFLINE, 0.2)
    assert _judge(offline, _obs(admitted=20, offline=5))[0] is Verdict.FAIL
    assert _judge(offline, _obs(admitted=20, offline=4))[0] is Verdict.PASS
    health = Gate(GateKind.HEALTH, 0.05, min_samples=10)
    verdict, reason = _judge(health, _obs(admitted=40, ran=10, health_failed=1))
    assert (verdict, reason) == (Verdict.FAIL, "unhealthy after start 10.0% (1 of 10), limit 5.0%")


def test_accuracy_is_compared_in_points_against_the_baseline() -> None:
    gate = Gate(GateKind.ACCURACY_DROP, 2.0, min_samples=100)
    worse = _obs(
        candidate=KpiTotals(labelled=1000, correct=910),
        baseline=KpiTotals(labelled=1000, correct=960),
    )
    assert _judge(gate, worse) == (
        Verdict.FAIL,
        "accuracy 0.91 vs 0.96 baseline: -5.0 points, limit -2.0",
    )
    same = _obs(
        candidate=KpiTotals(labelled=1000, correct=955),
        baseline=KpiTotals(labelled=1000, correct=960),
    )
    assert _judge(gate, same)[0] is Verdict.PASS
    unlabelled = _obs(candidate=KpiTotals(labelled=99, correct=0), baseline=KpiTotals(labelled=500))
    assert _judge(gate, unlabelled)[0] is Verdict.WAIT  # too few labels is never a pass


def test_p95_latency_and_error_rate_against_the_baseline() -> None:
    p95 = Gate(GateKind.P95_RATIO, 1.5)
    slow = _obs(
        candidate=KpiTotals(inferences=500, p95_ms=80),
        baseline=KpiTotals(inferences=500, p95_ms=40),
    )
    assert _judge(p95, slow) == (
        Verdict.FAIL,
        "p95 latency 80.0 ms vs 40.0 ms baseline: 2.00x, limit 1.50x",
    )
    errors = Gate(GateKind.ERROR_RATE, 1.0)
    noisy = _obs(
        candidate=KpiTotals(inferences=1000, errors=30),
        baseline=KpiTotals(inferences=1000, errors=10),
    )
    assert _judge(errors, noisy) == (
        Verdict.FAIL,
        "error rate 3.0% vs 1.0% baseline: +2.0 points, limit +1.0",
    )
    assert (
        _judge(errors, _obs(candidate=KpiTotals(inferences=5), baseline=KpiTotals(inferences=5)))[0]
        is Verdict.WAIT
    )


@settings(max_examples=300, deadline=None)
@given(
    kind=st.sampled_from(list(GateKind)),
    limit=st.floats(0, 1),
    need=st.integers(1, 100),
    cand=st.tuples(st.integers(0, 200), st.integers(0, 200), st.floats(1, 500)),
    base=st.tuples(st.integers(0, 200), st.integers(0, 200), st.floats(1, 500)),
    devices=st.tuples(st.integers(0, 300), st.integers(0, 300), st.integers(0, 300)),
    soaked=st.floats(0, 1000),
)
def test_a_gate_never_passes_short_of_samples_or_soak(
    kind: GateKind,
    limit: float,
    need: int,
    cand: tuple[int, int, float],
    base: tuple[int, int, float],
    devices: tuple[int, int, int],
    soaked: float,
) -> None:
    gate = Gate(kind, limit + 1 if kind is GateKind.P95_RATIO else limit, min_samples=need)
    admitted, finished, bad = devices[0], min(devices), min(devices[1:])
    obs = Observations(
        targets=admitted,
        admitted=admitted,
        finished=finished,
        install_failed=bad,
        ran=finished - bad,
        health_failed=0,
        offline=bad,
        candidate=KpiTotals(1, cand[0] + cand[1], cand[0], cand[0] // 2, 0, cand[2]),
        baseline=KpiTotals(1, base[0] + base[1], base[0], base[0] // 2, 0, base[2]),
    )
    result = evaluate_gate(gate, obs, min_samples=need, soak_s=500, soaked_s=soaked)
    samples = {
        GateKind.INSTALL_FAILURE: (finished, admitted),
        GateKind.OFFLINE: (admitted, admitted),
        GateKind.HEALTH: (finished - bad, admitted - bad),
        GateKind.ACCURACY_DROP: (min(cand[0], base[0]), need),
        GateKind.P95_RATIO: (min(sum(cand[:2]), sum(base[:2])), need),
        GateKind.ERROR_RATE: (min(sum(cand[:2]), sum(base[:2])), need),
    }[kind]
    if result.verdict is Verdict.PASS:
        assert samples[0] >= min(need, samples[1])
        assert soaked >= 500
    if samples[0] < min(need, samples[1]):
        assert result.verdict is Verdict.WAIT
    assert "\n" not in result.reason


@pytest.mark.parametrize(
    ("name", "strategy", "in_flight"),
    [("rollout_rolling.toml", "rolling", 100), ("rollout_rolling200.toml", "rolling", 200)],
)
def test_the_benchmarks_rolling_plans_read_as_they_say(
    name: str, strategy: str, in_flight: int
) -> None:
    bench = Path(__file__).resolve().parents[1] / "bench"
    plan = parse_plan((bench / name).read_text(encoding="utf-8"))
    assert plan.strategy.value == strategy
    assert plan.rolling is not None and plan.rolling.max_in_flight == in_flight
