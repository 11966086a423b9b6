"""scripts/services.sh: the tests' own Mosquitto and PostgreSQL: start, reuse, restart, stop.

The script runs here for real, in a folder of the test's own (so it never
touches the pair that ``make test`` started), with apt switched off.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.reasoncodes import ReasonCode
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

from tests.support import wait_until
from tests.support.services import MQTT_ENV, PG_ENV, mqtt_host_port, mqtt_url, postgres_urls

pytestmark = [pytest.mark.mqtt, pytest.mark.postgres]

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "services.sh"


def services(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "EDGESKILL_SERVICES_DIR": str(folder),
        "EDGESKILL_SERVICES_NO_INSTALL": "1",
    }
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def read_env(folder: Path) -> dict[str, str]:
    lines = (folder / "env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines)


def mqtt_connects(host_port: str) -> bool:
    """A real MQTT 5 CONNECT answered by a successful CONNACK."""
    host, port = host_port.rsplit(":", 1)
    accepted = threading.Event()

    def on_connect(_c: mqtt.Client, _u: object, _f: object, reason: ReasonCode, _p: object) -> None:
        if not reason.is_failure:
            accepted.set()

    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    client.on_connect = on_connect
    try:
        client.connect(host, int(port))
    except OSError:
        return False
    client.loop_start()
    try:
        return accepted.wait(5)
    finally:
        client.disconnect()
        client.loop_stop()


def listens(host_port: str) -> bool:
    host, port = host_port.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
    except OSError:
        return False
    return True


def database_of(url: str) -> str:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return str(conn.execute(text("SELECT current_database()")).scalar_one())
    finally:
        engine.dispose()


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[Path]:
    """A services folder; whatever the test started there is stopped afterwards."""
    where = tmp_path / "services"
    yield where
    services(where, "stop")


def test_start_reuse_restart_and_stop(folder: Path) -> None:
    first = services(folder)
    assert first.returncode == 0, first.stderr
    env = read_env(folder)
    assert env[MQTT_ENV].startswith("127.0.0.1:")
    assert not env[MQTT_ENV].endswith(":1883")
    assert ":5432/" not in env[PG_ENV]
    assert mqtt_connects(env[MQTT_ENV])
    assert database_of(env[PG_ENV]) == "test"
    mqtt_pid = int((folder / "mosquitto" / "mosquitto.pid").read_text())
    pg_pid = int((folder / "postgres" / "data" / "postmaster.pid").read_text().split()[0])

    again = services(folder)
    assert again.returncode == 0, again.stderr
    assert f"mosquitto: reusing {env[MQTT_ENV]} (pid {mqtt_pid})" in again.stdout
    pg_host_port = env[PG_ENV].split("@")[1].split("/")[0]
    assert f"postgresql: reusing {pg_host_port} (pid {pg_pid})" in again.stdout
    assert read_env(folder) == env

    os.kill(mqtt_pid, signal.SIGTERM)  # the broker dies; the next run starts it on its old port
    wait_until(lambda: not listens(env[MQTT_ENV]), 10, "the broker to stop")
    restarted = services(folder)
    assert restarted.returncode == 0, restarted.stderr
    assert f"mosquitto: started on {env[MQTT_ENV]}" in restarted.stdout
    assert read_env(folder) == env
    assert mqtt_connects(env[MQTT_ENV])

    stopped = services(folder, "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert not (folder / "env").exists()
    assert not mqtt_connects(env[MQTT_ENV])
    with pytest.raises(OperationalError, match="Connection refused"):
        database_of(env[PG_ENV])


def test_a_bad_argument_is_refused(folder: Path) -> None:
    done = services(folder, "restart")
    assert done.returncode == 2
    assert done.stderr == "error: unknown arguments 'restart'; expected start or stop\n"
    assert not folder.exists()


def test_the_helpers_read_only_the_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MQTT_ENV, "127.0.0.1:41234")
    monkeypatch.setenv(PG_ENV, "postgresql+psycopg2://postgres@127.0.0.1:41235/test")
    assert mqtt_host_port() == ("127.0.0.1", 41234)
    assert mqtt_url("es/x", keepalive=5) == "mqtt://127.0.0.1:41234/es/x?keepalive=5"
    assert postgres_urls() == ("postgresql+psycopg2://postgres@127.0.0.1:41235/test",)
    monkeypatch.setenv(MQTT_ENV, "127.0.0.1")
    with pytest.raises(ValueError, match=f"{MQTT_ENV}='127.0.0.1' is not HOST:PORT"):
        mqtt_host_port()
