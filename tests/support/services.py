"""Where the tests find Mosquitto and PostgreSQL: only through two environment variables.

``make test`` runs ``scripts/services.sh``, which starts the project's own
Mosquitto and PostgreSQL on free loopback ports, and exports the endpoints
it writes to ``.build/services/env``:

- ``EDGESKILL_TEST_MQTT``: ``HOST:PORT`` of a broker that lets anyone in;
- ``EDGESKILL_TEST_PG``: a SQLAlchemy URL of a database (``test``, trust auth).

When they are unset (a bare ``pytest`` on a machine whose system services
are set up that way), the tests use 127.0.0.1:1883 and PostgreSQL on
127.0.0.1:5432 as ``postgres`` or ``root``.
"""

from __future__ import annotations

import os
from urllib.parse import urlencode

__all__ = [
    "DEFAULT_MQTT",
    "DEFAULT_PG_URLS",
    "MQTT_ENV",
    "PG_ENV",
    "mqtt_host_port",
    "mqtt_url",
    "postgres_urls",
]

MQTT_ENV = "EDGESKILL_TEST_MQTT"
PG_ENV = "EDGESKILL_TEST_PG"
DEFAULT_MQTT = ("127.0.0.1", 1883)
DEFAULT_PG_URLS = (
    "postgresql+psycopg2://postgres@127.0.0.1:5432/test",
    "postgresql+psycopg2://root@127.0.0.1:5432/test",
)


def mqtt_host_port() -> tuple[str, int]:
    """The test broker's host and port: ``EDGESKILL_TEST_MQTT``, else 127.0.0.1:1883.

    Raises:
        ValueError: the variable is set but is not ``HOST:PORT``.
    """
    value = os.environ.get(MQTT_ENV, "").strip()
    if not value:
        return DEFAULT_MQTT
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{MQTT_ENV}={value!r} is not HOST:PORT")
    return host, int(port)


def mqtt_url(prefix: str, **query: str | int) -> str:
    """An ``mqtt://`` URL of the test broker with a topic prefix and query options.

    Example: ``mqtt_url("es-test/abc", session_expiry=30, keepalive=5)``.
    """
    host, port = mqtt_host_port()
    url = f"mqtt://{host}:{port}/{prefix}"
    return f"{url}?{urlencode(query)}" if query else url


def postgres_urls() -> tuple[str, ...]:
    """The PostgreSQL URLs to try, in order: ``EDGESKILL_TEST_PG`` alone when it is set."""
    value = os.environ.get(PG_ENV, "").strip()
    return (value,) if value else DEFAULT_PG_URLS
