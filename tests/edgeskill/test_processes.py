"""Waiting for a child's port: a child that dies is said at once, not after the timeout."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from edgeskill.processes import free_port, wait_for_port


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
