"""Ports for the servers tests start, clear of each other and of outgoing connections.

A port from ``bind(("127.0.0.1", 0))`` comes out of the kernel's ephemeral
range, the same range outgoing connections take their local ports from: with
many clients about (and tests on two workers), another socket can take it, or
the port after it (the hub's enrolment port), before the server binds. Here
each test process draws from its own block below the ephemeral range
(``PYTEST_XDIST_WORKER`` ``gw0``, ``gw1``, ... get the blocks after the
serial run's), walking it from a random start and handing out each port once.
"""

from __future__ import annotations

import os
import random
import threading

from edgeskill.processes import bindable

__all__ = ["free_port"]

_FIRST = 16000
_BLOCK = 2000
_MAX_BLOCKS = 8  # 16000..31999: under Linux's default ephemeral range (32768..)
_lock = threading.Lock()
_state: dict[str, int] = {}


def _block() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    digits = worker[2:] if worker.startswith("gw") else ""
    index = int(digits) + 1 if digits.isdigit() else 0
    return _FIRST + (index % _MAX_BLOCKS) * _BLOCK


def free_port() -> int:
    """A loopback TCP port free now, from this process's block (each reused only after 1,000).

    Raises:
        OSError: every port of the block was handed out or is taken.
    """
    with _lock:
        if "next" not in _state:
            _state["next"] = random.randrange(_BLOCK)
        base = _block()
        for _ in range(_BLOCK):
            offset = _state["next"]
            _state["next"] = (offset + 2) % _BLOCK  # the odd neighbour stays free for pairs
            if bindable(base + offset):
                return base + offset
    raise OSError(f"no free port left in {base}..{base + _BLOCK - 1}")
