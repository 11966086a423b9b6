#!/usr/bin/env python3
"""Run the Mosquitto and PostgreSQL the tests use: the project's own, on loopback, on free ports.

``python3 scripts/services.py`` (or ``start``) makes sure both are running and
writes their endpoints to ``.build/services/env``, which ``make test`` and
``make bench`` source before they start::

    EDGESKILL_TEST_MQTT=127.0.0.1:PORT
    EDGESKILL_TEST_PG=postgresql+psycopg2://postgres@127.0.0.1:PORT/test

Each service has its own folder under ``.build/services/`` (a generated
``mosquitto.conf``, or a cluster made by ``initdb``), its own pid file and its
own log. A run reuses instances that are alive and answering and restarts dead
ones, on their previous ports when those are still free. ``stop`` stops both
by their pid files. The system's services and their configs are never used.

Missing programs are installed with apt when running as root; otherwise the
command that installs them is printed. Only the standard library is used:
this runs before anything else is set up.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from services_common import HOST, ServiceError, say, write_atomic
from services_mqtt import Mosquitto
from services_pg import PG_DB, PG_USER, Postgres, find_bin

ROOT = Path(__file__).resolve().parent.parent
#: EDGESKILL_SERVICES_DIR moves the services elsewhere (a test runs its own pair there).
SERVICES_DIR = Path(os.environ.get("EDGESKILL_SERVICES_DIR") or ROOT / ".build" / "services")
MQTT_ENV = "EDGESKILL_TEST_MQTT"
PG_ENV = "EDGESKILL_TEST_PG"
#: Set to 1 to print the install command instead of running apt, even as root.
NO_INSTALL_ENV = "EDGESKILL_SERVICES_NO_INSTALL"
INSTALL = ["apt-get", "install", "-y", "mosquitto", "postgresql"]
_SBIN = ("/usr/local/sbin", "/usr/sbin", "/sbin")


def main(argv: Sequence[str]) -> int:
    """Start (the default) or stop the services, printing one line per service.

    Returns:
        0 on success; 1 with a one-line reason on stderr when a service cannot be
        installed, started or stopped; 2 for an unknown argument.
    """
    if len(argv) > 1 or (argv and argv[0] not in ("start", "stop")):
        sys.stderr.write(f"error: unknown arguments {' '.join(argv)!r}; expected start or stop\n")
        return 2
    folder = SERVICES_DIR.absolute()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with _locked(folder / ".lock"):
            if argv and argv[0] == "stop":
                stop(folder)
            else:
                start(folder)
    except (ServiceError, OSError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    return 0


def start(folder: Path) -> None:
    """Make sure both services run in ``folder`` and write ``folder/env``.

    Raises:
        ServiceError: a program is missing and cannot be installed, or a service did not start.
    """
    mosquitto, pg_bin = _programs()
    previous = _read_env(folder / "env")
    mqtt_port = Mosquitto(mosquitto, folder / "mosquitto").ensure(_port_of(previous.get(MQTT_ENV)))
    pg_port = Postgres(pg_bin, folder / "postgres").ensure(_port_of(previous.get(PG_ENV)))
    env = {
        MQTT_ENV: f"{HOST}:{mqtt_port}",
        PG_ENV: f"postgresql+psycopg2://{PG_USER}@{HOST}:{pg_port}/{PG_DB}",
    }
    write_atomic(folder / "env", "".join(f"{key}={value}\n" for key, value in env.items()))
    say(f"endpoints in {folder / 'env'}")


def stop(folder: Path) -> None:
    """Stop both services in ``folder`` by their pid files and remove ``folder/env``.

    Raises:
        ServiceError: a service did not stop.
    """
    Mosquitto("mosquitto", folder / "mosquitto").stop()
    pg_bin = find_bin()
    if pg_bin is not None:
        Postgres(pg_bin, folder / "postgres").stop()
    (folder / "env").unlink(missing_ok=True)


def _programs() -> tuple[str, Path]:
    """Mosquitto's path and PostgreSQL's bin folder, installed with apt first if missing.

    Raises:
        ServiceError: they are missing and this user cannot (or may not) install them.
    """
    mosquitto, pg_bin = _find_mosquitto(), find_bin()
    if mosquitto is not None and pg_bin is not None:
        return mosquitto, pg_bin
    found = (("mosquitto", mosquitto), ("PostgreSQL", pg_bin))
    missing = " and ".join(name for name, path in found if path is None)
    command = " ".join(INSTALL)
    if (
        os.geteuid() != 0
        or shutil.which("apt-get") is None
        or os.environ.get(NO_INSTALL_ENV) == "1"
    ):
        raise ServiceError(f"{missing} not installed; install with: sudo {command}")
    say(f"{missing} not installed; running: apt-get update && {command}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update"], INSTALL):
        if subprocess.run(argv, env=env, check=False).returncode != 0:
            raise ServiceError(f"{' '.join(argv)} failed; run it by hand, then try again")
    mosquitto, pg_bin = _find_mosquitto(), find_bin()
    if mosquitto is None or pg_bin is None:
        raise ServiceError(f"{command} ran, but mosquitto or PostgreSQL is still not found")
    return mosquitto, pg_bin


def _find_mosquitto() -> str | None:
    return shutil.which("mosquitto") or shutil.which("mosquitto", path=os.pathsep.join(_SBIN))


def _port_of(value: str | None) -> int | None:
    """The port of ``host:port``, or of a URL's ``host:port/database``, if there is one."""
    found = re.search(r":(\d{1,5})(?:/[^:]*)?$", value or "")
    return int(found.group(1)) if found else None


def _read_env(path: Path) -> dict[str, str]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    return dict(line.split("=", 1) for line in lines if "=" in line)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock, so two runs at once do not start two of each service."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
