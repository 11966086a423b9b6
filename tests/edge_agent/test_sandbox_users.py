"""Skill user ids: stable per agent, different between agents, never one that is in use."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from edge_agent.sandbox.reaper import kill_user, processes_of
from edge_agent.sandbox.users import SkillUsers

BASE, COUNT = 61000, 4000


def test_an_id_is_stable_for_one_agent_and_differs_between_agents(tmp_path: Path) -> None:
    one = SkillUsers(tmp_path / "a" / "users.json", BASE, COUNT)
    other = SkillUsers(tmp_path / "b" / "users.json", BASE, COUNT)
    uid = one.uid_for("digits")
    assert BASE <= uid < BASE + COUNT
    assert SkillUsers(tmp_path / "a" / "users.json", BASE, COUNT).uid_for("digits") == uid
    # Two agents on one machine (the demo runs three): stopping one's skill kills every
    # process of its user, so the other's copy of the skill must have another user.
    assert other.uid_for("digits") != uid
    assert one.uid_for("other-skill") != uid


@pytest.mark.skipif(os.geteuid() != 0, reason="starting a process as another user needs root")
def test_an_id_with_running_processes_is_not_given_out(tmp_path: Path) -> None:
    probe = SkillUsers(tmp_path / "probe" / "users.json", BASE, COUNT)
    wanted = probe.uid_for("digits")  # what a fresh registry at this path would pick
    (tmp_path / "probe" / "users.json").unlink()
    squatter = subprocess.Popen(["sleep", "60"], user=wanted, group=wanted)
    try:
        assert processes_of(wanted) == [squatter.pid]
        got = SkillUsers(tmp_path / "probe" / "users.json", BASE, COUNT).uid_for("digits")
        assert got != wanted
    finally:
        kill_user(wanted)
        squatter.wait()
