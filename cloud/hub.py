"""The hub's home folder: configuration, the registry store and the TUF repository.

A hub home holds ``hub.toml``, ``trust/`` (keys and signed metadata) and, with
the embedded default store, ``hub.db``. Every hub process and CLI command
opens the same home, so several can run side by side.
"""

from __future__ import annotations

import asyncio
import logging
import tomllib
from dataclasses import dataclass
from pathlib import Path

import tomli_w

from cloud.errors import ConflictError, HubError
from cloud.grpc_server import start_grpc_server
from cloud.hubcore import HubCore
from cloud.store import SkillVersionRecord, Store, open_store
from protos.envelope import now_ms
from skills.bundle import read_manifest
from skills.trust import TrustRepository

log = logging.getLogger(__name__)

CONFIG_FILE = "hub.toml"


@dataclass(frozen=True)
class HubConfig:
    """Settings kept in ``hub.toml``."""

    store_url: str
    grpc_bind: str = "127.0.0.1:7443"
    mqtt_url: str = ""

    def dump(self, path: Path) -> None:
        """Write the settings to ``path``."""
        data = {"store_url": self.store_url, "grpc_bind": self.grpc_bind, "mqtt_url": self.mqtt_url}
        path.write_text(tomli_w.dumps(data), encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> HubConfig:
        """Read the settings.

        Raises:
            HubError: missing or malformed file.
        """
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
            return cls(
                store_url=str(data["store_url"]),
                grpc_bind=str(data.get("grpc_bind", "127.0.0.1:7443")),
                mqtt_url=str(data.get("mqtt_url", "")),
            )
        except (OSError, tomllib.TOMLDecodeError, KeyError) as exc:
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
    ) -> Hub:
        """Create a new hub home with fresh signing keys.

        Raises:
            HubError: the home already holds a hub.
        """
        if (home / CONFIG_FILE).exists():
            raise HubError(f"{home} already holds a hub ({CONFIG_FILE} exists)")
        home.mkdir(parents=True, exist_ok=True)
        url = store_url or f"sqlite:///{(home / 'hub.db').resolve()}"
        config = HubConfig(store_url=url, grpc_bind=grpc_bind, mqtt_url=mqtt_url)
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

    def push(self, bundle: Path) -> SkillVersionRecord:
        """Publish a built bundle: sign it into the TUF repository and record the version.

        Raises:
            ConflictError: this name and version exist with other content.
            SkillError: the bundle is malformed (from the skills package).
        """
        manifest = read_manifest(bundle)
        target_name = f"{manifest.name}/{manifest.name}-{manifest.version}.skill"
        try:
            existing = self.store.get_skill_version(manifest.name, manifest.version)
        except HubError:
            existing = None
        ref_sha = _sha256(bundle)
        if existing is not None and existing.sha256 != ref_sha:
            raise ConflictError(
                f"{manifest.name} {manifest.version} exists with other content; "
                "versions are immutable"
            )
        ref = self.trust.add_target(target_name, bundle)
        return self.store.add_skill_version(
            manifest.name,
            manifest.version,
            target_name=target_name,
            sha256=ref.sha256,
            size=ref.length,
            manifest=manifest.to_toml(),
            now_ms=now_ms(),
        )

    def core(self) -> HubCore:
        """The transport-independent message handler over this hub's state."""
        return HubCore(self.store, self.trust)

    async def serve(
        self, stop: asyncio.Event, grpc_bind: str | None = None, mqtt_url: str | None = None
    ) -> None:
        """Serve devices over gRPC, and over MQTT when a broker URL is configured, until ``stop``.

        Both transports share one :class:`HubCore`. MQTT starts first, so once the
        gRPC port answers the hub is subscribed on the broker too.

        Raises:
            TransportError: the broker could not be reached at start.
        """
        core = self.core()
        url = self.config.mqtt_url if mqtt_url is None else mqtt_url
        mqtt = None
        if url:
            from cloud.mqtt_server import start_mqtt_server  # noqa: PLC0415 - paho only when used

            mqtt = await start_mqtt_server(core, url)
        try:
            server, port = await start_grpc_server(core, grpc_bind or self.config.grpc_bind)
        except BaseException:
            if mqtt is not None:
                await mqtt.stop()
            raise
        log.info("hub serving gRPC on port %d", port)
        refresher = asyncio.create_task(self._refresh_timestamp())
        try:
            await stop.wait()
        finally:
            refresher.cancel()
            await server.stop(grace=1.0)
            if mqtt is not None:
                await mqtt.stop()
            await core.close()  # commit what the telemetry batcher still holds

    async def _refresh_timestamp(self) -> None:
        # The timestamp role expires within a day; re-sign it well before.
        while True:
            await asyncio.sleep(3600)
            await asyncio.to_thread(self.trust.refresh_timestamp)


def _sha256(path: Path) -> str:
    import hashlib  # noqa: PLC0415

    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
