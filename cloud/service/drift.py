"""Drift: incidents the drift loop opened and drove, and each group's drift settings.

People list and show incidents and set a group's settings here; the leader's
drift loop (:mod:`cloud.drift_loop`) opens, moves and closes incidents
through the same methods, so every change is checked and logged alike.
"""

from __future__ import annotations

import builtins
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from cloud.drift.incident import IncidentState, Stage, clear
from cloud.drift.policy import CloseIncident, OpenIncident
from cloud.drift.settings import DriftSettings
from cloud.errors import StoreError, ValidationError
from cloud.store import Store, TelemetryRecord
from cloud.store.drift import StoredSample
from cloud.store.incidents import IncidentRecord

__all__ = ["DriftService", "IncidentView"]

#: A drift incident as people see it: already a frozen record, handed out as it is.
IncidentView = IncidentRecord


class DriftService:
    """Drift incidents and settings of one hub."""

    def __init__(self, store: Store, clock: Callable[[], int]) -> None:
        """Read and write drift state in ``store``; ``clock`` gives milliseconds."""
        self._store = store
        self._clock = clock

    # incidents

    def incidents(self, *, everything: bool = False) -> list[IncidentView]:
        """The open incidents (or every incident), oldest first.

        Raises:
            StoreError: The store failed or holds corrupt data.
        """
        return self._store.list_drift_incidents(everything=everything)

    def recent(self, closed_since_ms: int) -> list[IncidentView]:
        """The open incidents and those closed since ``closed_since_ms``, oldest first.

        Raises:
            StoreError: The store failed or holds corrupt data.
        """
        return self._store.list_drift_incidents(closed_since_ms=closed_since_ms)

    def show(self, incident_id: int) -> IncidentView:
        """One incident with its stages, links and detail.

        Raises:
            NotFoundError: No such incident.
            StoreError: The store failed or holds corrupt data.
        """
        return self._store.get_drift_incident(incident_id)

    def open(self, decision: OpenIncident) -> IncidentView | None:
        """Open the incident a policy decided on; None when one is open for it already.

        Raises:
            ValidationError: A malformed decision.
            StoreError: The store failed.
        """
        numbers = dataclasses.asdict(decision.numbers)
        numbers["devices"] = list(decision.devices)
        return self._store.open_drift_incident(
            decision.skill, decision.version, decision.group, decision.reason, numbers,
            now_ms=self._clock(),
        )  # fmt: skip

    def move(
        self, old: IncidentState, new: IncidentState, detail: Mapping[str, Any] | None = None
    ) -> bool:
        """Store an incident's transition from ``old``; False when it moved meanwhile.

        Raises:
            ValidationError: Detail that is not plain JSON, or a history that
                does not extend the stored one.
            NotFoundError: No such incident.
            StoreError: The store failed.
        """
        return self._store.save_drift_incident(
            new, expected=old.stage, detail=detail, now_ms=self._clock()
        )

    def close(self, decision: CloseIncident) -> bool:
        """Clear an incident whose fleet calmed down before work started.

        Returns:
            Whether it was cleared (False when it had moved on or ended).

        Raises:
            NotFoundError: No such incident.
            StoreError: The store failed.
        """
        found = self.show(decision.incident_id).state
        if found.stage is not Stage.OPEN:
            return False
        at = max(self._clock(), found.history[-1].at_ms)
        return self.move(found, clear(found, at, decision.reason))

    # settings

    def settings(self, group: str) -> DriftSettings:
        """A group's drift settings (the defaults when none were set).

        Raises:
            StoreError: The store failed or holds settings it cannot read.
        """
        return self.all_settings().get(group, DriftSettings())

    def all_settings(self) -> dict[str, DriftSettings]:
        """Every group's stored drift settings, by group.

        Raises:
            StoreError: The store failed or holds settings it cannot read.
        """
        out = {}
        for group, data in self._store.drift_settings().items():
            try:
                out[group] = DriftSettings.from_dict(data)
            except ValidationError as exc:
                raise StoreError(f"drift settings of group {group} are corrupt: {exc}") from exc
        return out

    def set_settings(self, group: str, **changes: Any) -> DriftSettings:
        """Change some of a group's drift settings; the rest keep their values.

        Raises:
            ValidationError: An unknown setting or a bad value.
            NotFoundError: No such group.
            StoreError: The store failed.
        """
        chosen = self.settings(group).with_changes(changes)
        self._store.set_drift_settings(group, chosen.to_dict(), now_ms=self._clock())
        return chosen

    # what the loop reads

    def windows(self, since_ms: int) -> builtins.list[TelemetryRecord]:
        """Telemetry windows with drift metrics that ended at or after ``since_ms``.

        Raises:
            StoreError: The store failed or holds corrupt data.
        """
        return self._store.drift_windows(since_ms)

    def samples(self, skill: str, version: str) -> builtins.list[StoredSample]:
        """The stored drift samples of a skill version, oldest first.

        Raises:
            StoreError: The store failed.
        """
        return self._store.drift_samples(skill, version)
