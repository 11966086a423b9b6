"""Checks on an agent's settings, run before anything touches the disk.

What a person types (a hub URL, a device id, the paths of a trusted root,
certificates and keys) is checked here, at start, and refused with a one-line
reason: a URL the agent cannot use would otherwise retry forever, and a root
that can never verify anything would only show up as failed installs. The
functions only read; none creates a file or a folder, so a refused start
leaves the state folder as it was (absent, on a first start).
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import re
import stat
import zipfile
from pathlib import Path
from urllib.parse import SplitResult, urlsplit

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes, PublicKeyTypes

from edge_agent.config import AgentConfig
from edge_agent.enrolment import enroll_url_for, load_identity
from edge_agent.errors import AgentError
from edge_agent.state_lock import LOCK_FILE
from edge_agent.workload import MAX_SOURCE_BYTES
from protos.errors import ProtocolError
from protos.limits import DEVICE_ID_PATTERN, MAX_DEVICE_ID_CHARS
from protos.metrics_server import MetricsBindError, parse_bind
from protos.topics import MqttEndpoint
from skills.errors import TrustError
from skills.trust.client import TrustLimits
from skills.trust.root_check import check_root

__all__ = [
    "HUB_SCHEMES",
    "MAX_SETTING_FILE_BYTES",
    "SECURE_SCHEMES",
    "TRUST_DIR",
    "SettingsError",
    "check_certificates",
    "check_config",
    "check_device_id",
    "check_director_key",
    "check_enroll_url",
    "check_hub_url",
    "check_private_key",
    "check_run_config",
    "check_source",
    "check_trusted_root",
    "read_claim_token",
    "read_setting_file",
]

HUB_SCHEMES = ("grpc", "grpcs", "mqtt", "mqtts")
SECURE_SCHEMES = ("grpcs", "mqtts")
#: The agent's TUF client keeps its metadata in ``<state_dir>/trust``.
TRUST_DIR = "trust"
#: Certificates, keys, roots and token files are far smaller than this.
MAX_SETTING_FILE_BYTES = 1024 * 1024
_MAX_TOKEN_CHARS = 1024
_MAX_QUOTED_CHARS = 60
_HUB_FORMS = "grpc[s]:// or mqtt[s]://HOST:PORT"
_DEVICE_ID_RE = re.compile(DEVICE_ID_PATTERN)
_HOST_RE = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9._-]{0,252})")


class SettingsError(AgentError):
    """A setting of the agent cannot be used (the operator's fault); the message is one line."""


# -- values ----------------------------------------------------------------------


def check_device_id(device_id: str) -> str:
    """Check a device id against the wire's rule (it is also an MQTT topic level).

    Raises:
        SettingsError: not 1..128 letters, digits, ``.``, ``_`` or ``-`` starting
            with a letter or digit (so never ``/``, ``+``, ``#`` or a space).
    """
    if not _DEVICE_ID_RE.fullmatch(device_id):
        raise SettingsError(
            f"bad device id {_quote(device_id)}: expected 1 to {MAX_DEVICE_ID_CHARS} letters, "
            "digits, '.', '_' or '-', starting with a letter or digit"
        )
    return device_id


def check_hub_url(url: str) -> None:
    """Check a hub URL: a known scheme, a host, a port in 1..65535, and valid MQTT options.

    Raises:
        SettingsError: the URL cannot be used, with what is expected.
    """
    parts = _split_url(url, "hub URL", HUB_SCHEMES, _HUB_FORMS)
    if parts.scheme in ("grpc", "grpcs"):
        _no_extras(parts, url, "hub URL", f"{parts.scheme}://HOST:PORT")
        return
    try:
        endpoint = MqttEndpoint.parse(url)
    except ProtocolError as exc:
        raise SettingsError(f"hub URL {_quote(url)}: {exc}") from exc
    for option, path in (("ca", endpoint.ca_file), ("cert", endpoint.cert_file)):
        if path is not None:
            check_certificates(Path(path), f"the hub URL's {option}= file")
    if endpoint.key_file is not None:
        check_private_key(Path(endpoint.key_file), "the hub URL's key= file")


def check_enroll_url(url: str) -> None:
    """Check an enrolment URL: ``grpcs://HOST:PORT`` with a port in 1..65535.

    Raises:
        SettingsError: the URL cannot be used, with what is expected.
    """
    parts = _split_url(url, "enrolment URL", ("grpcs",), "grpcs://HOST:PORT")
    _no_extras(parts, url, "enrolment URL", "grpcs://HOST:PORT")


def _split_url(url: str, what: str, schemes: tuple[str, ...], forms: str) -> SplitResult:
    if "://" not in url:
        raise SettingsError(f"{what} {_quote(url)} has no scheme; expected {forms}")
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise SettingsError(f"{what} {_quote(url)} is not a URL ({exc}); expected {forms}") from exc
    if parts.scheme not in schemes:
        raise SettingsError(
            f"{what} {_quote(url)} has the scheme {parts.scheme!r}; expected {forms}"
        )
    if "#" in url:
        raise SettingsError(f"{what} {_quote(url)} has a '#'; expected {forms}")
    host = parts.hostname or ""
    if not host:
        raise SettingsError(f"{what} {_quote(url)} has no host; expected {forms}")
    if not (_HOST_RE.fullmatch(host) or _is_ip(host)):
        raise SettingsError(f"{what} {_quote(url)} has a bad host {_quote(host)}")
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0 or (port is None and parts.netloc.endswith(":")):
        raise SettingsError(f"{what} {_quote(url)} has a bad port; expected a number in 1..65535")
    return parts


def _no_extras(parts: SplitResult, url: str, what: str, form: str) -> None:
    if parts.path not in ("", "/") or parts.query or parts.username:
        raise SettingsError(f"{what} {_quote(url)} takes no user, path or options; expected {form}")


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


# -- files -----------------------------------------------------------------------


def read_setting_file(path: Path, what: str, max_bytes: int = MAX_SETTING_FILE_BYTES) -> bytes:
    """Read a file named in the settings: it must exist, be a regular file, and not be empty.

    Args:
        path: The file.
        what: How errors name it (``trusted root``).
        max_bytes: The largest file accepted.

    Raises:
        SettingsError: missing, a folder or other non-file, unreadable, empty or too large.
    """
    _regular_file(path, what)
    try:
        with path.open("rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise SettingsError(f"cannot read {what} {path}: {_os_reason(exc)}") from exc
    if len(data) > max_bytes:
        raise SettingsError(f"{what} {path} is larger than {max_bytes} bytes")
    if not data.strip():
        raise SettingsError(f"{what} {path} is empty")
    return data


def _regular_file(path: Path, what: str) -> os.stat_result:
    try:
        info = path.stat()
    except FileNotFoundError as exc:
        raise SettingsError(f"{what} {path} does not exist") from exc
    except OSError as exc:
        raise SettingsError(f"cannot read {what} {path}: {_os_reason(exc)}") from exc
    if stat.S_ISDIR(info.st_mode):
        raise SettingsError(f"{what} {path} is a folder; expected a file")
    if not stat.S_ISREG(info.st_mode):
        raise SettingsError(f"{what} {path} is not a regular file")
    return info


def check_trusted_root(path: Path) -> bytes:
    """Read and check a trusted ``root.json``; returns its bytes.

    Raises:
        SettingsError: the file cannot be read, is not TUF root metadata, or is not
            signed by the threshold of its own root keys.
    """
    data = read_setting_file(path, "trusted root", TrustLimits().max_root_bytes)
    try:
        check_root(data, f"trusted root {path}")
    except TrustError as exc:
        raise SettingsError(str(exc)) from exc
    return data


def check_certificates(path: Path, what: str) -> list[x509.Certificate]:
    """Read a PEM file holding one or more certificates.

    Raises:
        SettingsError: the file cannot be read or holds no parsable PEM certificate.
    """
    data = read_setting_file(path, what)
    try:
        return x509.load_pem_x509_certificates(data)
    except ValueError as exc:
        raise SettingsError(f"{what} {path} is not a PEM certificate") from exc


def check_private_key(path: Path, what: str) -> PrivateKeyTypes:
    """Read an unencrypted PEM private key.

    Raises:
        SettingsError: the file cannot be read, is not a PEM private key, or is encrypted.
    """
    data = read_setting_file(path, what)
    try:
        return serialization.load_pem_private_key(data, None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise SettingsError(f"{what} {path} is not an unencrypted PEM private key") from exc


def check_director_key(path: Path) -> None:
    """Read the director's public key: an ed25519 key in PEM.

    Raises:
        SettingsError: the file cannot be read or is not an ed25519 PEM public key.
    """
    data = read_setting_file(path, "director key")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise SettingsError(f"director key {path} is not a PEM public key") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise SettingsError(f"director key {path} is not an ed25519 public key")


def check_source(path: Path) -> None:
    """Check a source: a replay archive, or an input the adapters read.

    A replay archive is an ``.npz`` with an ``x`` array, within the size cap; any other
    path is read as :mod:`edge_agent.adapters` reads it (images, a folder, a WAV or text
    file, an inputs file naming one per skill).

    Only a replay archive's index is read, not its arrays.

    Raises:
        SettingsError: missing, not a file, too large, or not such an archive or input.
    """
    if path.suffix.lower() not in (".npz", ".npy"):  # a numpy file: a replay archive or not
        from edge_agent.adapters import check_input  # noqa: PLC0415 - numpy: only with a source

        try:
            check_input(path)
        except AgentError as exc:
            raise SettingsError(f"source {path}: {exc}") from exc
        return
    info = _regular_file(path, "source")
    if info.st_size > MAX_SOURCE_BYTES:
        raise SettingsError(f"source {path} is larger than {MAX_SOURCE_BYTES} bytes")
    import numpy as np  # noqa: PLC0415 - only with a source; an idle agent has none

    try:
        loaded = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise SettingsError(f"source {path} is not an .npz file with an x array") from exc
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise SettingsError(f"source {path} is one array, not an .npz file with an x array")
    with loaded:
        if "x" not in loaded.files:
            raise SettingsError(f"source {path} has no x array (it has {sorted(loaded.files)})")


def read_claim_token(path: Path) -> str:
    """Read a claim token kept in a file (so it stays off the process list).

    Raises:
        SettingsError: the file cannot be read, is empty, or holds more than one line.
    """
    data = read_setting_file(path, "claim token file", 4 * _MAX_TOKEN_CHARS)
    try:
        token = data.decode("utf-8").strip()
    except UnicodeDecodeError as exc:
        raise SettingsError(f"claim token file {path} is not text") from exc
    if len(token) > _MAX_TOKEN_CHARS or not token.isprintable() or " " in token:
        raise SettingsError(f"claim token file {path} holds more than one token")
    return token


# -- a whole configuration ---------------------------------------------------------


def check_config(config: AgentConfig) -> bytes | None:
    """Check everything an agent is built from; returns the trusted root's bytes, if given.

    Raises:
        SettingsError: a bad URL, device id, file, trusted root or rate, or no trusted
            root given and none kept in the state folder.
    """
    _check_addresses(config)
    return _check_files(config)


def check_run_config(config: AgentConfig) -> bytes | None:
    """:func:`check_config`, plus what a real agent needs: an authenticated hub and an identity.

    Returns:
        The trusted root's bytes, if one is given.

    Raises:
        SettingsError: what :func:`check_config` raises; another agent holds the
            state folder; a plain URL without ``insecure``; no identity kept, no
            certificate given and no way to enrol; or a bad metrics address.
    """
    _check_addresses(config)
    _check_not_held(config.state_dir)
    if not config.insecure:
        _check_identity(config)
    root = _check_files(config)
    if config.metrics_bind is not None:
        try:
            parse_bind(config.metrics_bind)
        except MetricsBindError as exc:
            raise SettingsError(str(exc)) from exc
    return root


def _check_addresses(config: AgentConfig) -> None:
    check_device_id(config.device_id)
    check_hub_url(config.hub_url)
    if config.enroll_url is not None:
        check_enroll_url(config.enroll_url)


def _check_not_held(state_dir: Path) -> None:
    """Refuse early when another agent holds the state folder, whatever else is wrong.

    Only an existing lock file is opened, and only for a shared probe released at
    once; the agent takes the lock for real later (:mod:`edge_agent.state_lock`).
    """
    try:
        fd = os.open(state_dir / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return  # no lock file (a first start) or an unusable folder, said later
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
        raise SettingsError(
            f"another agent (pid {holder}) already runs on {state_dir}; "
            "give each agent a --state-dir of its own"
        ) from None
    finally:
        os.close(fd)  # closing drops the probe's shared lock


def _check_identity(config: AgentConfig) -> None:
    scheme = urlsplit(config.hub_url).scheme
    if scheme not in SECURE_SCHEMES:
        raise SettingsError(
            f"{scheme}:// is not authenticated: use grpcs:// or mqtts://, or --insecure"
        )
    if config.tls_cert is not None or load_identity(config.state_dir) is not None:
        return
    if not config.claim_token or config.tls_ca is None:
        raise SettingsError(
            "this device is not enrolled: pass --claim-token and --hub-ca "
            "(or --cert/--key, or --insecure)"
        )
    if config.enroll_url is None and enroll_url_for(config.hub_url) is None:
        raise SettingsError("pass --enroll-url grpcs://HUB:PORT (the hub's enrolment port)")


def _check_files(config: AgentConfig) -> bytes | None:
    _check_tls_files(config)
    root = None
    if config.trusted_root is not None:
        root = check_trusted_root(config.trusted_root)
    elif not (config.state_dir / TRUST_DIR / "metadata" / "root.json").is_file():
        raise SettingsError(
            "no trusted root: give the hub's root.json (--trusted-root) on the first start"
        )
    if config.director_key is not None:
        check_director_key(config.director_key)
    if config.source is not None:
        check_source(config.source)
    for name in ("source_rate_hz", "telemetry_window_s"):
        value = getattr(config, name)
        if not value > 0:
            raise SettingsError(f"{name} must be more than 0, not {value}")
    return root


def _check_tls_files(config: AgentConfig) -> None:
    given = [p for p in (config.tls_ca, config.tls_cert, config.tls_key) if p is not None]
    if given and urlsplit(config.hub_url).scheme not in SECURE_SCHEMES:
        raise SettingsError(
            "CA, certificate and key files (--ca, --hub-ca, --cert, --key) "
            "apply to grpcs:// and mqtts:// hubs only"
        )
    if (config.tls_cert is None) != (config.tls_key is None):
        raise SettingsError("a client certificate needs both --cert and --key")
    if config.tls_ca is not None:
        check_certificates(config.tls_ca, "CA certificate")
    if config.tls_cert is not None and config.tls_key is not None:
        cert = check_certificates(config.tls_cert, "client certificate")[0]
        key = check_private_key(config.tls_key, "client key")
        if _spki(cert.public_key()) != _spki(key.public_key()):
            raise SettingsError(
                f"client certificate {config.tls_cert} is not for the key {config.tls_key}"
            )


def _spki(key: PublicKeyTypes) -> bytes:
    return key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _quote(value: str) -> str:
    """``repr(value)``, cut short so an error about a long value stays one line."""
    if len(value) <= _MAX_QUOTED_CHARS:
        return repr(value)
    return f"{value[:_MAX_QUOTED_CHARS]!r}... ({len(value)} characters)"


def _os_reason(exc: OSError) -> str:
    return exc.strerror or str(exc)
