"""The link emulator in a process of its own, so busy benchmark threads cannot slow it.

Run as ``python linkproc.py HOST PORT``: it starts an :class:`~edgeskill.linkemu.LinkEmulator`
towards ``HOST:PORT``, prints the port it listens on, then reads one JSON object per
line from stdin (``{"rate_bps": 125000.0, "rtt_ms": 100.0}``), shapes both directions
with it and answers ``ok``; it ends at the end of its input.

A link of ``rtt_ms`` delays each direction by half of it, so a round trip of a small
message takes ``rtt_ms``; ``rate_bps`` (bytes per second) limits each direction alone.
:class:`LinkProcess` is the parent's handle on such a child.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import TracebackType

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from edgeskill.linkemu import Shape, emulate_in_thread


def shape_of(rate_bps: float | None, rtt_ms: float) -> Shape:
    """One direction of a link with round trip ``rtt_ms``: half the delay each way."""
    return Shape(rate_bps=rate_bps, delay_ms=rtt_ms / 2.0)


class LinkProcess:
    """A child process running the link emulator towards ``target``.

    Args:
        target: Where the emulated link leads (``host``, ``port``).

    Raises:
        OSError: The child could not be started.
        RuntimeError: It did not report its port.
    """

    def __init__(self, target: tuple[str, int]) -> None:
        argv = [sys.executable, __file__, target[0], str(target[1])]
        self._proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline().strip()
        if not line.isdigit():
            self.close()
            raise RuntimeError(f"the link emulator did not start: {line!r}")
        self.port = int(line)
        self.pid = self._proc.pid

    def shape(self, rate_bps: float | None, rtt_ms: float) -> None:
        """Shape both directions from now on.

        Raises:
            RuntimeError: The child did not acknowledge.
        """
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(json.dumps({"rate_bps": rate_bps, "rtt_ms": rtt_ms}) + "\n")
        self._proc.stdin.flush()
        answer = self._proc.stdout.readline().strip()
        if answer != "ok":
            raise RuntimeError(f"the link emulator answered {answer!r}")

    def close(self) -> None:
        """End the child (its input closes) and wait for it."""
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            self._proc.stdin.close()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def __enter__(self) -> LinkProcess:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def main() -> None:
    """Serve the emulated link until stdin ends."""
    host, port = sys.argv[1], int(sys.argv[2])
    with emulate_in_thread((host, port)) as link:
        print(link.port, flush=True)
        for line in sys.stdin:
            wanted = json.loads(line)
            shape = shape_of(wanted["rate_bps"], float(wanted["rtt_ms"]))
            link.set_shape(up=shape, down=shape)
            print("ok", flush=True)


if __name__ == "__main__":
    main()
