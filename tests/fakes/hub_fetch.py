"""The agent's view of a hub for trust tests: reads a TrustRepository on disk.

It records every path asked for, and ``override`` lets a test serve other bytes
for a path (a replayed, frozen or forged file) as a hostile mirror would.
"""

from __future__ import annotations

from skills.errors import FetchError, TrustError
from skills.trust import TrustRepository


class HubFetch:
    """The agent's view of the hub: reads the repository, records every path asked for."""

    def __init__(self, repo: TrustRepository) -> None:
        self.repo = repo
        self.calls: list[str] = []
        self.override: dict[str, bytes] = {}

    def __call__(self, path: str, cap: int) -> bytes:
        self.calls.append(path)
        if path in self.override:
            return self.override[path]
        try:
            return self.repo.read(path, cap)
        except TrustError as exc:
            raise FetchError(str(exc)) from exc

    def target_calls(self) -> list[str]:
        return [c for c in self.calls if c.startswith("targets/")]
