"""The tests' own PostgreSQL: a cluster made by ``initdb``, run by ``pg_ctl``, in one folder.

PostgreSQL refuses to run as root, so as root its programs run as an
unprivileged user (``postgres`` if it exists, else ``nobody``) who owns the
folder. When that user cannot reach the folder (a checkout under ``/root``), it
is given a capability to traverse folders, and nothing more.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import subprocess
from pathlib import Path

from services_common import (
    HOST,
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    ServiceError,
    alive,
    answers,
    cmdline,
    exists,
    pick_port,
    processes_in,
    read_pid,
    run,
    say,
    wait_for,
)

PG_USER, PG_DB = "postgres", "test"
PROGRAMS = ("initdb", "pg_ctl", "postgres", "createdb")
#: Capabilities (name, bit) that let a process enter folders whose mode keeps it out.
_TRAVERSE_CAPS = (("dac_read_search", 2), ("dac_override", 1))
_SETTINGS = """
# Added by scripts/services.py: a throwaway cluster for the tests, TCP on loopback only.
listen_addresses = '127.0.0.1'
unix_socket_directories = ''
fsync = off
synchronous_commit = off
full_page_writes = off
"""


class Postgres:
    """A cluster in ``folder/data`` logging to ``folder/postgres.log``."""

    def __init__(self, bin_dir: Path, folder: Path) -> None:
        self.bin = bin_dir
        self.folder = folder
        self.data = folder / "data"
        self.log = folder / "postgres.log"

    def ensure(self, previous_port: int | None) -> int:
        """Reuse the running cluster if it answers, else (re)start it; make database ``test``.

        Returns:
            The port it listens on: ``previous_port`` when that is free or reused.

        Raises:
            ServiceError: initdb, pg_ctl or createdb failed (their output is in the message).
        """
        runner = self._runner()
        port = self._running_port()
        if port is not None and answers(port):
            say(f"postgresql: reusing {HOST}:{port} (pid {self.pid()})")
        else:
            self.stop()
            self._wait_for_leftovers()
            if not (self.data / "PG_VERSION").exists():
                self._initdb(runner)
            port = pick_port(previous_port)
            pg_ctl = [str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.log)]
            start = ["-w", "-t", str(int(START_TIMEOUT_S)), "-o", f"-p {port}", "start"]
            run([*runner, *pg_ctl, *start], "start PostgreSQL", self.folder, self.log)
            say(f"postgresql: started on {HOST}:{port} (pid {self.pid()})")
        self._create_database(port)
        return port

    def stop(self) -> None:
        """Stop the cluster (fast shutdown) if it runs.

        Raises:
            ServiceError: pg_ctl could not stop it.
        """
        pid = self.pid()
        if pid is None:
            return
        pg_ctl = [str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"]
        run([*self._runner(), *pg_ctl], "stop PostgreSQL", self.folder)
        say(f"postgresql: stopped (pid {pid})")

    def pid(self) -> int | None:
        """The postmaster's pid when it is alive and serves this data folder."""
        pid = read_pid(self.data / "postmaster.pid")
        if pid is None or not alive(pid) or str(self.data) not in cmdline(pid):
            return None
        return pid

    def _running_port(self) -> int | None:
        if self.pid() is None:
            return None
        with contextlib.suppress(OSError, IndexError, ValueError):
            return int((self.data / "postmaster.pid").read_text().splitlines()[3])
        return None

    def _wait_for_leftovers(self) -> None:
        """Wait until a killed postmaster is reaped and its children have noticed and exited.

        Until then a new postmaster refuses to start: the old pid still exists, or the
        cluster's shared memory is still in use.
        """
        old = read_pid(self.data / "postmaster.pid")

        def gone() -> bool:
            return not processes_in(self.data) and (old is None or not exists(old))

        if not wait_for(gone, STOP_TIMEOUT_S):
            left = " ".join(map(str, [*processes_in(self.data), old]))
            raise ServiceError(f"processes {left} of a stopped PostgreSQL are still there")

    def _initdb(self, runner: list[str]) -> None:
        fresh = self.folder / "data.new"
        shutil.rmtree(fresh, ignore_errors=True)
        initdb = [str(self.bin / "initdb"), "-D", str(fresh), "-A", "trust", "-U", PG_USER]
        options = ["-E", "UTF8", "--locale=C", "--no-sync"]
        run([*runner, *initdb, *options], "initdb", self.folder)
        with (fresh / "postgresql.conf").open("a") as conf:
            conf.write(_SETTINGS)
        shutil.rmtree(self.data, ignore_errors=True)
        fresh.rename(self.data)

    def _create_database(self, port: int) -> None:
        argv = [str(self.bin / "createdb"), "-h", HOST, "-p", str(port), "-U", PG_USER, PG_DB]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0 and "already exists" not in done.stderr:
            raise ServiceError(f"createdb {PG_DB} failed: {done.stderr.strip()}")

    def _runner(self) -> list[str]:
        """The command prefix that runs PostgreSQL's programs as a user who is not root.

        Raises:
            ServiceError: the folder belongs to someone else, or no such user can reach it.
        """
        self.folder.mkdir(parents=True, exist_ok=True)
        if os.geteuid() != 0:
            owner = self.folder.stat().st_uid
            if owner != os.geteuid():
                raise ServiceError(
                    f"{self.folder} belongs to uid {owner}; remove it or run as them"
                )
            return []
        account = _service_account(self.folder)
        for path in (self.folder, *self.folder.rglob("*")):
            os.lchown(path, account.pw_uid, account.pw_gid)
        self.folder.chmod(0o700)
        base = ["setpriv", f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}"]
        base.append("--clear-groups")
        probe = subprocess.run([*base, "test", "-w", str(self.folder)], check=False, cwd="/")
        if probe.returncode == 0:
            return [*base, "--"]
        cap = _traverse_cap()
        if cap is None:
            raise ServiceError(
                f"user {account.pw_name} cannot reach {self.folder}: let it traverse the "
                "parent folders (chmod o+x), or run as a regular user"
            )
        return [*base, f"--inh-caps=+{cap}", f"--ambient-caps=+{cap}", "--"]


def find_bin() -> Path | None:
    """The folder holding initdb, pg_ctl, postgres and createdb.

    Looked up on PATH, else the newest ``/usr/lib/postgresql/<version>/bin``
    (where Debian and Ubuntu keep them).
    """
    on_path = shutil.which("pg_ctl")
    candidates = [Path(on_path).resolve().parent] if on_path else []
    versions = Path("/usr/lib/postgresql").glob("*/bin")
    candidates += sorted(versions, key=lambda p: _version_key(p.parent.name), reverse=True)
    return next((d for d in candidates if all((d / p).is_file() for p in PROGRAMS)), None)


def _version_key(name: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", name))


def _service_account(folder: Path) -> pwd.struct_passwd:
    """The account PostgreSQL runs as when we are root: the folder's owner unless that is root."""
    owner = folder.stat().st_uid
    if owner != 0:
        return pwd.getpwuid(owner)
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise ServiceError("PostgreSQL cannot run as root and there is no user 'postgres' or 'nobody'")


def _traverse_cap() -> str | None:
    """A capability in our bounding set that lets a process enter any folder, if any."""
    status = Path("/proc/self/status").read_text()
    found = re.search(r"^CapBnd:\s*([0-9a-f]+)$", status, re.MULTILINE)
    bounding = int(found.group(1), 16) if found else 0
    return next((name for name, bit in _TRAVERSE_CAPS if bounding >> bit & 1), None)
