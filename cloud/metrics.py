"""The hub's Prometheus endpoint.

The collector reads the hub core's counters and the fleet size at scrape
time, so the message path pays nothing for metrics. Every endpoint has its
own registry: several hubs in one process (as in tests) never share series.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import case, func, select
from sqlalchemy.exc import SQLAlchemyError

from cloud.errors import TransportError, ValidationError
from cloud.hubcore import HubCore
from cloud.store import Store
from cloud.store.schema import devices

__all__ = ["HubCollector", "MetricsServer", "parse_bind", "start_hub_metrics"]

log = logging.getLogger(__name__)

#: Most label values exported per counter; reasons and kinds are the hub's own
#: words, so this only guards against a bug turning them into unbounded series.
MAX_SERIES = 64


def parse_bind(bind: str) -> tuple[str, int]:
    """Split ``HOST:PORT`` (``[::1]:PORT`` for IPv6) into its parts; port 0 picks a free one.

    Raises:
        ValidationError: no port, a port outside 0..65535, or no host.
    """
    host, sep, port_text = bind.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise ValidationError(f"bad metrics address {bind!r}; expected HOST:PORT")
    return host, int(port_text)


class HubCollector:
    """Reads a :class:`HubCore`'s counters and the store's fleet size at each scrape."""

    def __init__(self, core: HubCore, store: Store) -> None:
        self.core = core
        self.store = store

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
        yield from self._fleet()

    def _fleet(self) -> Iterator[GaugeMetricFamily]:
        query = select(
            func.count(), func.coalesce(func.sum(case((devices.c.online, 1), else_=0)), 0)
        )
        try:
            with self.store.engine.connect() as conn:
                known, online = conn.execute(query).one()
        except SQLAlchemyError as exc:
            # A scrape must not fail because the store is briefly away; the gauges go missing.
            log.warning("metrics: cannot count devices: %s", exc)
            return
        yield GaugeMetricFamily("edgeskill_hub_devices", "Devices known.", value=int(known))
        yield GaugeMetricFamily(
            "edgeskill_hub_devices_online", "Devices marked online.", value=int(online)
        )


def _counter(name: str, doc: str, label: str, counts: dict[str, int]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=[label])
    # dict() copies in one step under the GIL, so the event loop may keep counting meanwhile.
    for key, value in sorted(dict(counts).items())[:MAX_SERIES]:
        family.add_metric([key], value)
    return family


class MetricsServer:
    """A Prometheus text endpoint on its own thread, over one registry.

    Raises:
        ValidationError: a malformed ``bind``.
        TransportError: the address cannot be bound.
    """

    def __init__(self, registry: CollectorRegistry, bind: str) -> None:
        host, port = parse_bind(bind)
        try:
            self._server, self._thread = start_http_server(port, host, registry=registry)
        except OSError as exc:
            raise TransportError(f"cannot serve metrics on {bind}: {exc}") from exc

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


def start_hub_metrics(core: HubCore, store: Store, bind: str) -> MetricsServer:
    """Serve ``core``'s and ``store``'s metrics on ``bind`` (``HOST:PORT``).

    Raises:
        ValidationError: a malformed ``bind``.
        TransportError: the address cannot be bound.
    """
    registry = CollectorRegistry()
    collector: Collector = HubCollector(core, store)
    registry.register(collector)
    return MetricsServer(registry, bind)
