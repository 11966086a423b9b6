"""A store that fails on demand: the real store, with chosen methods raising StoreError."""

from __future__ import annotations

from typing import Any

from cloud.errors import StoreError
from cloud.store import Store


class FailingStore:
    """Delegates to ``store``; every method named in ``failing`` raises StoreError instead.

    Typed as ``Any`` where the hub expects a :class:`Store`.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self.failing: set[str] = set()
        #: Calls refused so far, by method name.
        self.refused: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.store, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            if name in self.failing:
                self.refused[name] = self.refused.get(name, 0) + 1
                raise StoreError(f"{name} failed (injected)")
            return attr(*args, **kwargs)

        return call
