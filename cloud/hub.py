"""The hub's home folder: configuration, the registry store and the TUF repository.

A hub home holds ``hub.toml``, ``trust/`` (keys and signed metadata) and, with
the embedded default store, ``hub.db``. Every hub process and CLI command
opens the same home, so several can run side by side.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from cloud.director import HubDirector
from cloud.endpoints import (
    check_hub_addresses,
    check_store_url,
)
from cloud.enrolment import Enroller
from cloud.errors import HubError, ValidationError
from cloud.grpc_server import start_grpc_server
from cloud.hub_config import (
    CONFIG_FILE,
    DEFAULT_TLS,
    HubConfig,
    TlsFiles,
    enroll_bind_for,
    plan_serve,
)
from cloud.hubcore import HubCore
from cloud.leader import Election, open_election
from cloud.loops import LoopFactory, LoopHost, periodic
from cloud.metering_loop import MeteringLoop
from cloud.metrics import start_hub_metrics
from cloud.pki import init_hub_pki
from cloud.presence import DEFAULT_HEARTBEAT_S, heartbeat_seconds
from cloud.rollout_loop import RolloutLoop
from cloud.store import Store, open_store
from skills.errors import SkillError
from skills.trust import TrustRepository
from skills.trust.ceremony import load_signers

if TYPE_CHECKING:
    from cloud.console.server import ConsoleServer

log = logging.getLogger(__name__)

_WILDCARDS = frozenset({"0.0.0.0", "::"})  # noqa: S104 - names to leave out of a certificate
#: How often the leader re-signs the TUF timestamp, which expires within a day.
TIMESTAMP_REFRESH_S = 3600.0
INSECURE_WARNING = (
    "INSECURE MODE: gRPC without TLS. Anyone who reaches the port can register as any "
    "device and read every bundle. Use this only on a closed test network."
)


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
        *,
        insecure: bool = False,
        enroll_bind: str = "",
        server_names: tuple[str, ...] = (),
        root_keys: tuple[Path, ...] = (),
        root_threshold: int = 1,
    ) -> Hub:
        """Create a new hub home with fresh signing keys, and its PKI unless ``insecure``.

        By default the hub's CA, its server certificate (for 127.0.0.1,
        localhost, the bind host and ``server_names``), its MQTT client
        certificate (CN ``hub``) and an empty CRL are made in ``<home>/pki/``,
        and gRPC serves mutual TLS. Every setting is checked before anything is
        written; if making the home fails part way, what was made is removed.

        Args:
            home: the folder to create the hub in.
            store_url: SQLAlchemy URL of the registry; default SQLite in the home.
            grpc_bind: address the gRPC server listens on.
            mqtt_url: a broker to also serve devices through ('' for none).
            tls: mTLS files of your own for gRPC (relative paths are taken from the home).
            insecure: plain gRPC, no device identities (test networks only).
            enroll_bind: where devices enrol; default the gRPC port plus one.
            server_names: more DNS names or addresses for the hub's certificate.
            root_keys: offline TUF root keys (PEM files, e.g. from ``edgeskill trust
                generate-root-keys``); without them the root key is kept online.
            root_threshold: how many of ``root_keys`` must sign a new root.

        Raises:
            HubError: the home already holds a hub, or the PKI, the TUF
                repository or the store cannot be made.
            ValidationError: a malformed bind address, broker URL or store URL,
                or a server name that cannot go into a certificate.
        """
        if (home / CONFIG_FILE).exists():
            raise HubError(f"{home} already holds a hub ({CONFIG_FILE} exists)")
        enroll_bind = enroll_bind or enroll_bind_for(grpc_bind)
        check_hub_addresses(grpc_bind, enroll_bind, mqtt_url)
        if store_url:
            check_store_url(store_url)
        if not 1 <= root_threshold <= max(1, len(root_keys)):
            raise ValidationError(
                f"a root threshold of {root_threshold} needs at least that many --root-key files"
            )
        try:
            root_signers = load_signers(root_keys) if root_keys else None
        except SkillError as exc:
            raise HubError(str(exc)) from exc
        config = HubConfig(
            store_url=store_url or f"sqlite:///{(home / 'hub.db').resolve()}",
            grpc_bind=grpc_bind,
            mqtt_url=mqtt_url,
            tls=None if insecure else (tls or DEFAULT_TLS),
            enroll_bind=enroll_bind,
            insecure=insecure,
        )
        with _removed_on_failure(home):
            home.mkdir(parents=True, exist_ok=True)
            if tls is None and not insecure:
                host = grpc_bind.rpartition(":")[0].strip("[]")
                names = [n for n in (host, *server_names) if n and n not in _WILDCARDS]
                init_hub_pki(home, names)
                Enroller(home).crl_pem()  # an empty CRL, so the broker can point at it
            try:
                trust = TrustRepository.init(
                    home / "trust", root_signers=root_signers, root_threshold=root_threshold
                )
            except SkillError as exc:
                raise HubError(f"cannot create the TUF repository: {exc}") from exc
            store = open_store(config.store_url)
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

    def enroller(self) -> Enroller:
        """Claims, enrolment, renewal and revocation for this hub's devices."""
        return Enroller(self.home, self.store)

    def core(self, heartbeat_s: int = DEFAULT_HEARTBEAT_S) -> HubCore:
        """The transport-independent message handler over this hub's state.

        Desired states go out signed with the hub's director key, unless the hub is insecure.
        Devices are told to send a heartbeat every ``heartbeat_s`` seconds.

        Raises:
            ValidationError: ``heartbeat_s`` outside 1..300.
            HubError: the director key cannot be read or made.
        """
        heartbeat_s = heartbeat_seconds(heartbeat_s)  # before a director key may be made
        director = None if self.config.insecure else HubDirector(self.home)
        return HubCore(self.store, self.trust, director=director, heartbeat_s=heartbeat_s)

    async def serve(
        self,
        stop: asyncio.Event,
        grpc_bind: str | None = None,
        mqtt_url: str | None = None,
        tls: TlsFiles | None = None,
        metrics_bind: str | None = None,
        *,
        insecure: bool | None = None,
        heartbeat_s: int = DEFAULT_HEARTBEAT_S,
        drift_tick_s: float | None = None,
        console_bind: str | None = None,
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

        gRPC speaks mutual TLS with the hub's files unless the hub was made
        ``insecure`` or ``insecure`` is set here; devices then enrol on the
        configured ``enroll_bind``. Plain mode logs a loud warning.

        Every address and URL is checked, and every port probed, before the
        serve lock is taken (see :func:`plan_serve`). ``drift_tick_s`` is how
        often the leader's drift loop runs (default
        :data:`cloud.drift_loop.DRIFT_TICK_S`; demos and tests run it faster).
        With ``console_bind`` (``HOST:PORT``) the console (REST API and pages)
        is served from this process too, over plain HTTP on loopback only.

        Raises:
            AlreadyServingError: SQLite, and another process serves this home.
            HubError: the serve lock or the leader election cannot be set up.
            TransportError: the broker could not be reached at start, a TLS
                file cannot be read, or an address cannot be listened on.
            ValidationError: a malformed bind address or broker URL, or a
                ``heartbeat_s`` (the interval devices keep) outside 1..300 seconds.
        """
        heartbeat_s = heartbeat_seconds(heartbeat_s)
        plan = plan_serve(self.home, self.config, grpc_bind, mqtt_url, tls, metrics_bind, insecure)
        if plan.tls is None:
            log.warning(INSECURE_WARNING)
        server_tls, url, metrics_bind = plan.tls, plan.mqtt_url, plan.metrics_bind
        async with contextlib.AsyncExitStack() as stack:
            # Unwinds in reverse: transports, loops, telemetry flush, metrics, election.
            election = open_election(self.home, self.config.store_url)
            stack.push_async_callback(asyncio.to_thread, election.close)
            core = self.core(heartbeat_s)
            host = self._loop_host(core, election, drift_tick_s)
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
                core,
                plan.grpc_bind,
                server_tls,
                enroller=self.enroller(),
                enroll_bind=plan.enroll_bind,
            )
            stack.push_async_callback(server.stop, 1.0)
            log.info("hub serving gRPC%s on port %d", " (mTLS)" if server_tls else "", port)
            if console_bind:
                console = await self._start_console(console_bind)
                stack.push_async_callback(console.stop)
                log.info("hub serving the console on port %d", console.port)
            await stop.wait()

    def _loop_host(
        self, core: HubCore, election: Election, drift_tick_s: float | None = None
    ) -> LoopHost:
        host = LoopHost()
        for name, factory in core.loops():
            host.add(name, factory)
        host.add("leader-election", lambda: election.campaign(host.set_leader))
        host.add(
            "timestamp-refresh",
            periodic(self._refresh_timestamp, TIMESTAMP_REFRESH_S),
            leader_only=True,
        )
        rollouts = RolloutLoop(self.store, on_write=core.notifier.nudge)
        core.on_settled = rollouts.heard
        host.add("rollouts", rollouts.factory(), leader_only=True)
        host.add("drift", self._drift_loop(drift_tick_s), leader_only=True)
        host.add("metering", MeteringLoop(self.store).factory(), leader_only=True)
        if not self.config.insecure:
            host.add(
                "crl-refresh",
                periodic(self._refresh_crl, TIMESTAMP_REFRESH_S),
                leader_only=True,
            )
        return host

    async def _start_console(self, bind: str) -> ConsoleServer:
        # FastAPI only when the console is asked for; the service imports cloud.hub.
        from cloud.console.server import start_console  # noqa: PLC0415
        from cloud.service import FleetService  # noqa: PLC0415

        return await start_console(FleetService(self), bind)

    def _drift_loop(self, tick_s: float | None) -> LoopFactory:
        # The drift loop drives incidents through the fleet service, which is built on
        # this hub (cloud.service imports cloud.hub, so not at the top).
        from cloud.drift_loop import DRIFT_TICK_S, DriftLoop  # noqa: PLC0415
        from cloud.drift_retrain import Retrainer  # noqa: PLC0415
        from cloud.service import FleetService  # noqa: PLC0415

        fleet = FleetService(self)
        return DriftLoop(fleet, Retrainer(fleet), tick_s=tick_s or DRIFT_TICK_S).factory()

    async def _refresh_crl(self) -> None:
        # Mosquitto refuses every client once its CRL expires; re-sign it well before.
        if await asyncio.to_thread(self.enroller().refresh_crl):
            log.info("re-signed the certificate revocation list; run `edgeskill broker reload`")

    async def _refresh_timestamp(self) -> None:
        # The timestamp role expires within a day; re-sign it well before.
        await asyncio.to_thread(self.trust.refresh_timestamp)


@contextlib.contextmanager
def _removed_on_failure(home: Path) -> Iterator[None]:
    """Remove what the block made at ``home`` (and missing parents of it) if it raises."""
    home = home.absolute()
    missing = [p for p in (home, *home.parents) if not p.exists()]
    before = set() if missing else set(home.iterdir())
    try:
        yield
    except BaseException:
        if missing:
            shutil.rmtree(missing[-1], ignore_errors=True)
        else:
            for made in set(home.iterdir()) - before:
                if made.is_dir() and not made.is_symlink():
                    shutil.rmtree(made, ignore_errors=True)
                else:
                    made.unlink(missing_ok=True)
        raise
