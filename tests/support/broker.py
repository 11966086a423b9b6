"""A Mosquitto of the test's own, started with the config the project generates.

:func:`tls_broker` writes the config with :func:`cloud.broker.write_broker_config`
for a hub home, starts ``mosquitto -c`` on a free loopback port, waits for the
port and stops that one process (by its pid) at the end. Clients get URLs with
the hub's CA and a certificate: :meth:`TlsBroker.hub_url` for the hub, and
:meth:`TlsBroker.device_url` for a device whose certificate the CA issues here.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlencode

from cloud.broker import hub_client_cert, write_broker_config
from cloud.pki import PKI_DIR, CertificateAuthority, IssuedCert
from edgeskill.processes import find_program, wait_for_port
from tests.support.ports import free_port

__all__ = ["TlsBroker", "tls_broker"]

_STOP_TIMEOUT_S = 10.0


@dataclass
class TlsBroker:
    """A running project-owned Mosquitto: its files, port, prefix and process."""

    home: Path
    work: Path
    port: int
    prefix: str
    config: Path
    proc: subprocess.Popen[bytes] | None = None
    _issued: dict[str, IssuedCert] = field(default_factory=dict)

    @property
    def ca(self) -> Path:
        """The hub CA's certificate, which the broker's certificate chains to."""
        return self.home / PKI_DIR / "ca.crt"

    @property
    def log(self) -> Path:
        """The broker's log file."""
        return self.work / "mosquitto.log"

    def url(self, cert: IssuedCert | None, query: str = "session_expiry=30&keepalive=5") -> str:
        """An ``mqtts://`` URL of this broker with the CA and, if given, a client certificate."""
        files = {"ca": str(self.ca)}
        if cert is not None:
            files |= {"cert": str(cert.cert), "key": str(cert.key)}
        tls = urlencode(files, quote_via=quote)
        return f"mqtts://127.0.0.1:{self.port}/{self.prefix}?{query}&{tls}"

    def hub_url(self, query: str = "session_expiry=30&keepalive=5") -> str:
        """The URL the hub connects with (its ``hub`` client certificate)."""
        return self.url(hub_client_cert(self.home), query)

    def device_cert(self, device_id: str) -> IssuedCert:
        """A client certificate for ``device_id`` from the hub's CA (issued once per test)."""
        if device_id not in self._issued:
            ca = CertificateAuthority.open_or_create(self.home / PKI_DIR)
            self._issued[device_id] = ca.issue(device_id, self.work / "devices", device_id)
        return self._issued[device_id]

    def device_url(self, device_id: str, query: str = "session_expiry=30&keepalive=5") -> str:
        """The URL a device connects with, carrying its own certificate."""
        return self.url(self.device_cert(device_id), query)

    def start(self) -> None:
        """Start Mosquitto and wait until it listens.

        Raises:
            TimeoutError: the broker did not listen in time (its log is in the message).
        """
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [_mosquitto(), "-c", str(self.config)], stdout=out, stderr=subprocess.STDOUT
            )
        try:
            wait_for_port(self.port, 10.0)
        except TimeoutError as exc:
            self.stop()
            raise TimeoutError(f"{exc}; broker log: {self.log.read_text()[-2000:]}") from exc

    def reload(self) -> None:
        """Send the broker SIGHUP (Mosquitto then reloads its ACL and certificates)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGHUP)

    def restart(self) -> None:
        """Stop and start the broker again on the same port (rereads every file)."""
        self.stop()
        self.start()

    def stop(self) -> None:
        """Stop the broker this helper started: SIGTERM, then SIGKILL after a while."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _mosquitto() -> str:
    found = find_program("mosquitto")
    if found is None:
        raise FileNotFoundError("mosquitto is not installed")
    return found


@contextlib.contextmanager
def tls_broker(home: Path, work: Path, prefix: str | None = None) -> Iterator[TlsBroker]:
    """Run a Mosquitto with the generated TLS config and ACL for the hub home ``home``.

    Args:
        home: a hub home; its CA is made if it has none.
        work: a folder for the broker's files, its log and issued device certificates.
        prefix: the topic prefix (a fresh one by default).

    Yields:
        The running broker; it is stopped when the block ends.
    """
    prefix = prefix or f"es-test/{uuid.uuid4().hex[:12]}"
    port = free_port()
    # run_as stays the default, the user running the tests: it owns the broker's 0600 key
    # and the private temp folders, which Mosquitto's default as root (user mosquitto) cannot read.
    config = write_broker_config(home, work / "broker", port=port, prefix=prefix)
    broker = TlsBroker(home=home, work=work, port=port, prefix=prefix, config=config)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()
