"""The image builder's cache: where it lives, and a base cached whole or not at all.

The debootstrap itself is replaced by a stand-in that writes a few files (the real
one is exercised by the qemu proof); what is checked is the caching around it.
"""

from __future__ import annotations

import stat
import tarfile
from pathlib import Path

import pytest

import edgeskill.firmware_build as build
from edgeskill.firmware_build import ImageBuildError, base_rootfs, cache_dir
from edgeskill.firmware_recipes import Recipe, load_recipe


def test_the_cache_is_shared_by_every_checkout_and_can_be_moved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("EDGESKILL_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "edgeskill" / "firmware"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "edgeskill" / "firmware"
    monkeypatch.setenv("EDGESKILL_CACHE_DIR", str(tmp_path / "own"))
    assert cache_dir() == tmp_path / "own" / "firmware"


@pytest.fixture
def recipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Recipe:
    monkeypatch.setenv("EDGESKILL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(build, "ensure_tools", lambda _arch: None)
    return load_recipe("arm64-cpu")


def test_a_base_is_debootstrapped_once_and_cached_with_its_root_open_to_all(
    tmp_path: Path, recipe: Recipe, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs: list[Path] = []

    def fake(_recipe: Recipe, root: Path, _say: build.Say) -> None:
        runs.append(root)
        (root / "etc").mkdir()
        (root / "etc" / "os-release").write_text("ID=debian\n")

    monkeypatch.setattr(build, "_debootstrap", fake)
    first = base_rootfs(recipe, print)
    assert base_rootfs(recipe, print) == first
    assert len(runs) == 1
    with tarfile.open(first) as tar:
        top = tar.getmember(".")
        assert stat.S_IMODE(top.mode) == 0o755  # the image's "/", not mkdtemp's 0700
        assert "./etc/os-release" in tar.getnames()
    assert sorted(p.name for p in first.parent.iterdir()) == [first.name]  # nothing else left


def test_a_debootstrap_that_fails_or_is_killed_caches_nothing(
    tmp_path: Path, recipe: Recipe, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(_recipe: Recipe, root: Path, _say: build.Say) -> None:
        (root / "half").write_text("written before the mirror went away")
        raise ImageBuildError("debootstrap failed (exit 1)")

    monkeypatch.setattr(build, "_debootstrap", broken)
    with pytest.raises(ImageBuildError, match="debootstrap failed"):
        base_rootfs(recipe, print)
    folder = tmp_path / "cache" / "firmware" / "cache"
    assert list(folder.iterdir()) == []  # no tar, no half-built root

    def interrupted(_recipe: Recipe, root: Path, _say: build.Say) -> None:
        (root / "half").write_text("x")
        raise KeyboardInterrupt

    monkeypatch.setattr(build, "_debootstrap", interrupted)
    with pytest.raises(KeyboardInterrupt):
        base_rootfs(recipe, print)
    assert list(folder.iterdir()) == []
