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
        ValidationError,
        match=r"unknown rollout strategy 'blue-green'; "
        r"known: all-at-once, canary, waves, rolling, ab",
    ):
        ActiveDeployment(1, "face", "1.0.0", "t", {}, {}, "blue-green")  # type: ignore[arg-type]
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


# --- priorities and staged deployments (admitted devices, A/B versions) ---------------------

DEVICE_IDS = ("d1", "d2", "d3")


@st.composite
def layered_st(draw: st.DrawFn) -> list[ActiveDeployment]:
    """Deployments with priorities; some staged, reaching only the devices they admitted."""
    ids = draw(st.lists(st.integers(0, 1000), unique=True, max_size=10))
    out = []
    for i in ids:
        version = f"2.{draw(st.integers(0, 3))}.0"
        admitted = draw(
            st.none()
            | st.dictionaries(st.sampled_from(DEVICE_IDS), st.sampled_from((version, "1.0.0")))
        )
        out.append(
            ActiveDeployment(
                id=i,
                skill=draw(st.sampled_from(SKILLS[:2])),
                version=version,
                target_name=f"t-{version}",
                selector=draw(labels_st),
                config={},
                strategy=Strategy.ALL_AT_ONCE if admitted is None else Strategy.CANARY,
                priority=draw(st.integers(-2, 2)),
                admitted=admitted,
                version_targets={"1.0.0": "t-1.0.0"},
            )
        )
    return out


def expected_layered(
    device: str, labels: dict[str, str], active: list[ActiveDeployment]
) -> list[DesiredSkill]:
    """Per skill: of the deployments that select and reach the device, the highest
    (priority, id); the version it admitted the device to, else its own."""
    wanted = []
    for skill in sorted({d.skill for d in active}):
        reaching = [
            d
            for d in active
            if d.skill == skill
            and matches(d.selector, labels)
            and (d.admitted is None or device in d.admitted)
        ]
        if reaching:
            best = max(reaching, key=lambda d: (d.priority, d.id))
            version = best.version if best.admitted is None else best.admitted[device]
            wanted.append(DesiredSkill(skill, version, f"t-{version}", {}))
    return wanted


@settings(max_examples=120, deadline=None)
@given(
    device=st.sampled_from(DEVICE_IDS),
    labels=labels_st,
    active=layered_st(),
    seed=st.integers(0, 2**32 - 1),
)
def test_priority_then_id_wins_and_staged_deployments_reach_only_admitted_devices(
    device: str, labels: dict[str, str], active: list[ActiveDeployment], seed: int
) -> None:
    shuffled = list(active)
    random.Random(seed).shuffle(shuffled)
    assert list(compute_desired(labels, shuffled, device)) == expected_layered(
        device, labels, active
    )


@settings(max_examples=40, deadline=None)
@given(labels=labels_st, active=layered_st())
def test_a_device_no_deployment_admitted_keeps_the_broader_one(
    labels: dict[str, str], active: list[ActiveDeployment]
) -> None:
    """Staged deployments that admitted nothing change nobody's desired state."""
    nothing = [
        ActiveDeployment(
            d.id + 2000, d.skill, "9.0.0", "t-9", d.selector, {}, Strategy.WAVES,
            priority=d.priority + 1, admitted={},
        )
        for d in active
    ]  # fmt: skip
    for device in DEVICE_IDS:
        assert compute_desired(labels, active + nothing, device) == compute_desired(
            labels, active, device
        )


def test_a_staged_deployment_needs_the_bundle_of_every_version_it_admits() -> None:
    with pytest.raises(ValidationError, match=r"deployment 1 admits '1\.0\.0' with no bundle"):
        ActiveDeployment(1, "face", "2.0.0", "t", {}, {}, "ab", admitted={"d1": "1.0.0"})  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="bad deployment priority"):
        ActiveDeployment(1, "face", "2.0.0", "t", {}, {}, priority=True)
