"""A publisher killed at any step of a push leaves the old or the new state, never a broken one.

A child process runs the real ``TrustRepository.add_target`` and SIGKILLs
itself when the repository reports the chosen step (so each kill point is
reached, and the test checks which one it was). Afterwards an agent's TUF
client must see a consistent repository, and pushing the same bundle again
must complete the publication and leave no leftovers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from skills.errors import TrustError
from skills.trust import TrustClient, TrustRepository
from tests.fakes.hub_fetch import HubFetch

NAME = "digits/digits-1.0.0.skill"

# Every step of a first publication, in order: the staged copy, the target file in
# place, then targets, snapshot and timestamp metadata (versioned file, then the alias).
STEPS = [
    "staged",
    "target",
    "2.targets.json",
    "targets.json",
    "2.snapshot.json",
    "snapshot.json",
    "timestamp.json",
]

CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from skills.trust import TrustRepository

    repo_dir, source, name, kill_at, marker = sys.argv[1:]
    repo = TrustRepository.open(Path(repo_dir))

    def step(done):
        if done == kill_at:
            Path(marker).write_text(done)
            os.kill(os.getpid(), signal.SIGKILL)

    repo.on_step = step
    repo.add_target(name, Path(source))
    """
)


def _push_and_die(repo_dir: Path, source: Path, kill_at: str, marker: Path) -> int:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(repo_dir), str(source), NAME, kill_at, str(marker)],
        capture_output=True,
        timeout=60,
        check=False,
    )
    return proc.returncode


def _leftovers(repo_dir: Path) -> list[str]:
    return sorted(
        p.name for p in [*repo_dir.glob(".stage-*"), *(repo_dir / "metadata").glob(".tmp-*")]
    )


@pytest.mark.parametrize("kill_at", STEPS)
def test_a_push_killed_at_each_step_is_completed_by_the_next_push(
    tmp_path: Path, kill_at: str
) -> None:
    repo_dir = tmp_path / "hub"
    repo = TrustRepository.init(repo_dir)
    root = repo.root_json()
    source = tmp_path / "bundle.skill"
    source.write_bytes(b"bundle bytes " * 1000)
    marker = tmp_path / "reached"

    assert _push_and_die(repo_dir, source, kill_at, marker) == -signal.SIGKILL
    assert marker.read_text() == kill_at  # the child died at the step we chose

    # Right after the kill an agent sees a consistent repository: until the timestamp
    # is written it is the old state (no such target), afterwards the new one.
    agent = TrustClient(tmp_path / "agent", HubFetch(repo), root)
    if kill_at == "timestamp.json":
        assert agent.fetch_target(NAME).read_bytes() == source.read_bytes()
    else:
        with pytest.raises(TrustError, match="not in the signed targets metadata"):
            agent.fetch_target(NAME)

    # Pushing the same bundle again completes the publication and cleans up.
    ref = repo.add_target(NAME, source)
    assert ref.length == source.stat().st_size
    fresh = TrustClient(tmp_path / "agent-2", HubFetch(repo), root)
    assert fresh.fetch_target(NAME).read_bytes() == source.read_bytes()
    assert agent.fetch_target(NAME).read_bytes() == source.read_bytes()
    assert _leftovers(repo_dir) == []
    assert repo.repair() == []  # nothing left to fix


def test_repair_completes_a_half_written_publication_without_a_new_push(tmp_path: Path) -> None:
    repo_dir = tmp_path / "hub"
    repo = TrustRepository.init(repo_dir)
    source = tmp_path / "bundle.skill"
    source.write_bytes(b"x" * 100)
    assert _push_and_die(repo_dir, source, "targets.json", tmp_path / "m") == -signal.SIGKILL
    # Also a half-written metadata file, as a kill inside an atomic write leaves it.
    (repo_dir / "metadata" / ".tmp-abc").write_bytes(b"{")

    done = repo.repair()

    assert any("completed the publication of targets v2" in line for line in done)
    assert any(".tmp-abc" in line for line in done)
    agent = TrustClient(tmp_path / "agent", HubFetch(repo), repo.root_json())
    assert agent.fetch_target(NAME).read_bytes() == source.read_bytes()


def test_a_live_publishers_staged_copy_is_not_removed(tmp_path: Path) -> None:
    repo_dir = tmp_path / "hub"
    repo = TrustRepository.init(repo_dir)
    mine = repo_dir / f".stage-{os.getpid()}-keep"
    mine.write_bytes(b"in progress")
    dead = repo_dir / ".stage-999999999-gone"
    dead.write_bytes(b"orphan")

    repo.repair()

    assert mine.exists()
    assert not dead.exists()
