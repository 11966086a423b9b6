"""The agent's Prometheus endpoint.

The collector reads the agent's state at scrape time (outbox size, skill
states, the hub session); the agent itself only keeps running counters.
Every endpoint has its own registry, so several agents in one process (as in
tests) never share series.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from edge_agent.errors import AgentError, OutboxError

if TYPE_CHECKING:
    from edge_agent.agent import Agent

__all__ = [
    "SKILL_STATES",
    "AgentCollector",
    "InferenceCounter",
    "MetricsServer",
    "parse_bind",
    "start_agent_metrics",
]

log = logging.getLogger(__name__)

#: States always exported (as 0 when no skill is in them), so dashboards see every series.
SKILL_STATES = ("installing", "running", "failed", "rolled_back")

#: Most (skill, version) series kept; versions come from the hub, so their number is capped.
MAX_SERIES = 256


def parse_bind(bind: str) -> tuple[str, int]:
    """Split ``HOST:PORT`` (``[::1]:PORT`` for IPv6) into its parts; port 0 picks a free one.

    Raises:
        AgentError: no port, a port outside 0..65535, or no host.
    """
    host, sep, port_text = bind.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise AgentError(f"bad metrics address {bind!r}; expected HOST:PORT")
    return host, int(port_text)


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
        yield GaugeMetricFamily(
            "edgeskill_agent_connected",
            "1 while a session with the hub is up.",
            value=int(agent.transport is not None),
        )


class MetricsServer:
    """A Prometheus text endpoint on its own thread, over one registry.

    Raises:
        AgentError: a malformed ``bind``, or the address cannot be bound.
    """

    def __init__(self, registry: CollectorRegistry, bind: str) -> None:
        host, port = parse_bind(bind)
        try:
            self._server, self._thread = start_http_server(port, host, registry=registry)
        except OSError as exc:
            raise AgentError(f"cannot serve metrics on {bind}: {exc}") from exc

    @property
    def port(self) -> int:
        """The port it listens on (the one picked when ``bind`` asked for port 0)."""
        return int(self._server.server_port)

    def stop(self) -> None:
        """Stop serving and release the port; blocks up to half a second."""
        self._server.shutdown()
        self._server.server_close()
        thread: threading.Thread = self._thread
        thread.join(5.0)


def start_agent_metrics(agent: Agent, bind: str) -> MetricsServer:
    """Serve ``agent``'s metrics on ``bind`` (``HOST:PORT``).

    Raises:
        AgentError: a malformed ``bind``, or the address cannot be bound.
    """
    registry = CollectorRegistry()
    registry.register(AgentCollector(agent))
    return MetricsServer(registry, bind)
