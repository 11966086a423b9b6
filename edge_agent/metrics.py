"""The agent's Prometheus endpoint.

The collector reads the agent's state at scrape time (outbox size, skill
states, the hub session); the agent itself only keeps running counters.
Every endpoint has its own registry, so several agents in one process (as in
tests) never share series.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

from edge_agent.errors import AgentError, OutboxError
from protos.metrics_server import MetricsBindError, MetricsServer, start_metrics_server

if TYPE_CHECKING:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    from edge_agent.agent import Agent

__all__ = [
    "SKILL_STATES",
    "AgentCollector",
    "InferenceCounter",
    "MetricsServer",
    "start_agent_metrics",
]

log = logging.getLogger(__name__)

#: States always exported (as 0 when no skill is in them), so dashboards see every series.
SKILL_STATES = ("installing", "running", "failed", "rolled_back")

#: Most (skill, version) series kept; versions come from the hub, so their number is capped.
MAX_SERIES = 256


class InferenceCounter:
    """Inferences since the agent started, per skill version, for up to ``MAX_SERIES`` versions."""

    def __init__(self) -> None:
        self._counts: Counter[tuple[str, str]] = Counter()

    def add(self, skill: str, version: str, n: int = 1) -> None:
        """Count ``n`` inferences; a version beyond the cap is not counted."""
        key = (skill, version)
        if key in self._counts or len(self._counts) < MAX_SERIES:
            self._counts[key] += n

    def snapshot(self) -> dict[tuple[str, str], int]:
        """A copy of the counts, safe to take from another thread."""
        # dict() copies in one step under the GIL, so the event loop may keep counting meanwhile.
        return dict(self._counts)


class AgentCollector:
    """Reads one :class:`~edge_agent.agent.Agent` at each scrape."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        """Yield the agent's metric families (called by the registry on each scrape)."""
        # Scraped only when the endpoint runs, and then prometheus_client is loaded.
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily  # noqa: PLC0415

        agent = self.agent
        try:
            pending = len(agent.outbox)
        except OutboxError as exc:
            # The other series still help while the outbox is failing; this one goes missing.
            log.warning("metrics: cannot read the outbox: %s", exc)
        else:
            yield GaugeMetricFamily(
                "edgeskill_agent_outbox_pending",
                "Messages waiting in the outbox for the hub's acknowledgement.",
                value=pending,
            )
        yield CounterMetricFamily(
            "edgeskill_agent_outbox_dropped",
            "Outbox entries dropped over its caps, counted as telemetry reports them.",
            value=agent.outbox_dropped_total,
        )
        states = GaugeMetricFamily(
            "edgeskill_agent_skills", "Skills by reconcile state.", labels=["state"]
        )
        # tuple() copies in one step under the GIL while the reconciler may be changing states.
        by_state = Counter(s.state for s in tuple(agent.reconciler.states.values()))
        for state in sorted(set(SKILL_STATES) | set(by_state)):
            states.add_metric([state], by_state[state])
        yield states
        inferences = CounterMetricFamily(
            "edgeskill_agent_inferences",
            "Inferences run since the agent started.",
            labels=["skill", "version"],
        )
        for (skill, version), count in sorted(agent.inference_counts.snapshot().items()):
            inferences.add_metric([skill, version], count)
        yield inferences
        events = CounterMetricFamily(
            "edgeskill_agent_security_events",
            "Refusals and containments (forged desired state, stale hub, ...), by kind and reason.",
            labels=["kind", "reason"],
        )
        for (kind, reason), count in sorted(dict(agent.security.totals).items()):
            events.add_metric([kind, reason], count)
        yield events
        yield GaugeMetricFamily(
            "edgeskill_agent_connected",
            "1 while a session with the hub is up.",
            value=int(agent.transport is not None),
        )


def start_agent_metrics(agent: Agent, bind: str) -> MetricsServer:
    """Serve ``agent``'s metrics on ``bind`` (``HOST:PORT``).

    Raises:
        AgentError: a malformed ``bind``, or the address cannot be bound.
    """
    # Without --metrics-bind the agent never loads prometheus_client (a few MB).
    from prometheus_client import CollectorRegistry  # noqa: PLC0415

    registry = CollectorRegistry()
    registry.register(AgentCollector(agent))
    try:
        return start_metrics_server(registry, bind)
    except MetricsBindError as exc:
        raise AgentError(str(exc)) from exc
    except OSError as exc:
        raise AgentError(f"cannot serve metrics on {bind}: {exc}") from exc
