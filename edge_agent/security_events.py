"""Security events the agent reports: counted at once, sent up coalesced.

Every refusal (a forged desired state, a stale hub, a contained skill) is
counted by kind and reason for the agent's metrics, and reported to the hub as
a ``security_event``. A flood (a broker replaying a message thousands of times)
becomes one event per kind and reason per window, with a count.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from protos import pb

__all__ = ["MAX_KINDS", "SecurityEvents"]

#: Most (kind, reason) pairs counted apart; more are counted as ("other", "other").
MAX_KINDS = 64
_MAX_DETAIL = 500
_MAX_SUBJECT = 200
_MAX_WORD = 64


@dataclass
class _Pending:
    count: int
    detail: str
    subject: str


class SecurityEvents:
    """Counts security events and coalesces them until they are drained."""

    def __init__(self) -> None:
        #: Occurrences since the agent started, by (kind, reason).
        self.totals: Counter[tuple[str, str]] = Counter()
        self._pending: dict[tuple[str, str], _Pending] = {}

    def record(self, kind: str, reason: str, detail: str = "", subject: str = "") -> None:
        """Count one occurrence; the latest detail and subject of a pair are kept."""
        key = (kind[:_MAX_WORD] or "unknown", reason[:_MAX_WORD] or "unknown")
        if key not in self.totals and len(self.totals) >= MAX_KINDS:
            key = ("other", "other")
        self.totals[key] += 1
        pending = self._pending.get(key)
        if pending is None:
            self._pending[key] = _Pending(1, detail[:_MAX_DETAIL], subject[:_MAX_SUBJECT])
        else:
            pending.count += 1
            pending.detail, pending.subject = detail[:_MAX_DETAIL], subject[:_MAX_SUBJECT]

    def __bool__(self) -> bool:
        return bool(self._pending)

    def drain(self) -> list[pb.SecurityEvent]:
        """The events recorded since the last drain, one per (kind, reason), with counts."""
        pending, self._pending = self._pending, {}
        return [
            pb.SecurityEvent(
                kind=kind, reason=reason, detail=p.detail, count=p.count, subject=p.subject
            )
            for (kind, reason), p in sorted(pending.items())
        ]
