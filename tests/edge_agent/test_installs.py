"""Tests for skill installs: unpack, atomic switch, rollback, and recovery after kill -9."""

import io
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tarfile
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from edge_agent.errors import InstallError
from edge_agent.installs import MARKER, InstallStore
from skills.bundle import build_bundle


def make_bundle(where: Path, version: str, extra: dict[str, bytes] | None = None) -> Path:
    """A tiny tar.gz standing in for a .skill bundle; its files name the version."""
    files = {
        "skill.toml": f'name = "cam"\nversion = "{version}"\n'.encode(),
        "control/main.py": f"VERSION = {version!r}\n".encode(),
        "models/onnx-cpu/model.onnx": version.encode() * 1000,
        **(extra or {}),
    }
    path = where / f"cam-{version}.skill"
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def tar_install(bundle: Path, dest: Path) -> None:
    """What skills.bundle.install_bundle does, minus verification: stage next to dest, rename."""
    if dest.exists():
        raise FileExistsError(dest)
    staging = dest.parent / f".staging-{secrets.token_hex(4)}"
    try:
        with tarfile.open(bundle) as tar:
            tar.extractall(staging, filter="data")
        staging.rename(dest)
    except BaseException:
        if staging.exists():
            shutil.rmtree(staging)
        raise


def store_at(root: Path) -> InstallStore:
    return InstallStore(root, tar_install)


def assert_clean(root: Path, name: str = "cam") -> None:
    """No leftovers; every version folder is complete; exactly one active version."""
    skills = root / "skills"
    assert [p.name for p in skills.iterdir() if p.name.startswith(".")] == []
    skill_dir = skills / name
    for entry in skill_dir.iterdir():
        assert not entry.name.startswith("."), entry
        assert ".tmp" not in entry.name, entry
        if entry.is_dir() and not entry.is_symlink():
            assert (entry / MARKER).is_file(), entry
            version = entry.name
            assert (entry / "control" / "main.py").read_text() == f"VERSION = {version!r}\n"
            assert (entry / "models/onnx-cpu/model.onnx").read_bytes() == version.encode() * 1000
    active = [s for s in InstallStore(root, tar_install).installed() if s.name == name]
    assert len(active) == 1
    assert (skill_dir / "current").resolve() == active[0].path.resolve()


def test_install_activate_switch_and_rollback(tmp_path: Path) -> None:
    store = store_at(tmp_path / "state")
    assert store.bundles_dir.is_dir()
    assert store.current("cam") is None
    path1 = store.unpack("cam", "1.0.0", make_bundle(tmp_path, "1.0.0"))
    assert store.is_installed("cam", "1.0.0")
    assert not store.is_installed("cam", "2.0.0")
    assert store.current("cam") is None  # unpacked is not active
    store.activate("cam", "1.0.0")
    assert store.current("cam") == store.installed()[0]
    assert store.installed()[0].version == "1.0.0"
    assert store.installed()[0].previous is None
    assert store.installed()[0].path == path1

    store.unpack("cam", "2.0.0", make_bundle(tmp_path, "2.0.0"))
    store.activate("cam", "2.0.0")
    current = store.current("cam")
    assert current is not None
    assert (current.version, current.previous) == ("2.0.0", "1.0.0")
    link = tmp_path / "state/skills/cam/current/control/main.py"
    assert link.read_text() == "VERSION = '2.0.0'\n"

    store.activate("cam", "2.0.0")  # already active: nothing changes
    assert store.current("cam") == current
    assert store.rollback("cam") == "1.0.0"
    assert link.read_text() == "VERSION = '1.0.0'\n"
    after = store.current("cam")
    assert after is not None
    assert after.previous == "2.0.0"
    assert store.rollback("cam") == "2.0.0"
    assert_clean(tmp_path / "state")


def test_activate_requires_an_installed_version_and_rollback_a_previous(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    with pytest.raises(InstallError, match="not installed"):
        store.activate("cam", "1.0.0")
    store.unpack("cam", "1.0.0", make_bundle(tmp_path, "1.0.0"))
    with pytest.raises(InstallError, match="no previous"):
        store.rollback("cam")
    store.activate("cam", "1.0.0")
    with pytest.raises(InstallError, match="no previous"):
        store.rollback("cam")


def test_unpack_is_idempotent(tmp_path: Path) -> None:
    calls: list[Path] = []

    def counting(bundle: Path, dest: Path) -> None:
        calls.append(dest)
        tar_install(bundle, dest)

    store = InstallStore(tmp_path / "state", counting)
    bundle = make_bundle(tmp_path, "1.0.0")
    first = store.unpack("cam", "1.0.0", bundle)
    assert store.unpack("cam", "1.0.0", bundle) == first
    assert len(calls) == 1
    marker = json.loads((first / MARKER).read_text())
    assert marker["version"] == "1.0.0"
    assert marker["files"]["control/main.py"] == len("VERSION = '1.0.0'\n")


def test_the_marker_records_every_file_at_any_depth(tmp_path: Path) -> None:
    store = store_at(tmp_path / "state")
    nested = {"models/a/b/c/weights.bin": b"w" * 77, "control/lib/util.py": b"x = 1\n"}
    first = store.unpack("cam", "1.0.0", make_bundle(tmp_path, "1.0.0", nested))
    files = json.loads((first / MARKER).read_text())["files"]
    assert files["models/a/b/c/weights.bin"] == 77
    assert files["control/lib/util.py"] == len(b"x = 1\n")
    assert files["models/onnx-cpu/model.onnx"] == len(b"1.0.0" * 1000)
    assert set(files) == {"skill.toml", "control/main.py", "models/onnx-cpu/model.onnx", *nested}


@pytest.mark.parametrize(
    ("plant", "refusal"),
    [
        (lambda d: (d / "control/escape").symlink_to("/etc/passwd"), "contains a link"),
        (lambda d: os.mkfifo(d / "models/pipe"), "special file"),
    ],
    ids=["link", "fifo"],
)
def test_an_unpack_that_leaves_a_link_or_a_special_file_installs_nothing(
    tmp_path: Path, plant: Callable[[Path], None], refusal: str
) -> None:
    def planting(bundle: Path, dest: Path) -> None:
        tar_install(bundle, dest)
        plant(dest)

    root = tmp_path / "state"
    store = InstallStore(root, planting)
    with pytest.raises(InstallError, match=refusal):
        store.unpack("cam", "1.0.0", make_bundle(tmp_path, "1.0.0"))
    assert list((root / "skills").iterdir()) == []


def test_failed_unpack_leaves_nothing(tmp_path: Path) -> None:
    root = tmp_path / "state"
    store = store_at(root)
    junk = tmp_path / "junk.skill"
    junk.write_bytes(b"not an archive")
    with pytest.raises(InstallError, match=r"junk\.skill"):
        store.unpack("cam", "1.0.0", junk)
    assert list((root / "skills").iterdir()) == []

    def half_then_fail(bundle: Path, dest: Path) -> None:
        (dest / "control").mkdir(parents=True)
        raise OSError("disk full")

    with pytest.raises(InstallError, match="disk full"):
        InstallStore(root, half_then_fail).unpack("cam", "1.0.0", make_bundle(tmp_path, "1.0.0"))
    assert list((root / "skills").iterdir()) == []

    sneaky = make_bundle(tmp_path, "1.0.0", {MARKER: b'{"version": "1.0.0", "files": {}}'})
    with pytest.raises(InstallError, match="reserved"):
        store.unpack("cam", "1.0.0", sneaky)
    assert list((root / "skills").iterdir()) == []


def test_failed_unpack_keeps_the_active_version(tmp_path: Path) -> None:
    store = store_at(tmp_path / "state")
    store.unpack("cam", "1.0.0", make_bundle(tmp_path, "1.0.0"))
    store.activate("cam", "1.0.0")
    junk = tmp_path / "junk.skill"
    junk.write_bytes(b"\x1f\x8b garbage")
    with pytest.raises(InstallError):
        store.unpack("cam", "2.0.0", junk)
    assert_clean(tmp_path / "state")
    assert sorted(p.name for p in (tmp_path / "state/skills/cam").iterdir()) == [
        "1.0.0",
        "current",
    ]


@pytest.mark.parametrize(
    ("name", "version"),
    [
        ("../x", "1"),
        (".hidden", "1"),
        ("cam", "current"),
        ("cam", "previous.tmp-1"),
        ("cam", ""),
        ("a/b", "1"),
        ("cam", "1/../../x"),
        ("cam", "x" * 200),
    ],
)
def test_unsafe_names_are_refused(tmp_path: Path, name: str, version: str) -> None:
    store = store_at(tmp_path / "state")
    with pytest.raises(InstallError, match="bad"):
        store.unpack(name, version, make_bundle(tmp_path, "1.0.0"))
    assert list((tmp_path / "state/skills").iterdir()) == []


def test_remove_skill_and_installed_listing(tmp_path: Path) -> None:
    store = store_at(tmp_path / "state")
    for name in ("zeta", "alpha", "mid"):
        store.unpack(name, "1", make_bundle(tmp_path, "1"))
    store.activate("zeta", "1")
    store.activate("alpha", "1")
    assert [s.name for s in store.installed()] == ["alpha", "zeta"]
    store.remove_skill("alpha")
    store.remove_skill("alpha")
    store.remove_skill("never-installed")
    assert [s.name for s in store.installed()] == ["zeta"]
    assert sorted(p.name for p in (tmp_path / "state/skills").iterdir()) == ["mid", "zeta"]


def test_prune_keeps_current_previous_and_newest(tmp_path: Path) -> None:
    store = store_at(tmp_path / "state")
    skill_dir = tmp_path / "state/skills/cam"
    for v in ("1", "2", "3", "4"):
        store.unpack("cam", v, make_bundle(tmp_path, v))
    store.activate("cam", "2")
    store.activate("cam", "1")  # current 1, previous 2; 3 and 4 never active
    store.prune("cam", keep=3)
    assert sorted(p.name for p in skill_dir.iterdir()) == ["1", "2", "4", "current", "previous"]
    store.prune("cam")
    assert sorted(p.name for p in skill_dir.iterdir()) == ["1", "2", "current", "previous"]
    store.prune("cam", keep=1)
    assert sorted(p.name for p in skill_dir.iterdir()) == ["1", "current"]
    assert store.current("cam") == store.installed()[0]
    with pytest.raises(InstallError):
        store.prune("cam", keep=0)


def test_recover_falls_back_when_current_is_damaged_or_dangling(tmp_path: Path) -> None:
    root = tmp_path / "state"
    store = store_at(root)
    for v in ("1", "2", "3"):
        store.unpack("cam", v, make_bundle(tmp_path, v))
    store.activate("cam", "1")
    store.activate("cam", "2")
    model = root / "skills/cam/2/models/onnx-cpu/model.onnx"
    model.write_bytes(b"truncated")
    cleaned = store.recover()
    assert "skills/cam/2: incomplete or damaged" in cleaned
    current = store.current("cam")
    assert current is not None
    assert (current.version, current.previous) == ("1", None)
    assert_clean(root)

    store.activate("cam", "3")
    shutil.rmtree(root / "skills/cam/3")
    store.recover()
    current = store.current("cam")
    assert current is not None
    assert current.version == "1"
    assert_clean(root)


def test_recover_drops_a_skill_that_has_nothing_left(tmp_path: Path) -> None:
    root = tmp_path / "state"
    store = store_at(root)
    (root / "skills/ghost/1").mkdir(parents=True)
    (root / "skills/ghost/current").symlink_to("1")
    (root / "skills/.staging-abc").mkdir()
    cleaned = store.recover()
    assert sorted(cleaned) == [
        "skills/.staging-abc: leftover",
        "skills/ghost/1: incomplete or damaged",
        "skills/ghost/current: dangling",
    ]
    assert list((root / "skills").iterdir()) == []
    assert store.recover() == []


# The child runs the real InstallStore with the real bundle installer (skills.bundle.
# install_bundle). Each step appends its name to a trace file (flushed to disk) and the child
# kills itself with SIGKILL at the named one, so the test knows which step was reached.
# The steps inside the installer are marked by wrapping the functions it calls: after the
# second extracted member ("mid-extract") and after the staged tree was verified ("verified").
_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    import skills.archive, skills.bundle
    from edge_agent.installs import InstallStore

    root, bundle, op, kill_at, trace = (
        Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4], Path(sys.argv[5])
    )

    def hook(step):
        with trace.open("a") as f:
            f.write(step + "\\n")
            f.flush()
            os.fsync(f.fileno())
        if step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    extract_member = skills.archive._Extraction.add
    added = []

    def counted_add(self, *args):
        extract_member(self, *args)
        added.append(1)
        if len(added) == 2:
            hook("mid-extract")

    verify_tree = skills.bundle.verify_tree

    def traced_verify(staging):
        manifest = verify_tree(staging)
        hook("verified")
        return manifest

    skills.archive._Extraction.add = counted_add
    skills.bundle.verify_tree = traced_verify
    store = InstallStore(root, step_hook=hook)
    if op == "install":
        store.unpack("digits", "2.0.0", bundle)
        store.activate("digits", "2.0.0")
    elif op == "rollback":
        store.rollback("digits")
    elif op == "prune":
        store.prune("digits", keep=1)
    hook("done")
    """
)


def _run_child(root: Path, bundle: Path, op: str, kill_at: str) -> list[str]:
    """Run ``op`` in a child that kills itself at ``kill_at``; the steps it reached."""
    trace = root.parent / f"trace-{op}-{kill_at}.txt"
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(root), str(bundle), op, kill_at, str(trace)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    steps = trace.read_text().split()
    assert steps[-1] == kill_at, steps
    return steps


def _state_v1_v11(tmp_path: Path) -> Path:
    root = tmp_path / "state"
    store = InstallStore(root)
    for v in ("1.0.0", "1.1.0"):
        store.unpack("digits", v, _real_bundle(tmp_path, v))
        store.activate("digits", v)
    return root


def _assert_one_verified_version(root: Path) -> None:
    """Nothing half-done is left, every version is complete, and exactly one is active."""
    store = InstallStore(root)
    assert store.recover() == []  # a second recovery finds nothing to repair
    skill_dir = root / "skills" / "digits"
    assert [p.name for p in skill_dir.iterdir() if p.name.startswith(".")] == []
    assert [p.name for p in skill_dir.iterdir() if ".tmp" in p.name] == []
    for version in store.versions("digits"):
        assert (skill_dir / version / MARKER).is_file()
    assert len([s for s in store.installed() if s.name == "digits"]) == 1


_INSTALL_STEPS = [
    "mid-extract",
    "verified",
    "unpacked",
    "marked",
    "previous-tmp",
    "previous-replaced",
    "current-tmp",
    "current-replaced",
    "done",
]


@pytest.mark.parametrize(
    ("kill_at", "staging_left", "active"),
    [
        ("mid-extract", True, "1.1.0"),
        ("verified", True, "1.1.0"),
        ("unpacked", False, "1.1.0"),
        ("marked", False, "1.1.0"),
        ("previous-tmp", False, "1.1.0"),
        ("previous-replaced", False, "1.1.0"),
        ("current-tmp", False, "1.1.0"),
        ("current-replaced", False, "2.0.0"),
        ("done", False, "2.0.0"),
    ],
)
def test_kill_during_install_then_recover(
    tmp_path: Path, kill_at: str, staging_left: bool, active: str
) -> None:
    root = _state_v1_v11(tmp_path)
    bundle = _real_bundle(tmp_path, "2.0.0")
    steps = _run_child(root, bundle, "install", kill_at)
    assert steps == _INSTALL_STEPS[: _INSTALL_STEPS.index(kill_at) + 1]
    skill_dir = root / "skills" / "digits"
    staging = [p for p in skill_dir.iterdir() if p.name.startswith(".staging-")]
    assert bool(staging) == staging_left
    store = InstallStore(root)
    store.recover()
    _assert_one_verified_version(root)
    current = store.current("digits")
    assert current is not None
    assert current.version == active
    # Level-triggered reconcile: doing the same install again converges.
    store.unpack("digits", "2.0.0", bundle)
    store.activate("digits", "2.0.0")
    current = store.current("digits")
    assert current is not None
    assert (current.version, current.previous) == ("2.0.0", "1.1.0")
    _assert_one_verified_version(root)


@pytest.mark.parametrize(
    ("kill_at", "active"),
    [
        ("current-tmp", "1.1.0"),
        ("current-replaced", "1.0.0"),
        ("previous-tmp", "1.0.0"),
        ("previous-replaced", "1.0.0"),
    ],
)
def test_kill_during_rollback_then_recover(tmp_path: Path, kill_at: str, active: str) -> None:
    root = _state_v1_v11(tmp_path)
    steps = _run_child(root, tmp_path / "unused", "rollback", kill_at)
    order = ["current-tmp", "current-replaced", "previous-tmp", "previous-replaced"]
    assert steps == order[: order.index(kill_at) + 1]
    store = InstallStore(root)
    store.recover()
    _assert_one_verified_version(root)
    current = store.current("digits")
    assert current is not None
    assert current.version == active


def test_kill_during_prune_then_recover(tmp_path: Path) -> None:
    root = _state_v1_v11(tmp_path)
    steps = _run_child(root, tmp_path / "unused", "prune", "trashed")
    assert steps == ["trashed"]
    assert any(p.name.startswith(".trash-") for p in (root / "skills/digits").iterdir())
    store = InstallStore(root)
    assert [line.split(":")[1].strip() for line in store.recover()] == ["leftover"]
    _assert_one_verified_version(root)
    assert sorted(p.name for p in (root / "skills/digits").iterdir()) == ["1.1.0", "current"]


def _real_bundle(tmp_path: Path, version: str) -> Path:
    src = tmp_path / f"src-{version}"
    shutil.copytree(Path(__file__).parents[2] / "skills/library/digits", src)
    toml = src / "skill.toml"
    toml.write_text(toml.read_text().replace('version = "1.0.0"', f'version = "{version}"'))
    return build_bundle(src, tmp_path / "out")


def test_default_installer_is_the_real_bundle_installer(tmp_path: Path) -> None:
    root = tmp_path / "state"
    store = InstallStore(root)
    for version in ("1.0.0", "1.1.0"):
        path = store.unpack("digits", version, _real_bundle(tmp_path, version))
        assert f'version = "{version}"' in (path / "skill.toml").read_text()
        store.activate("digits", version)
    truncated = tmp_path / "truncated.skill"
    truncated.write_bytes(_real_bundle(tmp_path, "2.0.0").read_bytes()[:200])
    with pytest.raises(InstallError):
        store.unpack("digits", "2.0.0", truncated)
    assert store.recover() == []
    current = store.current("digits")
    assert current is not None
    assert (current.version, current.previous) == ("1.1.0", "1.0.0")
    assert sorted(p.name for p in (root / "skills/digits").iterdir()) == [
        "1.0.0",
        "1.1.0",
        "current",
        "previous",
    ]


def test_inventory_is_reused_until_a_change_through_the_store_or_its_age(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    store.unpack("cam", "1.0.0", make_bundle(tmp_path, "1.0.0"))
    store.activate("cam", "1.0.0")
    store.unpack("cam", "2.0.0", make_bundle(tmp_path, "2.0.0"))
    (first,) = store.inventory()
    assert (first.name, first.versions) == ("cam", ("1.0.0", "2.0.0"))
    assert first.active is not None and first.active.version == "1.0.0"
    # A folder removed behind the store's back: the last scan stands until it is too old ...
    shutil.rmtree(tmp_path / "skills" / "cam" / "2.0.0")
    assert store.cached_inventory() == (first,)
    assert store.inventory()[0].versions == ("1.0.0", "2.0.0")
    # ... and a scan older than the age asked for is redone.
    assert store.cached_inventory(max_age_s=0.0) is None
    assert store.inventory(max_age_s=0.0)[0].versions == ("1.0.0",)
    # Any change made through the store makes the last scan stale at once, a failed one too.
    store.unpack("cam", "3.0.0", make_bundle(tmp_path, "3.0.0"))
    assert store.cached_inventory() is None
    (after,) = store.inventory()
    assert after.versions == ("1.0.0", "3.0.0")
    with pytest.raises(InstallError):
        store.activate("cam", "9.9.9")
    assert store.cached_inventory() is None
    store.activate("cam", "3.0.0")
    (active,) = store.inventory()
    assert active.active is not None and (active.active.version, active.active.previous) == (
        "3.0.0",
        "1.0.0",
    )


def _complete(folder: Path) -> None:
    folder.mkdir(parents=True)
    (folder / MARKER).write_text("{}", encoding="utf-8")


@pytest.mark.parametrize(
    "layout",
    [
        "complete current and previous",
        "current to a half-finished version",
        "previous to a missing version",
        "links to each other and to a file",
        "previous equal to current",
        "no links",
        "a link posing as a version",
    ],
)
def test_inventory_scan_agrees_with_the_checks_of_each_path(tmp_path: Path, layout: str) -> None:
    """The inventory lists a skill folder once; it must say what current() and versions() say."""
    store = store_at(tmp_path)
    skill = tmp_path / "skills" / "cam"
    for version in ("1.0.0", "2.0.0"):
        _complete(skill / version)
    (skill / "3.0.0").mkdir()  # half-finished: no marker
    (skill / "notes.txt").write_text("not a version", encoding="utf-8")
    (skill / ".staging-ab12").mkdir()
    links = {
        "complete current and previous": {"current": "2.0.0", "previous": "1.0.0"},
        "current to a half-finished version": {"current": "3.0.0", "previous": "1.0.0"},
        "previous to a missing version": {"current": "2.0.0", "previous": "9.9.9"},
        "links to each other and to a file": {"current": "previous", "previous": "notes.txt"},
        "previous equal to current": {"current": "1.0.0", "previous": "1.0.0"},
        "no links": {},
        "a link posing as a version": {"current": "2.0.0", "4.0.0": "1.0.0"},
    }[layout]
    for link, target in links.items():
        (skill / link).symlink_to(target)
    _complete(tmp_path / "skills" / "other" / "0.1.0")
    (tmp_path / "skills" / "not a name").mkdir()

    found = store.inventory(max_age_s=0.0)

    expected = tuple(
        (name, store.current(name), tuple(store.versions(name))) for name in ("cam", "other")
    )
    assert tuple((s.name, s.active, s.versions) for s in found) == expected
    assert found[0].versions == ("1.0.0", "2.0.0")  # never the link posing as 4.0.0
