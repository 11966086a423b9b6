"""The blocking steps of an install, run back to back on one worker thread.

:class:`edge_agent.reconciler.Reconciler` decides on the event loop what to do
and books the outcome; the functions here are what a worker thread runs for
it. Steps that follow one another (fetch and unpack; stop, start and switch)
share one thread: thousands of agents share a simulator's event loop, where a
hop costs more than most of the steps it would carry. Each run scans the
installs again before it returns, so the next pass finds the inventory cached
instead of hopping to a thread for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from edge_agent.errors import HealthCheckError, InstallError, SandboxError
from edge_agent.installs import InstallStore
from edge_agent.planner import Activate, Fetch
from edge_agent.sandbox import SkillProcess
from edge_agent.sandbox.launcher import SkillLauncher
from skills.errors import SkillError

__all__ = ["START_ERRORS", "Switch", "fetch_and_unpack", "off_loop", "rescan", "switch"]

_T = TypeVar("_T")

#: What a start that fails its health check raises: the version is unhealthy, not missing.
START_ERRORS = (HealthCheckError, SandboxError, SkillError)


@dataclass(frozen=True)
class Switch:
    """How an activation's thread ended: one of the three set, or none if cancelled."""

    proc: SkillProcess | None = None
    unhealthy: Exception | None = None
    not_switched: InstallError | None = None


async def off_loop(step: Callable[[threading.Event], _T]) -> _T:
    """Run blocking steps back to back on one worker thread: one hop instead of one each.

    ``step`` is handed an event set when the awaiting task is cancelled, and checks
    it between its steps, so a cancelled task's later steps are not run, as when
    each step was a hop of its own.

    Returns:
        What ``step`` returned.

    Raises:
        asyncio.CancelledError: The awaiting task was cancelled; the thread runs on
            until ``step`` returns.
    """
    cancelled = threading.Event()
    try:
        return await asyncio.to_thread(step, cancelled)
    except asyncio.CancelledError:
        cancelled.set()
        raise


def fetch_and_unpack(
    installs: InstallStore,
    fetch_target: Callable[[str], Path],
    action: Fetch,
    cancelled: threading.Event,
) -> None:
    """Fetch and verify the bundle, then unpack it (skipped if ``cancelled`` meanwhile).

    Raises:
        SkillError: The fetch or its verification failed.
        InstallError: The bundle cannot be unpacked.
    """
    bundle = fetch_target(action.target)
    if cancelled.is_set():
        return  # the task was cancelled during the fetch: unpack nothing, as before
    installs.unpack(action.name, action.version, bundle)
    rescan(installs)


def switch(
    installs: InstallStore,
    launcher: SkillLauncher,
    old: SkillProcess | None,
    action: Activate,
    cancelled: threading.Event,
) -> Switch:
    """Stop ``old``, start the version from its folder, and make it ``current``.

    Returns:
        The started process, or why the version is unhealthy or was not switched to;
        an empty :class:`Switch` if ``cancelled`` was set while it started.

    Raises:
        InstallError: The version is not installed (other than by failing its start).
    """
    if old is not None:
        old.stop()
    name, version = action.name, action.version
    try:
        proc = launcher(installs.version_dir(name, version), dict(action.config))
    except START_ERRORS as exc:
        return Switch(unhealthy=exc)
    if cancelled.is_set():  # nobody would keep or stop it: stop it, switch nothing
        proc.stop()
        return Switch()
    try:
        installs.activate(name, version)
    except InstallError as exc:
        proc.stop()
        return Switch(not_switched=exc)
    finally:
        rescan(installs)
    return Switch(proc)


def rescan(installs: InstallStore) -> None:
    """Scan the installs while still on the worker thread of a change.

    The next pass then finds the inventory cached instead of hopping to a
    thread for it; an error is left for that pass to meet and raise.
    """
    with contextlib.suppress(InstallError):
        installs.inventory()
