"""Telemetry summaries: what each skill on each device did, summed."""

from __future__ import annotations

from cloud.service.views import TelemetrySummaryView, TelemetryWindowView
from cloud.store import Store

__all__ = ["TelemetryService"]


class TelemetryService:
    """Read-only summaries of the telemetry devices sent."""

    def __init__(self, store: Store) -> None:
        """Summarise what ``store`` holds."""
        self._store = store

    def summary(self) -> list[TelemetrySummaryView]:
        """Telemetry per device and skill, sorted by device then skill.

        Raises:
            StoreError: The store failed.
        """
        return self._store.telemetry_summary()

    def inferences_by_device(self) -> dict[str, int]:
        """How many inferences each device reported, over all its skills.

        Raises:
            StoreError: The store failed.
        """
        totals: dict[str, int] = {}
        for s in self._store.telemetry_summary():
            totals[s.device_id] = totals.get(s.device_id, 0) + s.inferences
        return totals

    def windows(
        self, device_id: str | None = None, skill: str | None = None, *, limit: int = 10_000
    ) -> list[TelemetryWindowView]:
        """The latest ``limit`` telemetry windows (of a device and/or skill), oldest first.

        Each window carries its metrics map: split inference's paths, fallbacks and
        the agent's current cut among them.

        Raises:
            ValidationError: ``limit`` is not in 1..100000.
            StoreError: The store failed.
        """
        return self._store.telemetry_for(device_id, skill, limit=limit)
