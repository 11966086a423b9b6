"""`edgeskill demo` runs end to end: hub and three agent processes, deploy to cameras only.

Both transports run authenticated: every agent enrols with a claim token; over
MQTT through the demo's own TLS broker, which names each client by its
certificate and is gone once the demo ends.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["grpc", "mqtt"])
def test_demo_runs_end_to_end(tmp_path: Path, transport: str) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgeskill.cli",
            "demo",
            "--workdir",
            str(tmp_path),
            "--transport",
            transport,
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env={"COLUMNS": "160", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {m.group(1): m.group(0) for m in re.finditer(r"│ (cam-\d|gw-\d) .*", result.stdout)}
    assert set(rows) == {"cam-1", "cam-2", "gw-1"}
    for cam in ("cam-1", "cam-2"):
        assert "digits" in rows[cam] and "running" in rows[cam] and "360" in rows[cam]
        accuracy = float(re.search(r"│ (0\.\d+) ", rows[cam]).group(1))  # type: ignore[union-attr]
        assert accuracy > 0.9
    assert "digits" not in rows["gw-1"]
    # One bundle, two variants: each camera runs the one its board prefers.
    assert "onnx-cpu/fp32" in rows["cam-1"]
    assert "onnx-cpu/int8" in rows["cam-2"]
    _check_authenticated(tmp_path, result.stdout, transport)


def _check_authenticated(work: Path, stdout: str, transport: str) -> None:
    logs = {p.stem: p.read_text() for p in (work / "logs").glob("*.log")}
    assert set(logs) == {"hub", "cam-1", "cam-2", "gw-1"} | (
        {"broker"} if transport == "mqtt" else set()
    )
    for device in ("cam-1", "cam-2", "gw-1"):
        assert f"enrolled as {device};" in logs[device]
    assert not [name for name, text in logs.items() if "INSECURE" in text]
    # The console ran in the hub process, at the address the demo printed with a token.
    printed = re.search(r"console: http://127\.0\.0\.1:(\d+)/", stdout)
    assert printed is not None and re.search(r"console token: est_[0-9a-f]{12}_\S{43}", stdout)
    assert f"hub serving the console on port {printed.group(1)}" in logs["hub"]
    if transport != "mqtt":
        return
    for user in ("hub", "cam-1", "cam-2", "gw-1"):  # the broker's user name is the certificate's CN
        assert f"u'{user}')" in logs["broker"], user
    pid = int(re.search(r"Mosquitto \(pid (\d+)\)", stdout).group(1))  # type: ignore[union-attr]
    with pytest.raises(ProcessLookupError):  # stopped with the demo
        os.kill(pid, 0)
