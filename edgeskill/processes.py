"""Running EdgeSkill as child processes: ports, waiting, agent arguments, a group of children.

The demo starts its hub and agents with these (and, over MQTT, its broker);
the integration tests do the same. :func:`settle_collector` tunes the garbage
collector of a process that holds a fleet's worth of objects (a hub, a
simulator's worker).
"""

from __future__ import annotations

import contextlib
import gc
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "SERVER_PORTS",
    "Fleet",
    "Usage",
    "agent_args",
    "bindable",
    "find_program",
    "free_port",
    "settle_collector",
    "stop_strays",
    "usage",
    "wait_for_port",
    "wait_until",
]

# Where daemons such as mosquitto live, which a user's PATH often lacks.
_SBIN = ("/usr/local/sbin", "/usr/sbin", "/sbin")


@dataclass
class Fleet:
    """Child processes of the demo (or a test), stopped together."""

    logs: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        """Start ``edgeskill ARGS`` as a child named ``name``, logging to a file.

        Raises:
            OSError: the child could not be started.
        """
        return self.spawn(name, [sys.executable, "-m", "edgeskill.cli", *args])

    def spawn(
        self, name: str, argv: list[str], env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start any program (``argv[0]``, a path) as a child named ``name``, logging to a file.

        ``env`` adds to (or overrides) this process's environment.

        Raises:
            OSError: the program could not be started.
        """
        self.logs.mkdir(parents=True, exist_ok=True)
        with (self.logs / f"{name}.log").open("ab") as log:
            full = {**os.environ, "GRPC_VERBOSITY": "ERROR", "PYTHONUNBUFFERED": "1", **(env or {})}
            proc = subprocess.Popen(argv, stdout=log, stderr=log, env=full)
        self.procs[name] = proc
        return proc

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout_s: float = 10.0) -> None:
        """Stop one child: ``sig`` first, SIGKILL after ``timeout_s``."""
        proc = self.procs.pop(name)
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def stop_all(self) -> None:
        """Stop every child."""
        for name in list(self.procs):
            self.stop(name)


@dataclass(frozen=True)
class Usage:
    """What a process has used so far: CPU seconds (user + system) and peak resident MiB."""

    cpu_s: float
    peak_rss_mb: float


def usage(pid: int) -> Usage | None:
    """The CPU and peak memory of a running process and its children (Linux ``/proc``); None
    once it is gone.

    A process's work done in its children counts as its own (a hub's rollout passes
    run in one): the CPU of the children it has waited for, and of those running
    now, with their peak memory added to its own.
    """
    own = _stat(pid)
    if own is None:
        return None
    cpu_s, peak_mb = own[1] + own[2], own[3]
    for child in _children(pid):
        found = _stat(child)
        if found is not None and found[0] == pid:
            cpu_s, peak_mb = cpu_s + found[1] + found[2], peak_mb + found[3]
    return Usage(cpu_s, peak_mb)


def _stat(pid: int) -> tuple[int, float, float, float] | None:
    """``(parent, own CPU s, waited-for children's CPU s, peak MiB)`` of a process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    peak_kb = next(
        (int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), 0
    )
    own_s = (int(stat[11]) + int(stat[12])) / ticks
    return int(stat[1]), own_s, (int(stat[13]) + int(stat[14])) / ticks, peak_kb / 1024


def _children(pid: int) -> list[int]:
    """The ids of the processes running now whose parent is ``pid`` (one level)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = entry.joinpath("stat").read_text().rsplit(")", 1)[1].split()[1]
            except (OSError, IndexError):
                continue
            if int(parent) == pid:
                found.append(int(entry.name))
    return found


def stop_strays(timeout_s: float = 10.0) -> list[int]:
    """SIGTERM every child process of this one still running, SIGKILL after ``timeout_s``.

    For the end of a run whose children were each stopped by name: a SIGTERM that
    lands while ``subprocess.Popen`` waits for its new child to exec raises out of it
    with the child running and recorded nowhere. Returns the pids it stopped.
    """
    strays = _children(os.getpid())
    for pid in strays:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for pid in strays:
        while not _reaped(pid):
            if time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
                break
            time.sleep(0.05)
    return strays


def _reaped(pid: int) -> bool:
    """Whether a child has ended (it is reaped here if it has)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not ours to wait for, or reaped already
        return not Path(f"/proc/{pid}").exists()
    return done == pid


def find_program(name: str) -> str | None:
    """The path of the program ``name``: on PATH, or in the usual sbin folders."""
    return shutil.which(name) or shutil.which(name, path=os.pathsep.join(_SBIN))


#: Where :func:`free_port` looks: under Linux's ephemeral range and under the blocks the
#: test processes draw their own servers' ports from (16000 and up).
SERVER_PORTS = range(10000, 16000)
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: Ports this process handed out: a server started later may still be binding them.
_handed: set[int] = set()


def bindable(port: int) -> bool:
    """Whether a socket can bind ``port`` on the loopback interface now."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ephemeral_low() -> int:
    try:
        return int(_EPHEMERAL_RANGE.read_text(encoding="ascii").split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port() -> int:
    """A loopback TCP port free right now, and the port after it free too.

    A hub listens on the port after its gRPC port for enrolment. Ports come from
    :data:`SERVER_PORTS`, under the kernel's ephemeral range: one from ``bind(0)``
    is in that range, where every outgoing connection takes its local port, and a
    hub restarted on it found its enrolment port taken by an agent's connection
    (exit 2, "already in use"). Where the ephemeral range starts lower, the kernel
    picks.

    Raises:
        OSError: no free pair of ports was found.
    """
    low = _ephemeral_low()
    ports = range(SERVER_PORTS.start, min(SERVER_PORTS.stop, low - 1))
    if len(ports) >= 2:
        start = random.randrange(len(ports))
        for i in range(0, len(ports), 2):
            port = ports[(start + i) % len(ports)]
            if {port, port + 1} & _handed or port + 1 >= low:
                continue
            if bindable(port) and bindable(port + 1):
                _handed.update((port, port + 1))
                return port
    for _ in range(50):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port < 65535 and bindable(port + 1):
            return port
    raise OSError("no two adjacent free ports on the loopback interface")


def wait_for_port(
    port: int, timeout_s: float = 90.0, proc: subprocess.Popen[bytes] | None = None
) -> None:
    """Block until something listens on ``port``; with ``proc``, only while it runs.

    The default deadline is long: a hub that loads its models on a two-core machine
    busy with other work took more than 30 s to listen. Give ``proc`` so that a
    process that exits is said at once rather than at the deadline.

    Raises:
        TimeoutError: nothing listened in time.
        ChildProcessError: ``proc`` exited before anything listened.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        if proc is not None and proc.poll() is not None:
            code = proc.returncode
            raise ChildProcessError(f"process {proc.pid} exited ({code}) before port {port} opened")
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on port {port}")


def wait_until(
    check: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.25
) -> None:
    """Poll ``check`` until it holds.

    Raises:
        TimeoutError: it did not hold within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(interval_s)
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def agent_args(
    hub_url: str,
    device_id: str,
    labels: list[str],
    state: Path,
    root: Path,
    source: Path | None,
    board: str | None = None,
) -> list[str]:
    """Command-line arguments of ``edgeskill agent run`` for one device."""
    args = ["agent", "run", "--hub", hub_url, "--device-id", device_id, "--state-dir", str(state)]
    args += ["--trusted-root", str(root), "--telemetry-window", "1"]
    for label in labels:
        args += ["--label", label]
    if source is not None:
        args += ["--source", str(source)]
    if board is not None:
        args += ["--board", board]
    return args


def settle_collector(young: int) -> int:
    """Freeze every object alive now, and run young collections every ``young`` allocations.

    For a process that holds thousands of devices' objects. Frozen objects are
    never walked again by the collector; Python's young collection every 700
    container allocations, with the middle and full ones it leads to, took a
    fifth of a simulator worker's time in a fleet upgrade and 7% of a hub's.
    Reference counting frees most garbage at once either way; only cycles wait
    for the collector. Returns how many objects are frozen.
    """
    gc.collect()
    gc.freeze()
    _, middle, full = gc.get_threshold()
    gc.set_threshold(young, middle, full)
    return gc.get_freeze_count()
