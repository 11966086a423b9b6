"""The hub's home folder: configuration, the registry store and the TUF repository.

A hub home holds ``hub.toml``, ``trust/`` (keys and signed metadata) and, with
the embedded default store, ``hub.db``. Every hub process and CLI command
opens the same home, so several can run side by side.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tomllib
from dataclasses import dataclass
from pathlib import Path

import tomli_w

from cloud.errors import HubError, ValidationError
from cloud.grpc_server import ServerTls, start_grpc_server
from cloud.hubcore import HubCore
from cloud.leader import Election, open_election
from cloud.loops import LoopHost, periodic
from cloud.metrics import start_hub_metrics
from cloud.store import Store, open_store
from skills.trust import TrustRepository

log = logging.getLogger(__name__)

CONFIG_FILE = "hub.toml"
#: How often the leader re-signs the TUF timestamp, which expires within a day.
TIMESTAMP_REFRESH_S = 3600.0


@dataclass(frozen=True)
class TlsFiles:
    """Where the hub's mTLS material lives: its certificate and key, and the devices' CA."""

    cert: Path
    key: Path
    client_ca: Path

    def resolve(self, home: Path) -> TlsFiles:
        """The same files with relative paths taken from ``home``."""
        return TlsFiles(home / self.cert, home / self.key, home / self.client_ca)

    def load(self) -> ServerTls:
        """Read the PEM files.

        Raises:
            TransportError: a file is missing, unreadable or too large.
        """
        return ServerTls.from_files(self.cert, self.key, self.client_ca)


def tls_files(cert: Path | None, key: Path | None, client_ca: Path | None) -> TlsFiles | None:
    """Group the three TLS settings: all of them (mTLS on) or none (plain gRPC).

    Raises:
        ValidationError: only some of the three are set.
    """
    given = [p for p in (cert, key, client_ca) if p is not None]
    if not given:
        return None
    if cert is None or key is None or client_ca is None:
        raise ValidationError("mTLS needs all of tls_cert, tls_key and client_ca")
    return TlsFiles(cert, key, client_ca)


@dataclass(frozen=True)
class HubConfig:
    """Settings kept in ``hub.toml``.

    ``tls`` paths may be relative; they are taken from the hub home.
    """

    store_url: str
    grpc_bind: str = "127.0.0.1:7443"
    mqtt_url: str = ""
    tls: TlsFiles | None = None

    def dump(self, path: Path) -> None:
        """Write the settings to ``path``."""
        data = {"store_url": self.store_url, "grpc_bind": self.grpc_bind, "mqtt_url": self.mqtt_url}
        if self.tls is not None:
            data |= {
                "tls_cert": str(self.tls.cert),
                "tls_key": str(self.tls.key),
                "client_ca": str(self.tls.client_ca),
            }
        path.write_text(tomli_w.dumps(data), encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> HubConfig:
        """Read the settings.

        Raises:
            HubError: missing or malformed file.
        """
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
            tls = tls_files(*(_opt_path(data, k) for k in ("tls_cert", "tls_key", "client_ca")))
            return cls(
                store_url=str(data["store_url"]),
                grpc_bind=str(data.get("grpc_bind", "127.0.0.1:7443")),
                mqtt_url=str(data.get("mqtt_url", "")),
                tls=tls,
            )
        except (OSError, tomllib.TOMLDecodeError, KeyError, ValidationError) as exc:
            raise HubError(f"cannot read hub config {path}: {exc}") from exc


class Hub:
    """An opened hub home: its config, store and trust repository."""

    def __init__(self, home: Path, config: HubConfig, store: Store, trust: TrustRepository) -> None:
        self.home = home
        self.config = config
        self.store = store
        self.trust = trust

    @classmethod
    def init(
        cls,
        home: Path,
        store_url: str | None = None,
        grpc_bind: str = "127.0.0.1:7443",
        mqtt_url: str = "",
        tls: TlsFiles | None = None,
    ) -> Hub:
        """Create a new hub home with fresh signing keys.

        Args:
            home: the folder to create the hub in.
            store_url: SQLAlchemy URL of the registry; default SQLite in the home.
            grpc_bind: address the gRPC server listens on.
            mqtt_url: a broker to also serve devices through ('' for none).
            tls: mTLS files for gRPC (relative paths are taken from the home).

        Raises:
            HubError: the home already holds a hub.
        """
        if (home / CONFIG_FILE).exists():
            raise HubError(f"{home} already holds a hub ({CONFIG_FILE} exists)")
        home.mkdir(parents=True, exist_ok=True)
        url = store_url or f"sqlite:///{(home / 'hub.db').resolve()}"
        config = HubConfig(store_url=url, grpc_bind=grpc_bind, mqtt_url=mqtt_url, tls=tls)
        trust = TrustRepository.init(home / "trust")
        store = open_store(url)
        config.dump(home / CONFIG_FILE)
        return cls(home, config, store, trust)

    @classmethod
    def open(cls, home: Path) -> Hub:
        """Open an existing hub home.

        Raises:
            HubError: no hub there.
        """
        config = HubConfig.load(home / CONFIG_FILE)
        return cls(home, config, open_store(config.store_url), TrustRepository.open(home / "trust"))

    def close(self) -> None:
        """Release the store."""
        self.store.close()

    def core(self) -> HubCore:
        """The transport-independent message handler over this hub's state."""
        return HubCore(self.store, self.trust)

    async def serve(
        self,
        stop: asyncio.Event,
        grpc_bind: str | None = None,
        mqtt_url: str | None = None,
        tls: TlsFiles | None = None,
        metrics_bind: str | None = None,
    ) -> None:
        """Serve devices over gRPC, and over MQTT when a broker URL is configured, until ``stop``.

        Both transports share one :class:`HubCore`. MQTT starts first, so once the
        gRPC port answers the hub is subscribed on the broker too. gRPC speaks
        mTLS when ``tls`` (or the configured TLS files) is given. With
        ``metrics_bind`` (``HOST:PORT``) a Prometheus endpoint serves the
        core's counters, the leader state and the control loops; it starts
        before the transports and stops after them.

        The core's loops run in every process; the leader-only loops run while
        this process leads (see :mod:`cloud.leader`). With a SQLite store only
        one process may serve a home.

        Raises:
            AlreadyServingError: SQLite, and another process serves this home.
            HubError: the serve lock or the leader election cannot be set up.
            TransportError: the broker could not be reached at start, a TLS
                file cannot be read, or the metrics address cannot be bound.
            ValidationError: a malformed ``metrics_bind``.
        """
        tls = tls or self.config.tls
        server_tls = tls.resolve(self.home).load() if tls is not None else None
        url = self.config.mqtt_url if mqtt_url is None else mqtt_url
        async with contextlib.AsyncExitStack() as stack:
            # Unwinds in reverse: transports, loops, telemetry flush, metrics, election.
            election = open_election(self.home, self.config.store_url)
            stack.push_async_callback(asyncio.to_thread, election.close)
            core = self.core()
            host = self._loop_host(core, election)
            if metrics_bind:
                metrics = start_hub_metrics(core, self.store, metrics_bind, host)
                stack.push_async_callback(asyncio.to_thread, metrics.stop)
                log.info("hub serving Prometheus metrics on port %d", metrics.port)
            stack.push_async_callback(core.close)  # commit what the telemetry batcher holds
            host.start()
            stack.push_async_callback(host.stop)
            if url:
                from cloud.mqtt_server import start_mqtt_server  # noqa: PLC0415 - paho only when used

                stack.push_async_callback((await start_mqtt_server(core, url)).stop)
            server, port = await start_grpc_server(
                core, grpc_bind or self.config.grpc_bind, server_tls
            )
            stack.push_async_callback(server.stop, 1.0)
            log.info("hub serving gRPC%s on port %d", " (mTLS)" if server_tls else "", port)
            await stop.wait()

    def _loop_host(self, core: HubCore, election: Election) -> LoopHost:
        host = LoopHost()
        for name, factory in core.loops():
            host.add(name, factory)
        host.add("leader-election", lambda: election.campaign(host.set_leader))
        host.add(
            "timestamp-refresh",
            periodic(self._refresh_timestamp, TIMESTAMP_REFRESH_S),
            leader_only=True,
        )
        return host

    async def _refresh_timestamp(self) -> None:
        # The timestamp role expires within a day; re-sign it well before.
        await asyncio.to_thread(self.trust.refresh_timestamp)


def _opt_path(data: dict[str, object], key: str) -> Path | None:
    value = data.get(key)
    return Path(str(value)) if value else None
