"""Properties of the pure reconcile planner, checked against a model of a device."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace

from hypothesis import given, settings
from hypothesis import strategies as st

from edge_agent.planner import (
    UNKNOWN_GENERATION,
    Action,
    Activate,
    Desired,
    Failure,
    Fetch,
    Installed,
    Prune,
    Remove,
    Rollback,
    Start,
    Wanted,
    plan,
)

NAMES = ("cam", "gate", "ocr")
VERSIONS = ("1", "2", "3", "4")
ROUNDS = 12

versions_st = st.sampled_from(VERSIONS)
config_st = st.lists(
    st.tuples(st.sampled_from(("mode", "rate")), st.sampled_from(("a", "b"))),
    max_size=2,
    unique_by=lambda kv: kv[0],
).map(lambda pairs: tuple(sorted(pairs)))


@st.composite
def desired_st(draw: st.DrawFn) -> Desired:
    names = draw(st.lists(st.sampled_from(NAMES), unique=True))
    skills = tuple(Wanted(n, v := draw(versions_st), f"{n}/{v}", draw(config_st)) for n in names)
    return Desired(draw(st.integers(0, 5)), skills)


@st.composite
def installed_st(draw: st.DrawFn) -> tuple[Installed, ...]:
    found = []
    for name in draw(st.lists(st.sampled_from(NAMES), unique=True)):
        versions = draw(st.lists(versions_st, unique=True, max_size=4))
        current = draw(st.sampled_from([None, *versions]))
        others = [v for v in versions if v != current]
        previous = draw(st.sampled_from([None, *others])) if current is not None else None
        running = current is not None and draw(st.booleans())
        found.append(Installed(name, current, previous, tuple(sorted(versions)), running))
    return tuple(found)


@dataclass
class Device:
    """A model of what the executor does to disk and processes, with chosen faults."""

    skills: dict[str, Installed]
    broken: frozenset[tuple[str, str]] = frozenset()  # fail their health check
    unfetchable: frozenset[tuple[str, str]] = frozenset()
    failures: list[Failure] = field(default_factory=list)
    started_with: dict[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)

    def run(self, action: Action, generation: int, now: float) -> None:
        skill = self.skills.get(action.name) or Installed(action.name, None)
        match action:
            case Fetch(name, version, _):
                if (name, version) in self.unfetchable:
                    self.failures.append(Failure(name, version, generation, now + 3.0))
                else:
                    versions = tuple(sorted({*skill.versions, version}))
                    self.skills[name] = replace(skill, versions=versions)
            case Activate(name, version, config):
                # Start and health-check first; only a healthy version becomes current.
                assert version in skill.versions and skill.current != version
                if (name, version) in self.broken:
                    self.failures.append(Failure(name, version, generation, math.inf))
                    self.skills[name] = replace(skill, running=False)
                    return
                self.started_with[name] = config
                self.skills[name] = replace(
                    skill, current=version, previous=skill.current, running=True
                )
            case Start(name, version, config):
                assert skill.current == version and not skill.running
                ok = (name, version) not in self.broken
                if not ok:
                    self.failures.append(Failure(name, version, generation, math.inf))
                else:
                    self.started_with[name] = config
                self.skills[name] = replace(skill, running=ok)
            case Rollback(name, failed):
                assert skill.current == failed and skill.previous is not None
                self.skills[name] = replace(
                    skill, current=skill.previous, previous=failed, running=False
                )
            case Remove(name):
                del self.skills[name]
            case Prune(name, keep):
                ranked = [v for v in (skill.current, skill.previous) if v is not None]
                ranked += sorted(set(skill.versions) - set(ranked), reverse=True)
                kept = ranked[:keep]
                previous = skill.previous if skill.previous in kept else None
                self.skills[name] = replace(skill, previous=previous, versions=tuple(sorted(kept)))

    def converge(self, desired: Desired | None, now: float = 0.0) -> int:
        """Plan and run until the plan is empty; the number of rounds it took."""
        generation = UNKNOWN_GENERATION if desired is None else desired.generation
        for rounds in range(ROUNDS):
            actions = plan(desired, self.skills.values(), self.failures, now)
            if not actions:
                return rounds
            assert len({a.name for a in actions}) == len(actions)  # one step per skill
            for action in actions:
                self.run(action, generation, now)
        raise AssertionError(f"no fixed point after {ROUNDS} rounds: {self.skills}")


def as_device(installed: tuple[Installed, ...], **faults: frozenset[tuple[str, str]]) -> Device:
    return Device({s.name: s for s in installed}, **faults)


@settings(max_examples=300)
@given(desired_st(), installed_st())
def test_every_desired_state_leads_to_the_desired_skill_set(
    desired: Desired, installed: tuple[Installed, ...]
) -> None:
    device = as_device(installed)
    device.converge(desired)
    assert set(device.skills) == {s.name for s in desired.skills}
    for spec in desired.skills:
        skill = device.skills[spec.name]
        assert (skill.current, skill.running) == (spec.version, True)
        assert spec.version in skill.versions and len(skill.versions) <= 2
        if skill.previous is not None:
            assert skill.previous in skill.versions
    assert plan(desired, device.skills.values(), (), 0.0) == ()


@settings(max_examples=300)
@given(
    desired_st(),
    installed_st(),
    st.sets(st.tuples(st.sampled_from(NAMES), versions_st)),
    st.sets(st.tuples(st.sampled_from(NAMES), versions_st)),
)
def test_faults_still_reach_a_fixed_point_and_keep_a_working_version(
    desired: Desired,
    installed: tuple[Installed, ...],
    broken: set[tuple[str, str]],
    unfetchable: set[tuple[str, str]],
) -> None:
    device = as_device(installed, broken=frozenset(broken), unfetchable=frozenset(unfetchable))
    vetted = {(s.name, v) for s in installed for v in (s.current, s.previous)}
    device.converge(desired)
    for name, now in device.skills.items():  # only a vetted version may be current broken
        if (name, now.current) in broken:
            assert (name, now.current) in vetted
    assert set(device.skills) <= {s.name for s in desired.skills}
    for spec in desired.skills:
        skill = device.skills.get(spec.name)
        if (spec.name, spec.version) not in broken | unfetchable:
            assert skill is not None and (skill.current, skill.running) == (spec.version, True)
        if spec.name in device.started_with:  # whatever was started got the hub's config
            assert device.started_with[spec.name] == spec.config


@settings(max_examples=300)
@given(desired_st(), installed_st(), st.data())
def test_a_version_that_failed_its_health_check_waits_for_a_new_desired_state(
    desired: Desired, installed: tuple[Installed, ...], data: st.DataObject
) -> None:
    if not desired.skills:
        return
    spec = data.draw(st.sampled_from(desired.skills))
    failed = Failure(spec.name, spec.version, desired.generation, math.inf)
    for now in (0.0, 1e9):
        actions = plan(desired, installed, [failed], now)
        tried = [
            a
            for a in actions
            if isinstance(a, (Fetch, Activate, Start))
            and (a.name, a.version) == (spec.name, spec.version)
        ]
        assert tried == []
    newer = replace(desired, generation=desired.generation + 1)
    assert plan(newer, installed, [failed], 0.0) == plan(newer, installed, [], 0.0)


@settings(max_examples=300)
@given(desired_st(), installed_st(), st.data(), st.floats(0.5, 1000.0))
def test_a_failed_fetch_is_retried_only_after_its_backoff(
    desired: Desired, installed: tuple[Installed, ...], data: st.DataObject, backoff: float
) -> None:
    if not desired.skills:
        return
    spec = data.draw(st.sampled_from(desired.skills))
    failed = Failure(spec.name, spec.version, desired.generation, 100.0 + backoff)
    early = plan(desired, installed, [failed], 100.0)
    assert Fetch(spec.name, spec.version, spec.target) not in early
    assert Activate(spec.name, spec.version, spec.config) not in early
    assert plan(desired, installed, [failed], 100.0 + backoff) == plan(desired, installed, [], 0.0)


@settings(max_examples=300)
@given(
    st.one_of(st.none(), desired_st()),
    installed_st(),
    st.lists(
        st.builds(
            Failure,
            st.sampled_from(NAMES),
            versions_st,
            st.integers(-1, 5),
            st.sampled_from((0.0, 5.0, math.inf)),
        )
    ),
    st.floats(0.0, 10.0),
    st.randoms(use_true_random=False),
)
def test_the_same_inputs_always_give_the_same_actions(
    desired: Desired | None,
    installed: tuple[Installed, ...],
    failures: list[Failure],
    now: float,
    rng: random.Random,
) -> None:
    first = plan(desired, installed, failures, now)
    assert plan(desired, installed, failures, now) == first
    shuffled_installed = list(installed)
    rng.shuffle(shuffled_installed)
    shuffled_failures = list(failures)
    rng.shuffle(shuffled_failures)
    if desired is not None:
        skills = list(desired.skills)
        rng.shuffle(skills)
        desired = replace(desired, skills=tuple(skills))
    assert plan(desired, shuffled_installed, shuffled_failures, now) == first
    assert [a.name for a in first] == sorted(a.name for a in first)


@settings(max_examples=200)
@given(installed_st())
def test_an_unknown_desired_state_keeps_what_is_installed(
    installed: tuple[Installed, ...],
) -> None:
    device = as_device(installed)
    device.converge(None)
    for before in installed:
        after = device.skills[before.name]  # nothing is removed
        assert after.versions == before.versions  # nothing fetched or pruned
        if before.current is not None:
            assert (after.current, after.running) == (before.current, True)
            assert device.started_with.get(before.name, ()) == ()


def test_a_broken_version_is_health_checked_before_the_switch_and_never_becomes_current() -> None:
    device = Device(
        {"cam": Installed("cam", "1", None, ("1",), running=True)},
        broken=frozenset({("cam", "2")}),
    )
    desired = Desired(7, (Wanted("cam", "2", "cam/2", (("mode", "a"),)),))
    steps = []
    for _ in range(ROUNDS):
        actions = plan(desired, device.skills.values(), device.failures, 0.0)
        if not actions:
            break
        steps.extend(actions)
        for action in actions:
            device.run(action, desired.generation, 0.0)
    assert steps == [
        Fetch("cam", "2", "cam/2"),
        Activate("cam", "2", (("mode", "a"),)),
        Start("cam", "1", (("mode", "a"),)),
    ]
    assert device.skills["cam"] == Installed("cam", "1", None, ("1", "2"), running=True)
