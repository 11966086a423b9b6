"""The hub's Prometheus endpoint.

The collector reads the hub core's counters and the fleet size at scrape
time, so the message path pays nothing for metrics. Every endpoint has its
own registry: several hubs in one process (as in tests) never share series.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from cloud.errors import StoreError, TransportError, ValidationError
from cloud.hubcore import HubCore
from cloud.loops import LoopHost
from cloud.store import Store
from protos.envelope import now_ms
from protos.metrics_server import MetricsBindError, MetricsServer, start_metrics_server

__all__ = ["HubCollector", "MetricsServer", "start_hub_metrics"]

log = logging.getLogger(__name__)

#: Most label values exported per counter; reasons and kinds are the hub's own
#: words, so this only guards against a bug turning them into unbounded series.
MAX_SERIES = 64


class HubCollector:
    """Reads a :class:`HubCore`'s counters, the store's fleet size and the loops at each scrape."""

    def __init__(
        self,
        core: HubCore,
        store: Store,
        loops: LoopHost | None = None,
        *,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self.core = core
        self.store = store
        self.loops = loops
        #: Wall-clock milliseconds: presence is judged at scrape time.
        self.clock = clock

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        """Yield the hub's metric families (called by the registry on each scrape)."""
        yield _counter(
            "edgeskill_hub_messages", "Device messages handled, by kind.", "kind", self.core.handled
        )
        yield _counter(
            "edgeskill_hub_dropped",
            "Device messages the hub refused, by reason.",
            "reason",
            self.core.dropped,
        )
        events = CounterMetricFamily(
            "edgeskill_hub_device_security_events",
            "Refusals and containments devices reported, by kind and reason.",
            labels=["kind", "reason"],
        )
        for (kind, reason), count in sorted(dict(self.core.security_events).items())[:MAX_SERIES]:
            events.add_metric([kind, reason], count)
        yield events
        batcher = self.core.telemetry
        yield CounterMetricFamily(
            "edgeskill_hub_telemetry_batches",
            "Telemetry transactions committed.",
            value=batcher.batches,
        )
        yield CounterMetricFamily(
            "edgeskill_hub_telemetry_items",
            "Telemetry windows committed.",
            value=batcher.items,
        )
        if self.loops is not None:
            yield from _loop_families(self.loops)
        yield from self._fleet()

    def _fleet(self) -> Iterator[GaugeMetricFamily]:
        try:
            known, online = self.store.count_devices(now_ms=self.clock())
        except StoreError as exc:
            # A scrape must not fail because the store is briefly away; the gauges go missing.
            log.warning("metrics: cannot count devices: %s", exc)
            return
        yield GaugeMetricFamily("edgeskill_hub_devices", "Devices known.", value=known)
        yield GaugeMetricFamily(
            "edgeskill_hub_devices_online",
            "Devices online: connected, and heard from within two heartbeat intervals.",
            value=online,
        )


def _loop_families(host: LoopHost) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
    yield GaugeMetricFamily(
        "edgeskill_hub_leader",
        "1 while this hub process is the leader and runs the leader-only loops.",
        value=int(host.is_leader),
    )
    states = host.states()
    running = GaugeMetricFamily(
        "edgeskill_hub_loop_running", "1 while a control loop runs, by loop.", labels=["loop"]
    )
    restarts = CounterMetricFamily(
        "edgeskill_hub_loop_restarts",
        "Control loops restarted after a failure, by loop.",
        labels=["loop"],
    )
    for state in states:
        running.add_metric([state.name], int(state.running))
        restarts.add_metric([state.name], state.restarts)
    yield running
    yield restarts


def _counter(name: str, doc: str, label: str, counts: dict[str, int]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=[label])
    # dict() copies in one step under the GIL, so the event loop may keep counting meanwhile.
    for key, value in sorted(dict(counts).items())[:MAX_SERIES]:
        family.add_metric([key], value)
    return family


def start_hub_metrics(
    core: HubCore, store: Store, bind: str, loops: LoopHost | None = None
) -> MetricsServer:
    """Serve ``core``'s, ``store``'s and ``loops``' metrics on ``bind`` (``HOST:PORT``).

    Raises:
        ValidationError: a malformed ``bind``.
        TransportError: the address cannot be bound.
    """
    registry = CollectorRegistry()
    collector: Collector = HubCollector(core, store, loops)
    registry.register(collector)
    try:
        return start_metrics_server(registry, bind)
    except MetricsBindError as exc:
        raise ValidationError(str(exc)) from exc
    except OSError as exc:
        raise TransportError(f"cannot serve metrics on {bind}: {exc}") from exc
