"""Sampling the hub during a benchmark phase with py-spy, and its top functions as text.

py-spy is optional (``pip install py-spy``); without it, or without the right to
trace the hub, the benchmark says so and carries on unprofiled.
"""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter
from pathlib import Path

TOP = 15


class HubProfile:
    """Records the hub process for one phase at a time; writes collapsed stacks and a summary."""

    def __init__(self, pid: int, folder: Path) -> None:
        self.pid, self.folder = pid, folder
        self.program = shutil.which("py-spy")
        self._proc: subprocess.Popen[bytes] | None = None
        self._out: Path | None = None

    def start(self, name: str, seconds: float) -> None:
        """Sample the hub for ``seconds``: the thread holding the GIL, idle time left out."""
        if self.program is None:
            print("py-spy is not installed; no profile")
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        self._out = self.folder / f"hub-profile-{name}.txt"
        argv = [self.program, "record", "--pid", str(self.pid), "--duration", str(int(seconds))]
        argv += ["--rate", "200", "--format", "raw", "--output", str(self._out), "--nonblocking"]
        argv += ["--gil"]  # the thread holding the GIL: where Python time goes, not I/O waits
        self._proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def finish(self) -> None:
        """Wait for the recording and print where the hub's time went."""
        if self._proc is None or self._out is None:
            return
        _, err = self._proc.communicate(timeout=60)
        self._proc = None
        if not self._out.exists():
            print(f"py-spy recorded nothing: {err.decode(errors='replace').strip()[-300:]}")
            return
        print(summary(self._out))


def summary(collapsed: Path, top: int = TOP) -> str:
    """The functions with the most samples, by own time and by time including callees."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [f for f in stack.split(";") if not f.startswith("process ")]
        total += n
        if frames:
            own[_short(frames[-1])] += n
        for frame in {_short(f) for f in frames}:
            inclusive[frame] += n
    lines = [f"{collapsed.name}: {total} samples", "own time:"]
    lines += [f"  {100 * n / total:5.1f}%  {f}" for f, n in own.most_common(top)]
    lines.append("including callees:")
    lines += [f"  {100 * n / total:5.1f}%  {f}" for f, n in inclusive.most_common(top)]
    return "\n".join(lines)


def _short(frame: str) -> str:
    """``fn (path/to/module.py:123)`` -> ``fn (module.py)``."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rpartition(":")[0]
    return f"{name} ({Path(path).name})" if path else name
