"""The leader's metering loop: folds new telemetry into daily usage every few seconds.

Only the leader folds (the hub registers it ``leader_only``); should two
processes fold at once they take turns on the cursor row, and a fold that
fails leaves nothing behind (see :mod:`cloud.store.metering`), so the
restarted loop counts every window exactly once.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from cloud.loops import LoopFactory, periodic
from cloud.store import Store
from cloud.store.metering import MeteringTables

__all__ = ["METERING_TICK_S", "MeteringLoop"]

log = logging.getLogger(__name__)

#: How often the leader folds new telemetry.
METERING_TICK_S: Final = 5.0
#: Telemetry rows one fold transaction takes at most. The database sums them, and the
#: transaction writes a row per device, skill, version and day among them: the windows
#: of a thousand devices sending for five seconds fold in one transaction of a
#: thousand rows, where batches of 5,000 windows took eight, of a thousand rows each.
_BATCH: Final = 50_000


class MeteringLoop:
    """Folds telemetry of ``store`` into ``usage_daily`` each tick."""

    def __init__(self, store: Store, *, tick_s: float = METERING_TICK_S) -> None:
        """Fold the telemetry of ``store`` every ``tick_s`` seconds."""
        self._tables = MeteringTables(store.engine)
        self._tick_s = tick_s

    def fold_once(self) -> int:
        """Fold everything up to the current horizon; how many rows.

        Raises:
            StoreError: The store failed (batches folded before stay folded).
        """
        return self._tables.fold_usage(_BATCH)

    async def step(self) -> None:
        """One tick: fold in a worker thread (the store blocks)."""
        folded = await asyncio.to_thread(self.fold_once)
        if folded:
            log.debug("metering folded %d telemetry windows", folded)

    def factory(self) -> LoopFactory:
        """The loop for :meth:`cloud.loops.LoopHost.add` (``leader_only=True``)."""
        return periodic(self.step, self._tick_s, first_now=True)
