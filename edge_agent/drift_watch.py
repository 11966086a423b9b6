"""Drift statistics of the running skill versions, one summary per telemetry window.

A skill version whose bundle ships a drift reference (the manifest's
``[drift]`` table, :mod:`skills.drift_spec`) gets a
:class:`~edge_agent.drift.DriftMonitor` when it starts. Every result the agent
gets from it feeds the monitor: the predicted class (``label``), its
confidence (``confidence``), the declared input summaries (``summaries``) and
the item's true label where the source knows it. At each telemetry window the
agent takes the window's summary as metrics (``drift.*``, see
:meth:`~edge_agent.drift.DriftSummary.to_metrics`) into that window's
telemetry, which goes up through the durable outbox like the rest of it.

The sequential detectors (ADWIN on the confidence, the accuracy monitor) run
across windows for as long as the version runs; a window's summary says which
fired in it. A stopped version's last partial window is kept for the next
telemetry window, so stopping or upgrading a skill loses none of it.

A reference that does not load (missing, malformed, over a cap: the bundle
publisher's fault) is logged once per version, and the skill runs on without
drift statistics. A result the monitor cannot use (a class that is neither a
string nor an integer, a confidence that is not a finite number) is skipped
and logged once per version.

The inputs themselves (a capped sample of the least sure ones, opt-in per
deployment) go up beside these metrics, from :mod:`edge_agent.drift_samples`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skills.drift_spec import read_reference
from skills.errors import DriftReferenceError

if TYPE_CHECKING:
    from edge_agent.drift import DriftMonitor, DriftSummary
    from skills.manifest import Manifest

__all__ = ["DRIFT_PREFIX", "DriftWatch"]

log = logging.getLogger(__name__)

#: Every drift metric in a telemetry window starts with this.
DRIFT_PREFIX = "drift."

#: A running skill version: ``(name, version)``.
Key = tuple[str, str]


class DriftWatch:
    """The drift monitors of the skill versions an agent runs.

    Call it on the agent's event loop only; nothing here blocks but
    :meth:`attach`, which reads a reference of at most 1 MiB.

    Args:
        clock: Seconds, stamped on each observation (the window's start and end).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._monitors: dict[Key, DriftMonitor] = {}
        #: Summaries waiting for the next telemetry window: a stopped version's last
        #: window, or a window that reached the monitor's cap.
        self._ready: dict[Key, DriftSummary] = {}
        #: Versions already logged as unusable (reference) or misbehaving (results).
        self._logged: set[tuple[Key, str]] = set()

    def watching(self, name: str, version: str) -> bool:
        """Whether that version's results feed a drift monitor."""
        return (name, version) in self._monitors

    def attach(self, name: str, version: str, skill_dir: Path, manifest: Manifest) -> None:
        """Start watching a started skill version, if its bundle ships a usable reference.

        Starting the same version again keeps its monitor (and its detectors' state).
        """
        key = (name, version)
        if key in self._monitors or manifest.drift is None:
            return
        try:
            reference = read_reference(skill_dir, manifest.drift)
        except DriftReferenceError as exc:
            self._log_once(key, "reference", "runs without drift statistics: %s", exc)
            return
        from edge_agent.drift import MAX_WINDOW, DriftMonitor  # noqa: PLC0415 - numpy: a skill runs

        self._monitors[key] = DriftMonitor(name, version, reference, window_size=MAX_WINDOW)

    def detach(self, name: str) -> None:
        """Stop watching every version of a stopped skill; their last windows are kept."""
        for key in [k for k in self._monitors if k[0] == name]:
            summary = self._monitors.pop(key).flush()
            if summary is not None:  # behind a capped window, the rest of it is lost
                self._ready.setdefault(key, summary)

    def observe(self, key: Key, result: object, label: int | None) -> None:
        """Feed one result of a skill version (ignored when that version is not watched).

        Args:
            key: The version.
            result: What its control code returned for the item.
            label: The item's true class, when the source knows it.
        """
        monitor = self._monitors.get(key)
        if monitor is None or not isinstance(result, Mapping):
            return
        if "label" not in result or "confidence" not in result:
            return
        try:
            summary = monitor.observe(
                result["label"],
                result["confidence"],
                at=self._clock(),
                inputs=_declared(result.get("summaries"), monitor),
                label=label,
            )
        except ValueError as exc:
            self._log_once(key, "results", "returns results drift cannot use: %s", exc)
            return
        if summary is not None:  # MAX_WINDOW results in one telemetry window
            self._ready.setdefault(key, summary)

    def flush_all(self) -> dict[Key, dict[str, float]]:
        """Close every watched version's window: its drift metrics, by version.

        A version with nothing observed since the last call is left out.
        """
        ready, self._ready = self._ready, {}
        for key, monitor in self._monitors.items():
            # After a window that reached the cap, what came since waits for the next one.
            summary = None if key in ready else monitor.flush()
            if summary is not None:
                ready[key] = summary
        return {key: summary.to_metrics(DRIFT_PREFIX) for key, summary in ready.items()}

    def _log_once(self, key: Key, what: str, message: str, detail: object) -> None:
        if (key, what) not in self._logged:
            self._logged.add((key, what))
            log.warning("skill %s %s " + message, key[0], key[1], detail)


def _declared(summaries: Any, monitor: DriftMonitor) -> dict[str, Any] | None:
    """The input summaries of a result that the version's reference declares."""
    if not isinstance(summaries, Mapping):
        return None
    names = {item.name for item in monitor.reference.inputs}
    return {name: value for name, value in summaries.items() if name in names}
