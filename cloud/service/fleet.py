"""The fleet service: one typed API over a hub home for every face (CLI, REST, console)."""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Self

from cloud.hub import Hub
from cloud.hub_config import HubConfig, TlsFiles
from cloud.models import ModelFactory
from cloud.service.access import AuditService, ProjectService, TokenService
from cloud.service.deployments import DeploymentService
from cloud.service.devices import DeviceService, GroupService, IdentityService
from cloud.service.drift import DriftService
from cloud.service.events import EventService
from cloud.service.metering import MeteringService
from cloud.service.search import DeviceSearch
from cloud.service.skills import SkillService
from cloud.service.telemetry import TelemetryService
from protos.envelope import now_ms

__all__ = ["FleetService"]


class FleetService:
    """Devices, groups, skills, deployments, telemetry, events, drift and models of one hub.

    Open it with :meth:`open` (or :meth:`init` for a new hub) and close it when
    done; it is a context manager. Every method raises only :class:`cloud.errors.HubError`
    subclasses.
    """

    def __init__(self, hub: Hub, *, clock: Callable[[], int] = now_ms) -> None:
        """Serve the opened ``hub``; ``clock`` gives the milliseconds records are stamped with."""
        self._hub = hub
        self.devices = DeviceService(hub.store, clock)
        self.groups = GroupService(hub.store)
        self.skills = SkillService(hub.store, hub.trust, clock)
        self.deployments = DeploymentService(hub.store, clock, devices=self.devices)
        self.events = EventService(hub.store)
        self.telemetry = TelemetryService(hub.store)
        self.identity = IdentityService(hub.home, hub.store)
        self.drift = DriftService(hub.store, clock)
        self.tokens = TokenService(hub.store, clock)
        self.audit = AuditService(hub.store, clock)
        self.projects = ProjectService(hub.store, clock)
        self.search = DeviceSearch(hub.store, clock)
        self.metering = MeteringService(hub.store)

    @classmethod
    def open(cls, home: Path) -> FleetService:
        """Open the hub home at ``home``.

        Raises:
            HubError: No hub there, or its store cannot be opened.
        """
        return cls(Hub.open(home))

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
    ) -> FleetService:
        """Create a hub home (keys, TUF metadata, PKI unless ``insecure``, store) and open it.

        Raises:
            HubError: The home already holds a hub, or the store or PKI cannot be written.
        """
        hub = Hub.init(
            home,
            store_url,
            grpc_bind,
            mqtt_url,
            tls,
            insecure=insecure,
            enroll_bind=enroll_bind,
            server_names=server_names,
        )
        return cls(hub)

    @property
    def home(self) -> Path:
        """The hub's home folder."""
        return self._hub.home

    @property
    def config(self) -> HubConfig:
        """The hub's settings (``hub.toml``)."""
        return self._hub.config

    @property
    def trusted_root(self) -> Path:
        """The TUF root devices start from."""
        return self._hub.home / "trust" / "metadata" / "root.json"

    @cached_property
    def models(self) -> ModelFactory:
        """The model factory: data sets, training jobs, variants, artefacts, lineage."""
        return ModelFactory.for_hub(self._hub)

    def close(self) -> None:
        """Release the store."""
        self._hub.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
