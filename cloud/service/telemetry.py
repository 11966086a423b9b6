"""Telemetry summaries: what each skill on each device did, summed."""

from __future__ import annotations

from cloud.service.views import TelemetrySummaryView
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
