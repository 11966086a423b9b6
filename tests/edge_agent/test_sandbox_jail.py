"""The jail's filesystem view: what must be reached is shown whole, what is hidden stays hidden.

The interpreter of a virtual environment that lives under a hidden folder
(a checkout under ``/tmp``, as CI makes) must stay whole even though a deeper
folder of it (site-packages) is revealed too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from edge_agent.sandbox.env import ENV_JAIL
from edge_agent.sandbox.jail import JailSpec

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mount namespaces need root")

PROBE = """
import os, sys
for path in sys.argv[1:]:
    print(path, os.path.exists(path))
"""


def _jailed(tmp_path: Path, reveal: tuple[str, ...], hide: tuple[str, ...], *probe: Path) -> str:
    skill, work = tmp_path / "skill", tmp_path / "work"
    skill.mkdir()
    work.mkdir()
    os.chown(work, 61999, 61999)
    spec = JailSpec(
        uid=61999,
        skill_dir=str(skill),
        work_dir=str(work),
        reveal=(*reveal, str(Path(sys.executable).resolve().parent), sys.base_prefix),
        hide=hide,
        network=True,
        max_processes=0,
        address_space_mb=0,
        argv=(sys.executable, "-S", "-c", PROBE, *map(str, probe)),
    )
    done = subprocess.run(
        [sys.executable, "-m", "edge_agent.sandbox.jail"],
        env={**os.environ, ENV_JAIL: spec.to_json()},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_revealed_folder_stays_whole_when_a_deeper_one_is_revealed_too(tmp_path: Path) -> None:
    hidden = tmp_path / "hidden"
    env = hidden / "venv"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").write_text("#!")
    (env / "lib" / "site-packages").mkdir(parents=True)
    secret = hidden / "secret.txt"
    secret.write_text("no")
    for folder in (tmp_path, hidden, env, env / "bin", env / "lib", env / "lib" / "site-packages"):
        folder.chmod(0o755)

    # The deeper folder first, as sys.path lists it: the order must not matter.
    out = _jailed(
        tmp_path,
        (str(env / "lib" / "site-packages"), str(env)),
        (str(hidden),),
        env / "bin" / "python",
        env / "lib" / "site-packages",
        secret,
    )

    assert out.splitlines() == [
        f"{env / 'bin' / 'python'} True",
        f"{env / 'lib' / 'site-packages'} True",
        f"{secret} False",
    ]
