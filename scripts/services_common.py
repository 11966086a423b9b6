"""What the test services' scripts share: processes, ports, files and the error they raise.

Only the standard library is used: these run before anything else is set up.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

HOST = "127.0.0.1"
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0


class ServiceError(Exception):
    """A service could not be found, installed, started or stopped; the message says why."""


def say(line: str) -> None:
    """Print one line of progress."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def run(argv: list[str], what: str, cwd: Path, log: Path | None = None) -> None:
    """Run ``argv`` in ``cwd`` to completion.

    Raises:
        ServiceError: it failed; its output (and the tail of ``log``) is in the message.
    """
    done = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=cwd)
    if done.returncode != 0:
        output = (done.stderr or done.stdout).strip().replace("\n", " | ")
        tail = f"; {tail_of(log)}" if log is not None else ""
        raise ServiceError(f"could not {what} (exit {done.returncode}): {output}{tail}")


def answers(port: int) -> bool:
    """Whether something accepts TCP connections on ``HOST:port``."""
    try:
        with socket.create_connection((HOST, port), timeout=1.0):
            return True
    except OSError:
        return False


def pick_port(previous: int | None) -> int:
    """``previous`` if nothing listens on it, else a port the kernel says is free.

    Raises:
        ServiceError: no port could be bound at all.
    """
    for port in ([previous] if previous else []) + [0]:
        with socket.socket() as sock:
            # As the servers do: connections of a stopped server in TIME_WAIT do not block it.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((HOST, port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise ServiceError(f"no free TCP port on {HOST}")


def exists(pid: int) -> bool:
    """Whether process ``pid`` exists, if only as a zombie nobody has reaped yet."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited (a zombie counts as gone)."""
    if not exists(pid):
        return False
    with contextlib.suppress(OSError, IndexError):
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def cmdline(pid: int) -> str:
    """Process ``pid``'s command line, its arguments joined by spaces ('' when unknown)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace")


def processes_in(folder: Path) -> list[int]:
    """The processes whose working directory is ``folder``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if (entry / "cwd").readlink() == folder:
                    found.append(int(entry.name))
    return found


def read_pid(path: Path) -> int | None:
    """The number on the first line of ``path``, if it has one."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    first = lines[0].strip() if lines else ""
    return int(first) if first.isdigit() else None


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one step."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def tail_of(log: Path | None, chars: int = 1500) -> str:
    """The end of a log file, for an error message."""
    try:
        text = log.read_text(errors="replace").strip() if log else ""
    except OSError:
        text = ""
    return f"log {log}: {text[-chars:]}" if text else f"no log in {log}"


def wait_for(check: Callable[[], bool], timeout_s: float) -> bool:
    """Poll ``check`` until it holds (True) or ``timeout_s`` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()
