"""Waiting for a child's port (a child that dies is said at once), and what a process used."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgeskill.processes import SERVER_PORTS, free_port, usage, wait_for_port


def test_a_child_that_exits_before_listening_is_said_at_once() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    started = time.monotonic()
    with pytest.raises(ChildProcessError, match=rf"process {proc.pid} exited \(3\)"):
        wait_for_port(free_port(), 60, proc)
    assert time.monotonic() - started < 30  # not the 60 s timeout


def test_a_listening_port_returns_and_a_silent_one_times_out() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        wait_for_port(listener.getsockname()[1], 5)
    with pytest.raises(TimeoutError, match="nothing listens"):
        wait_for_port(free_port(), 0.3)


def test_free_ports_lie_under_the_ephemeral_range_with_their_neighbour_free() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [free_port() for _ in range(20)]
    for port in ports:
        assert port in SERVER_PORTS and port + 1 < low
        for taken in (port, port + 1):
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", taken))  # free: nothing of ours holds it
    # Each pair handed out once: a hub not yet listening keeps its enrolment port.
    assert len({p for port in ports for p in (port, port + 1)}) == 2 * len(ports)


#: A parent that waits while a child it started spins for half a CPU second, then says
#: its pid and sleeps.
_SPINNING_CHILD = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c",
    "import os, time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.5: pass\\n"
    "print(os.getpid(), flush=True)\\ntime.sleep(60)"], stdout=sys.stdout)
child.wait()
"""


def test_a_process_s_usage_counts_the_children_it_runs() -> None:
    proc = subprocess.Popen([sys.executable, "-c", _SPINNING_CHILD], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    with proc.stdout:
        child = int(proc.stdout.readline())
        try:
            used = usage(proc.pid)
            assert used is not None
            assert used.cpu_s >= 0.5  # the child's spin: the parent alone only started it
            assert used.peak_rss_mb > 0
        finally:
            os.kill(child, signal.SIGKILL)
            proc.wait(10)
    assert usage(proc.pid) is None  # gone and waited for


#: A process that starts two children it records nowhere (one ignores SIGTERM), stops
#: them with ``stop_strays`` and prints what it stopped and which are still running.
_STRAYS = """
import os, signal, subprocess, sys
from edgeskill.processes import stop_strays
polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]).pid
stubborn = subprocess.Popen([sys.executable, "-c",
    "import signal, sys, time\\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
    "print('ready', flush=True)\\ntime.sleep(60)"], stdout=subprocess.PIPE)
stubborn.stdout.readline()  # its SIGTERM handler is in place
stopped = stop_strays(timeout_s=1.0)
alive = [p for p in (polite, stubborn.pid) if os.path.exists(f"/proc/{p}")]
print(sorted(stopped) == sorted([polite, stubborn.pid]), alive)
"""


def test_children_recorded_nowhere_are_stopped_and_reaped_and_a_stubborn_one_killed() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _STRAYS], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == "True []", done.stdout + done.stderr
