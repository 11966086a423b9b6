"""A hub home's configuration (``hub.toml``) and the serve plan checked before a hub serves.

:class:`HubConfig` is what ``hub init`` writes and every hub process reads;
:func:`plan_serve` checks the addresses, broker URL and TLS files one ``hub
serve`` would use, and probes its ports, before anything is opened or locked.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

import tomli_w

from cloud.endpoints import ENROLMENT, GRPC, METRICS, check_listeners, parse_broker_url
from cloud.errors import HubError, ValidationError
from cloud.grpc_server import ServerTls
from cloud.pki import PKI_DIR

CONFIG_FILE = "hub.toml"


@dataclass(frozen=True)
class TlsFiles:
    """Where the hub's mTLS material lives: its certificate and key, the devices' CA, the CRL."""

    cert: Path
    key: Path
    client_ca: Path
    crl: Path | None = None

    def resolve(self, home: Path) -> TlsFiles:
        """The same files with relative paths taken from ``home``."""
        crl = home / self.crl if self.crl is not None else None
        return TlsFiles(home / self.cert, home / self.key, home / self.client_ca, crl)

    def load(self) -> ServerTls:
        """Read the PEM files.

        Raises:
            TransportError: a file is missing, unreadable or too large.
        """
        return ServerTls.from_files(self.cert, self.key, self.client_ca, self.crl)


#: The files ``hub init`` makes, relative to the hub home.
DEFAULT_TLS = TlsFiles(
    Path(PKI_DIR, "server.crt"),
    Path(PKI_DIR, "server.key"),
    Path(PKI_DIR, "ca.crt"),
    Path(PKI_DIR, "crl.pem"),
)


def enroll_bind_for(grpc_bind: str) -> str:
    """The default enrolment address: the gRPC port plus one (port 0 stays 0)."""
    host, _, port = grpc_bind.rpartition(":")
    number = int(port) if port.isdigit() else 7443
    return f"{host}:{number + 1 if number else 0}"


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
    #: Where devices without a certificate yet enrol (server TLS only).
    enroll_bind: str = ""
    #: Plain gRPC, no identities: only when asked for, loudly.
    insecure: bool = False

    def dump(self, path: Path) -> None:
        """Write the settings to ``path``."""
        data: dict[str, object] = {
            "store_url": self.store_url,
            "grpc_bind": self.grpc_bind,
            "mqtt_url": self.mqtt_url,
            "enroll_bind": self.enroll_bind,
            "insecure": self.insecure,
        }
        if self.tls is not None:
            data |= {
                "tls_cert": str(self.tls.cert),
                "tls_key": str(self.tls.key),
                "client_ca": str(self.tls.client_ca),
            }
            if self.tls.crl is not None:
                data["crl"] = str(self.tls.crl)
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
            if tls is not None:
                tls = TlsFiles(tls.cert, tls.key, tls.client_ca, _opt_path(data, "crl"))
            grpc_bind = str(data.get("grpc_bind", "127.0.0.1:7443"))
            return cls(
                store_url=str(data["store_url"]),
                grpc_bind=grpc_bind,
                mqtt_url=str(data.get("mqtt_url", "")),
                tls=tls,
                enroll_bind=str(data.get("enroll_bind") or enroll_bind_for(grpc_bind)),
                insecure=bool(data.get("insecure", False)),
            )
        except (OSError, tomllib.TOMLDecodeError, KeyError, ValidationError) as exc:
            raise HubError(f"cannot read hub config {path}: {exc}") from exc


def _opt_path(data: dict[str, object], key: str) -> Path | None:
    value = data.get(key)
    return Path(str(value)) if value else None


@dataclass(frozen=True)
class ServePlan:
    """What one ``hub serve`` listens on and speaks, checked before anything starts."""

    grpc_bind: str
    #: Where devices enrol; bound only with ``tls``.
    enroll_bind: str
    mqtt_url: str
    metrics_bind: str | None
    #: The loaded mTLS material; None serves plain gRPC (insecure).
    tls: ServerTls | None


def plan_serve(
    home: Path,
    config: HubConfig | None = None,
    grpc_bind: str | None = None,
    mqtt_url: str | None = None,
    tls: TlsFiles | None = None,
    metrics_bind: str | None = None,
    insecure: bool | None = None,
) -> ServePlan:
    """Check how the hub at ``home`` would serve, changing nothing: addresses, URL, TLS, ports.

    Settings given here override the home's ``hub.toml`` (read when ``config``
    is None). Every address it would listen on is probed, so a taken port or
    an address of another machine is refused before the hub opens its store
    or takes its serve lock.

    Raises:
        HubError: no hub config at ``home``, or a secure hub without TLS files.
        ValidationError: a malformed bind address or broker URL, or one address twice.
        TransportError: a TLS file cannot be read, or an address cannot be listened on.
    """
    config = config or HubConfig.load(home / CONFIG_FILE)
    insecure = config.insecure if insecure is None else insecure
    files = None if insecure else (tls or config.tls)
    if files is None and not insecure:
        raise HubError(f"{home} has no TLS files; serve it with --insecure, or init anew")
    bind = grpc_bind or config.grpc_bind
    enroll_bind = enroll_bind_for(bind) if grpc_bind else config.enroll_bind
    url = config.mqtt_url if mqtt_url is None else mqtt_url
    parse_broker_url(url)
    # Plain gRPC has no enrolment port.
    listeners = {GRPC: bind, ENROLMENT: enroll_bind if files else "", METRICS: metrics_bind or ""}
    server_tls = files.resolve(home).load() if files is not None else None
    check_listeners({what: address for what, address in listeners.items() if address})
    return ServePlan(bind, enroll_bind, url, metrics_bind or None, server_tls)
