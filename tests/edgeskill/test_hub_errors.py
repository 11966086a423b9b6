"""``hub init`` and ``hub serve`` refuse a person's mistakes with one line, and change nothing.

Every case runs the real command in a child process: exit status 2, one
``error:`` line naming the bad value, no traceback, and the hub home (or its
absence) exactly as before. A second ``hub serve`` on a port another one holds
is refused the same way, and the first keeps serving.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from cloud.hub import Hub
from tests.support import Fleet, free_port, wait_for_port

#: Long enough that no message is wrapped, so "one line" means one line.
WIDE = {"COLUMNS": "400", "GRPC_VERBOSITY": "ERROR"}


def edgeskill(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``edgeskill ARGS`` to its end."""
    return subprocess.run(
        [sys.executable, "-m", "edgeskill.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **WIDE},
    )


def assert_refused(result: subprocess.CompletedProcess[str], message: str) -> None:
    """Exit status 2 and exactly one line of output: ``error: MESSAGE``."""
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "Traceback" not in output
    assert output.strip().splitlines() == [f"error: {message}"]


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` and its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mqtt", "http://x"], "'http://x' is not an mqtt://host[:port][/prefix] URL"),
        (
            ["--grpc-bind", "7443"],
            "bad gRPC address '7443'; expected HOST:PORT such as 127.0.0.1:7443, "
            "0.0.0.0:7443 or [::1]:7443",
        ),
        (
            ["--grpc-bind", "host:"],
            "bad gRPC address 'host:'; expected HOST:PORT such as 127.0.0.1:7443, "
            "0.0.0.0:7443 or [::1]:7443",
        ),
        (
            ["--grpc-bind", "host:99999"],
            "bad port '99999' in gRPC address 'host:99999'; expected a number from 0 to 65535",
        ),
        (
            ["--grpc-bind", ":x"],
            "bad gRPC address ':x'; expected HOST:PORT such as 127.0.0.1:7443, "
            "0.0.0.0:7443 or [::1]:7443",
        ),
        (
            ["--store-url", "mysql://hub:s3cret@db/fleet"],
            "cannot use the store URL 'mysql://hub:***@db/fleet': unsupported database 'mysql'; "
            "use one of ('sqlite', 'postgresql'); expected sqlite:///PATH or "
            "postgresql+psycopg2://USER@HOST:PORT/DB",
        ),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else "",
)
def test_hub_init_refuses_a_bad_address_or_url_and_creates_nothing(
    tmp_path: Path, args: list[str], message: str
) -> None:
    home = tmp_path / "new" / "hub"
    result = edgeskill("hub", "init", "--home", str(home), *args)
    assert_refused(result, message)
    assert list(tmp_path.iterdir()) == []


def test_a_hub_init_that_fails_part_way_leaves_nothing_behind(tmp_path: Path) -> None:
    # Keys, PKI and TUF metadata are made before the store is reached; it is not there.
    unreachable = f"postgresql+psycopg2://hub@127.0.0.1:{free_port()}/fleet"
    fresh = edgeskill(
        "hub", "init", "--home", str(tmp_path / "new" / "hub"), "--store-url", unreachable
    )
    assert fresh.returncode == 2, fresh.stdout + fresh.stderr
    assert "Traceback" not in fresh.stdout + fresh.stderr
    assert "cannot migrate the store schema" in fresh.stderr
    assert not (tmp_path / "new").exists()

    existing = tmp_path / "mine"
    existing.mkdir()
    (existing / "notes.txt").write_text("kept")
    again = edgeskill("hub", "init", "--home", str(existing), "--store-url", unreachable)
    assert again.returncode == 2
    assert snapshot(existing) == {"notes.txt": b"kept"}
    assert [p.name for p in existing.iterdir()] == ["notes.txt"]


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """An insecure hub home, never served."""
    path = tmp_path / "hub"
    Hub.init(path, grpc_bind="127.0.0.1:0", insecure=True).close()
    return path


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--grpc-bind", "8.8.8.8:7443"],
            "cannot listen on 8.8.8.8:7443: address not available on this machine",
        ),
        (["--mqtt", "http://x"], "'http://x' is not an mqtt://host[:port][/prefix] URL"),
        (
            ["--metrics-bind", "nope"],
            "bad metrics address 'nope'; expected HOST:PORT such as 127.0.0.1:7443, "
            "0.0.0.0:7443 or [::1]:7443",
        ),
        (
            ["--grpc-bind", "127.0.0.1:7443", "--metrics-bind", "127.0.0.1:7443"],
            "the gRPC address and the metrics address are both 127.0.0.1:7443; "
            "give each its own port",
        ),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else "",
)
def test_hub_serve_refuses_a_bad_address_or_url_and_changes_nothing(
    home: Path, args: list[str], message: str
) -> None:
    before = snapshot(home)
    result = edgeskill("hub", "serve", "--home", str(home), *args)
    assert_refused(result, message)
    assert snapshot(home) == before


def test_hub_serve_without_a_hub_says_to_init_one(tmp_path: Path) -> None:
    home = tmp_path / "nothing"
    result = edgeskill("hub", "serve", "--home", str(home))
    assert result.returncode == 2
    assert "Traceback" not in result.stdout + result.stderr
    assert result.stderr.startswith(f"error: cannot read hub config {home / 'hub.toml'}")
    assert f"Run `edgeskill hub init --home {home}` first." in result.stderr
    assert not home.exists()


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    children = Fleet(tmp_path / "logs")
    yield children
    children.stop_all()


@pytest.mark.slow
def test_a_second_hub_on_a_taken_port_exits_2_and_the_first_keeps_serving(
    tmp_path: Path, fleet: Fleet
) -> None:
    first_home, second_home = tmp_path / "first", tmp_path / "second"
    for path in (first_home, second_home):
        Hub.init(path, insecure=True).close()
    port = free_port()
    bind = f"127.0.0.1:{port}"
    first = fleet.start("first", ["hub", "serve", "--home", str(first_home), "--grpc-bind", bind])
    wait_for_port(port, 60.0)
    before = snapshot(second_home)

    # Its gRPC port, and the same port asked for as a metrics endpoint.
    for args in (["--grpc-bind", bind], ["--grpc-bind", "127.0.0.1:0", "--metrics-bind", bind]):
        second = edgeskill("hub", "serve", "--home", str(second_home), *args)
        assert_refused(second, f"{bind} is already in use (another hub serve?)")
    assert snapshot(second_home) == before

    assert first.poll() is None
    with grpc.insecure_channel(bind) as channel:
        grpc.channel_ready_future(channel).result(timeout=10)
    assert "error" not in (tmp_path / "logs" / "first.log").read_text().lower()
