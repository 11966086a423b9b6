"""Split inference on the device: where to cut a model, and what the link looks like.

Everything here is pure (no I/O, no asyncio, no clock: time is an argument), so
it is tested without a network:

* :mod:`edge_agent.split.planner` — a model's candidate cuts priced on a link;
  the cheapest, with hysteresis (:func:`plan`);
* :mod:`edge_agent.split.graph` — DAG cost graphs: candidate cuts priced from
  them, and the exact optimum over every partition by a min-cut (:func:`optimum`);
* :mod:`edge_agent.split.link` — the link's RTT and bandwidth, estimated from the
  agent's real requests (:class:`LinkEstimator`).
"""

from edge_agent.split.graph import (
    CostGraph,
    Node,
    Partition,
    Tensor,
    cut_cost,
    head_for_cut,
    is_downward_closed,
    optimum,
    table_from_graph,
)
from edge_agent.split.link import LinkConfig, LinkEstimator
from edge_agent.split.planner import (
    DEFAULT_HYSTERESIS,
    CostTable,
    CutCost,
    Decision,
    Estimate,
    Hysteresis,
    LinkEstimate,
    estimate,
    plan,
    slow_down,
)

__all__ = [
    "DEFAULT_HYSTERESIS",
    "CostGraph",
    "CostTable",
    "CutCost",
    "Decision",
    "Estimate",
    "Hysteresis",
    "LinkConfig",
    "LinkEstimate",
    "LinkEstimator",
    "Node",
    "Partition",
    "Tensor",
    "cut_cost",
    "estimate",
    "head_for_cut",
    "is_downward_closed",
    "optimum",
    "plan",
    "slow_down",
    "table_from_graph",
]
