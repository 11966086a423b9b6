"""The rollout rule is pure: property tests over random fleets and deployments."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloud.errors import ValidationError
from cloud.rollout import (
    ActiveDeployment,
    DesiredSkill,
    Strategy,
    compute_desired,
    compute_fleet,
    parse_strategy,
)
from cloud.selectors import matches

KEYS = ("kind", "site")
VALUES = ("a", "b")
SKILLS = ("face", "count", "ocr")

labels_st = st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=2)


@st.composite
def deployments_st(draw: st.DrawFn) -> list[ActiveDeployment]:
    ids = draw(st.lists(st.integers(0, 10_000), unique=True, max_size=12))
    return [
        ActiveDeployment(
            id=i,
            skill=draw(st.sampled_from(SKILLS)),
            version=f"1.{draw(st.integers(0, 5))}.0",
            target_name="t",
            selector=draw(labels_st),
            config=draw(st.dictionaries(st.sampled_from(("k", "j")), st.sampled_from(("1", "2")))),
        )
        for i in ids
    ]


fleet_st = st.dictionaries(st.text("abcdefgh-0123", min_size=1, max_size=6), labels_st, max_size=10)


def expected_for(labels: dict[str, str], active: list[ActiveDeployment]) -> list[DesiredSkill]:
    """The rule written the slow, obvious way: per skill, the highest matching id."""
    wanted = []
    for skill in sorted({d.skill for d in active}):
        matching = [d for d in active if d.skill == skill and matches(d.selector, labels)]
        if matching:
            best = max(matching, key=lambda d: d.id)
            wanted.append(DesiredSkill(skill, best.version, best.target_name, dict(best.config)))
    return wanted


@settings(max_examples=300, deadline=None)
@given(labels=labels_st, active=deployments_st())
def test_the_newest_matching_deployment_of_each_skill_wins(
    labels: dict[str, str], active: list[ActiveDeployment]
) -> None:
    assert list(compute_desired(labels, active)) == expected_for(labels, active)


@settings(max_examples=200, deadline=None)
@given(labels=labels_st, active=deployments_st(), seed=st.integers(0, 2**32 - 1))
def test_the_result_is_sorted_and_does_not_depend_on_input_order(
    labels: dict[str, str], active: list[ActiveDeployment], seed: int
) -> None:
    first = compute_desired(labels, active)
    shuffled = list(active)
    random.Random(seed).shuffle(shuffled)
    assert compute_desired(labels, shuffled) == first
    assert compute_desired(labels, active) == first
    names = [s.name for s in first]
    assert names == sorted(names)
    assert len(set(names)) == len(names)


@settings(max_examples=200, deadline=None)
@given(labels=labels_st, active=deployments_st())
def test_a_device_no_group_selects_gets_nothing(
    labels: dict[str, str], active: list[ActiveDeployment]
) -> None:
    unselected = [d for d in active if not matches(d.selector, labels)]
    assert compute_desired(labels, unselected) == ()


@settings(max_examples=150, deadline=None)
@given(fleet=fleet_st, active=deployments_st())
def test_the_fleet_form_equals_the_rule_per_device(
    fleet: dict[str, dict[str, str]], active: list[ActiveDeployment]
) -> None:
    result = compute_fleet(fleet, active)
    assert list(result) == sorted(fleet)
    for device_id, labels in fleet.items():
        assert result[device_id] == compute_desired(labels, active, device_id)


def test_a_rollback_is_a_newer_deployment_of_an_older_version() -> None:
    newer = ActiveDeployment(1, "face", "2.0.0", "t2", {"kind": "a"}, {})
    older_again = ActiveDeployment(2, "face", "1.0.0", "t1", {}, {"k": "v"})
    assert compute_desired({"kind": "a"}, [older_again, newer]) == (
        DesiredSkill("face", "1.0.0", "t1", {"k": "v"}),
    )


def test_the_result_does_not_share_config_with_its_input() -> None:
    config = {"k": "v"}
    dep = ActiveDeployment(1, "face", "1.0.0", "t", {}, config)
    (desired,) = compute_desired({}, [dep])
    config["k"] = "changed"
    assert desired.config == {"k": "v"}


def test_the_rule_reads_the_strategy_and_refuses_unknown_ones() -> None:
    dep = ActiveDeployment(1, "face", "1.0.0", "t", {}, {}, "all-at-once")  # type: ignore[arg-type]
    assert dep.strategy is Strategy.ALL_AT_ONCE
    assert parse_strategy("all-at-once") is Strategy.ALL_AT_ONCE
    with pytest.raises(
        ValidationError, match=r"unknown rollout strategy 'canary'; known: all-at-once"
    ):
        ActiveDeployment(1, "face", "1.0.0", "t", {}, {}, "canary")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="bad deployment id -1"):
        ActiveDeployment(-1, "face", "1.0.0", "t", {}, {})


def test_the_rule_imports_no_io() -> None:
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    code = (
        "import sys, cloud.rollout; "
        "bad = [m for m in ('sqlalchemy', 'grpc', 'paho') if m in sys.modules]; "
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
