"""The reconcile rule: desired state, installed state, failures and time in; actions out.

A pure function with no I/O and no asyncio, so it can be property-tested:
:func:`plan` looks at each skill and returns the *next* step it needs (fetch,
start-then-switch, start, roll back, remove, prune). The executor
(:class:`edge_agent.reconciler.Reconciler`) carries the steps out, records
what failed, and asks again until nothing is left to do. Because every call
starts from what is really on disk and running, a crash, a lost message or a
restart between two steps converges on the next pass (level-triggered).

Failures belong to the generation of the desired state they happened in: a
version that failed its health check (``retry_at`` infinite) is not tried
again while the desired state stays the same; one whose fetch or trust check
failed is tried again once ``retry_at`` has passed. A newer desired state
forgets them all.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = [
    "UNKNOWN_GENERATION",
    "Action",
    "Activate",
    "Desired",
    "Failure",
    "Fetch",
    "Installed",
    "Prune",
    "Remove",
    "Rollback",
    "Start",
    "Wanted",
    "freeze_config",
    "plan",
]

#: The generation failures are filed under while the hub's wishes are unknown.
UNKNOWN_GENERATION = -1

Config = tuple[tuple[str, str], ...]


def freeze_config(config: Mapping[str, str]) -> Config:
    """A configuration as sorted ``(key, value)`` pairs: immutable and order-free."""
    return tuple(sorted(config.items()))


@dataclass(frozen=True, order=True)
class Wanted:
    """One skill the hub wants on the device.

    Attributes:
        name: The skill name.
        version: The version to run.
        target: The TUF target name of its bundle.
        config: The hub's configuration for it, as from :func:`freeze_config`.
    """

    name: str
    version: str
    target: str
    config: Config = ()


@dataclass(frozen=True)
class Desired:
    """The hub's desired state: every skill the device should run, and its generation."""

    generation: int
    skills: tuple[Wanted, ...] = ()


@dataclass(frozen=True)
class Installed:
    """One skill on the device.

    Attributes:
        name: The skill name.
        current: The active version, or ``None`` when only unpacked versions exist.
        previous: The version a rollback returns to, if any.
        versions: Every complete version on disk.
        running: Whether a live control process runs ``current``.
    """

    name: str
    current: str | None
    previous: str | None = None
    versions: tuple[str, ...] = ()
    running: bool = False


@dataclass(frozen=True, order=True)
class Failure:
    """A version that failed, in the generation it failed in, and when it may be tried again.

    Attributes:
        name: The skill name.
        version: The version that failed.
        generation: The desired state's generation at the time.
        retry_at: Clock time after which it may be tried again; ``math.inf`` after a
            failed health check.
    """

    name: str
    version: str
    generation: int
    retry_at: float = math.inf


@dataclass(frozen=True)
class Fetch:
    """Fetch the bundle through TUF, verify it and unpack it (not activated yet)."""

    name: str
    version: str
    target: str


@dataclass(frozen=True)
class Activate:
    """Stop the skill, start and health-check an unpacked version, then switch ``current``.

    The health check runs *before* the switch: a version that fails it, or that takes
    the agent down with it, never becomes ``current``.
    """

    name: str
    version: str
    config: Config = ()


@dataclass(frozen=True)
class Start:
    """Start (and health-check) the active version with the hub's configuration."""

    name: str
    version: str
    config: Config = ()


@dataclass(frozen=True)
class Rollback:
    """Stop the skill and make ``previous`` active again; ``failed`` is the version left."""

    name: str
    failed: str


@dataclass(frozen=True)
class Remove:
    """Stop the skill and delete every version of it."""

    name: str


@dataclass(frozen=True)
class Prune:
    """Delete versions beyond the newest ``keep`` (``current`` and ``previous`` first)."""

    name: str
    keep: int


Action = Fetch | Activate | Start | Rollback | Remove | Prune


def plan(
    desired: Desired | None,
    installed: Iterable[Installed],
    failures: Iterable[Failure],
    now: float,
    *,
    keep_versions: int = 2,
) -> tuple[Action, ...]:
    """The next step for every skill that is not yet as desired, ordered by skill name.

    Args:
        desired: The hub's desired state; ``None`` while it is unknown, which keeps every
            installed skill running as it is (with no hub configuration) and removes nothing.
        installed: What is on the device, one entry per skill name (any order).
        failures: Versions that failed (any order); those of other generations are ignored.
        now: The clock time ``retry_at`` is compared with.
        keep_versions: Versions of a skill kept on disk once the desired one runs.

    Returns:
        At most one action per skill. An empty tuple means the device is as desired.
    """
    generation = UNKNOWN_GENERATION if desired is None else desired.generation
    blocked = frozenset(
        (f.name, f.version) for f in failures if f.generation == generation and f.retry_at > now
    )
    have = {skill.name: skill for skill in installed}
    if desired is None:
        wanted = {
            s.name: Wanted(s.name, s.current, "") for s in have.values() if s.current is not None
        }
        names = set(wanted)
    else:
        wanted = {s.name: s for s in sorted(desired.skills)}  # duplicates: the largest wins
        names = wanted.keys() | have.keys()
    actions: list[Action] = []
    for name in sorted(names):
        step: Action | None
        if name not in wanted:
            step = Remove(name)
        else:
            spec = wanted[name]
            step = _next_step(spec, have.get(name), blocked, desired is not None, keep_versions)
        if step is not None:
            actions.append(step)
    return tuple(actions)


def _next_step(
    spec: Wanted,
    skill: Installed | None,
    blocked: frozenset[tuple[str, str]],
    may_prune: bool,
    keep: int,
) -> Action | None:
    """One skill's next step towards ``spec``, or ``None`` when it is done or must wait."""
    if skill is not None and skill.current == spec.version:
        return _active_step(spec, skill, blocked, keep if may_prune else None)
    if (spec.name, spec.version) in blocked:
        return _keep_current(spec, skill, blocked)
    if skill is not None and spec.version in skill.versions:
        return Activate(spec.name, spec.version, spec.config)
    # A crashed active version is restarted before (and while) the new one downloads.
    return _keep_current(spec, skill, blocked) or Fetch(spec.name, spec.version, spec.target)


def _active_step(
    spec: Wanted, skill: Installed, blocked: frozenset[tuple[str, str]], keep: int | None
) -> Action | None:
    """The wanted version is active: run it, prune around it, or roll back from it."""
    if skill.running:
        return Prune(spec.name, keep) if keep is not None and len(skill.versions) > keep else None
    if (spec.name, spec.version) not in blocked:
        return Start(spec.name, spec.version, spec.config)
    if skill.previous is not None and (spec.name, skill.previous) not in blocked:
        return Rollback(spec.name, spec.version)
    return None


def _keep_current(
    spec: Wanted, skill: Installed | None, blocked: frozenset[tuple[str, str]]
) -> Action | None:
    """While the wanted version may not be tried, keep the active one running."""
    if skill is None or skill.current is None or skill.running:
        return None
    if (spec.name, skill.current) in blocked:
        return None
    return Start(spec.name, skill.current, spec.config)
