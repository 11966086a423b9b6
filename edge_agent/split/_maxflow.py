"""A small maximum-flow / minimum-cut solver (Dinic's algorithm) on float capacities.

Written for the split planner's graphs (a few hundred vertices), pure Python, with
no dependency: the agent installs without networkx. Capacities may be
``math.inf`` (edges that must never be cut).
"""

from __future__ import annotations

import math
from collections import deque

__all__ = ["FlowNetwork"]

#: Residual capacities at or below this count as saturated (the costs are ms).
EPSILON = 1e-9


class FlowNetwork:
    """A directed network with capacities; :meth:`min_cut` finds a minimum s-t cut.

    Args:
        size: The number of vertices, numbered ``0 .. size - 1``.

    Raises:
        ValueError: ``size`` is below 2.
    """

    def __init__(self, size: int) -> None:
        if size < 2:
            raise ValueError(f"a flow network needs at least 2 vertices, got {size}")
        self._size = size
        self._adjacent: list[list[int]] = [[] for _ in range(size)]
        # Edge i and its reverse i ^ 1 sit side by side.
        self._head: list[int] = []
        self._residual: list[float] = []

    def add_edge(self, tail: int, head: int, capacity: float) -> None:
        """Add an edge ``tail -> head``; zero-capacity edges are skipped.

        Raises:
            ValueError: a vertex is out of range or the capacity is negative or NaN.
        """
        if not (0 <= tail < self._size and 0 <= head < self._size):
            raise ValueError(f"edge {tail}->{head} is outside 0..{self._size - 1}")
        if not capacity >= 0:
            raise ValueError(f"capacity must be >= 0, got {capacity!r}")
        if capacity == 0 or tail == head:
            return
        self._adjacent[tail].append(len(self._head))
        self._head.append(head)
        self._residual.append(capacity)
        self._adjacent[head].append(len(self._head))
        self._head.append(tail)
        self._residual.append(0.0)

    def min_cut(self, source: int, sink: int) -> tuple[float, frozenset[int]]:
        """The value of a minimum ``source``-``sink`` cut and its source side.

        Runs once: the network keeps its flow afterwards.

        Returns:
            ``(value, source_side)``; the value is ``math.inf`` when every cut must
            cross an infinite edge.

        Raises:
            ValueError: ``source`` equals ``sink``.
        """
        if source == sink:
            raise ValueError("source and sink must differ")
        total = 0.0
        while (level := self._levels(source, sink)) is not None:
            pushed = self._blocking_flow(source, sink, level)
            if math.isinf(pushed):
                return math.inf, self._reachable(source)
            if pushed <= EPSILON:
                break
            total += pushed
        return total, self._reachable(source)

    def _levels(self, source: int, sink: int) -> list[int] | None:
        """BFS levels from ``source`` over the residual graph; ``None`` if ``sink`` is cut off."""
        adjacent, heads, residual = self._adjacent, self._head, self._residual
        level = [-1] * self._size
        level[source] = 0
        queue = deque([source])
        while queue:
            vertex = queue.popleft()
            if level[sink] >= 0 and level[vertex] >= level[sink]:
                break  # vertices this far out cannot be on a shortest path
            following = level[vertex] + 1
            for edge in adjacent[vertex]:
                head = heads[edge]
                if level[head] < 0 and residual[edge] > EPSILON:
                    level[head] = following
                    queue.append(head)
        return level if level[sink] >= 0 else None

    def _blocking_flow(self, source: int, sink: int, level: list[int]) -> float:
        """Saturate every shortest augmenting path of this phase; the flow pushed.

        An iterative DFS that, after each augmentation, backs up only to the first
        saturated edge of its path instead of starting over from ``source``.
        """
        adjacent, heads, residual = self._adjacent, self._head, self._residual
        cursor = [0] * self._size
        path: list[int] = []
        vertex, total = source, 0.0
        while True:
            if vertex == sink:
                amount = min(residual[edge] for edge in path)
                if math.isinf(amount):
                    return amount
                for edge in path:
                    residual[edge] -= amount
                    residual[edge ^ 1] += amount
                total += amount
                cut = next(i for i, edge in enumerate(path) if residual[edge] <= EPSILON)
                vertex = heads[path[cut] ^ 1]
                del path[cut:]
                continue
            edges, position, wanted = adjacent[vertex], cursor[vertex], level[vertex] + 1
            end = len(edges)
            while position < end:
                edge = edges[position]
                if residual[edge] > EPSILON and level[heads[edge]] == wanted:
                    break
                position += 1
            cursor[vertex] = position
            if position < end:
                path.append(edges[position])
                vertex = heads[edges[position]]
                continue
            if not path:
                return total
            level[vertex] = -1  # a dead end for the rest of this phase
            vertex = heads[path.pop() ^ 1]
            cursor[vertex] += 1

    def _reachable(self, source: int) -> frozenset[int]:
        """The vertices reachable from ``source`` through unsaturated edges."""
        seen = {source}
        queue = deque([source])
        while queue:
            vertex = queue.popleft()
            for edge in self._adjacent[vertex]:
                head = self._head[edge]
                if head not in seen and self._residual[edge] > EPSILON:
                    seen.add(head)
                    queue.append(head)
        return frozenset(seen)
