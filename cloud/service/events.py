"""The hub's event log for people: what happened, newest last, and following it."""

from __future__ import annotations

from cloud.errors import ValidationError
from cloud.service.views import EventView
from cloud.store import Store
from cloud.store.events import (
    EVENT_DEPLOYMENT,
    EVENT_DEVICE,
    EVENT_DRIFT,
    EVENT_SECURITY,
    EVENT_SKILL,
)

__all__ = ["EVENT_KINDS", "EventService"]

#: The kinds of events the hub records.
EVENT_KINDS = (EVENT_DEPLOYMENT, EVENT_DEVICE, EVENT_DRIFT, EVENT_SECURITY, EVENT_SKILL)


class EventService:
    """Reading the hub's event log."""

    def __init__(self, store: Store) -> None:
        """Read events from ``store``."""
        self._store = store

    def recent(
        self,
        *,
        device_id: str | None = None,
        kind: str | None = None,
        limit: int = 50,
    ) -> list[EventView]:
        """The newest ``limit`` events (of one device and/or kind), oldest first.

        Raises:
            ValidationError: An unknown kind, or ``limit`` outside 1..10000.
            StoreError: The store failed.
        """
        _check_kind(kind)
        return self._store.events(device_id=device_id, kind=kind, limit=limit)

    def after(
        self,
        last_id: int,
        *,
        device_id: str | None = None,
        kind: str | None = None,
        limit: int = 1000,
    ) -> list[EventView]:
        """Events newer than ``last_id``, oldest first: the next page when following the log.

        Raises:
            ValidationError: An unknown kind, a negative id, or ``limit`` outside 1..10000.
            StoreError: The store failed.
        """
        _check_kind(kind)
        return self._store.events(device_id=device_id, kind=kind, after_id=last_id, limit=limit)


def _check_kind(kind: str | None) -> None:
    if kind is not None and kind not in EVENT_KINDS:
        raise ValidationError(f"unknown event kind {kind!r}; known: {', '.join(EVENT_KINDS)}")
