"""Serving repository files: the checks on the path, the links, and the small-file cache."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

import skills.trust._file_cache as file_cache
from skills.errors import TrustError
from skills.trust import TrustRepository
from skills.trust._file_cache import SETTLE_NS, SmallFileCache
from skills.trust._served import ServedFolder

NAME = "digits/digits-1.0.0.skill"


@pytest.fixture
def repo(tmp_path: Path) -> TrustRepository:
    repo = TrustRepository.init(tmp_path / "hub")
    source = tmp_path / "bundle.skill"
    source.write_bytes(b"bundle " * 300)
    repo.add_target(NAME, source)
    return repo


@pytest.fixture
def small_files() -> SmallFileCache:
    return SmallFileCache(64 * 1024, 1 << 20)


@pytest.fixture
def served(repo: TrustRepository, tmp_path: Path, small_files: SmallFileCache) -> ServedFolder:
    """A fresh serving object for ``repo``'s folder, with a cache the test can look into."""
    return ServedFolder(tmp_path / "hub", small_files)


@pytest.fixture
def settled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cache files however recently written, as if published long ago."""
    monkeypatch.setattr(file_cache, "SETTLE_NS", 0)


def _served(source: TrustRepository | ServedFolder, path: str) -> bytes:
    return source.read(path, 1 << 20)


def _target_path(repo: TrustRepository) -> str:
    (ref,) = repo.targets()
    return ref.path


@pytest.mark.usefixtures("settled")
def test_a_replaced_timestamp_is_served_new(
    repo: TrustRepository, served: ServedFolder, small_files: SmallFileCache, tmp_path: Path
) -> None:
    on_disk = tmp_path / "hub" / "metadata" / "timestamp.json"
    old = _served(served, "metadata/timestamp.json")
    assert str(on_disk.resolve()) in small_files
    assert _served(served, "metadata/timestamp.json") == old == on_disk.read_bytes()
    repo.refresh_timestamp()
    new = _served(served, "metadata/timestamp.json")
    assert new != old and new == on_disk.read_bytes()


@pytest.mark.usefixtures("settled")
def test_a_target_rewritten_in_place_is_served_new(repo: TrustRepository, tmp_path: Path) -> None:
    path = _target_path(repo)
    before = _served(repo, path)
    file = tmp_path / "hub" / path
    file.write_bytes(b"changed, and longer than before " * 100)
    assert _served(repo, path) == file.read_bytes() != before


@pytest.mark.usefixtures("settled")
def test_a_cached_file_replaced_by_a_link_out_is_refused(
    served: ServedFolder, small_files: SmallFileCache, tmp_path: Path
) -> None:
    _served(served, "metadata/1.root.json")
    link = tmp_path / "hub" / "metadata" / "1.root.json"
    assert str(link.resolve()) in small_files
    outside = tmp_path / "secret.json"
    outside.write_bytes(b'{"secret": 1}')
    link.unlink()
    link.symlink_to(outside)
    with pytest.raises(
        TrustError, match=re.escape("repository path 'metadata/1.root.json' leaves metadata/")
    ):
        _served(served, "metadata/1.root.json")


@pytest.mark.usefixtures("settled")
def test_a_cached_folder_replaced_by_a_link_out_is_refused(
    repo: TrustRepository, served: ServedFolder, small_files: SmallFileCache, tmp_path: Path
) -> None:
    path = _target_path(repo)
    _served(served, path)
    assert str((tmp_path / "hub" / path).resolve()) in small_files
    folder = tmp_path / "hub" / "targets" / "digits"
    moved = tmp_path / "outside"
    folder.rename(moved)
    (moved / Path(path).name).write_bytes(b"not served")
    folder.symlink_to(moved)
    with pytest.raises(TrustError, match="leaves targets/"):
        _served(served, path)


@pytest.mark.usefixtures("settled")
def test_each_serving_object_keeps_its_own_small_files(
    repo: TrustRepository, served: ServedFolder, small_files: SmallFileCache, tmp_path: Path
) -> None:
    on_disk = str((tmp_path / "hub" / "metadata" / "root.json").resolve())
    assert _served(repo, "metadata/root.json") == repo.root_json()  # the repository's own
    assert on_disk not in small_files
    other_files = SmallFileCache(64 * 1024, 1 << 20)
    other = ServedFolder(tmp_path / "hub", other_files)
    assert _served(served, "metadata/root.json") == repo.root_json()
    assert on_disk in small_files and on_disk not in other_files
    assert _served(other, "metadata/root.json") == repo.root_json()
    assert on_disk in other_files


def test_a_link_that_stays_inside_is_served(repo: TrustRepository, tmp_path: Path) -> None:
    path = _target_path(repo)
    (tmp_path / "hub" / "targets" / "alias").symlink_to(tmp_path / "hub" / "targets" / "digits")
    aliased = path.replace("targets/digits/", "targets/alias/")
    assert _served(repo, aliased) == _served(repo, path) == b"bundle " * 300


@pytest.mark.parametrize(
    "path",
    ["metadata/../keys/root.pem", "targets/digits/../../keys/root.pem", "/etc/passwd",
     "metadata/./root.json", "metadata//root.json", "targets\\digits", "metadata/root.json\0",
     "metadata/root.json/"],
)  # fmt: skip
def test_paths_with_dots_or_odd_parts_are_refused(repo: TrustRepository, path: str) -> None:
    with pytest.raises(TrustError, match=r"^bad repository path "):
        repo.open_file(path)


def test_a_file_where_a_folder_should_be_is_not_found(repo: TrustRepository) -> None:
    with pytest.raises(FileNotFoundError):
        repo.open_file(f"{_target_path(repo)}/more")


def test_a_folder_is_not_found(repo: TrustRepository) -> None:
    with pytest.raises(FileNotFoundError):
        repo.open_file("targets/digits")


def test_large_files_are_streamed_not_cached(repo: TrustRepository, tmp_path: Path) -> None:
    big = tmp_path / "hub" / "targets" / "big.bin"
    big.write_bytes(os.urandom(200_000))
    size, handle = repo.open_file("targets/big.bin")
    with handle:
        assert size == 200_000 and handle.read() == big.read_bytes()


# --- the cache alone -----------------------------------------------------------------


def _stat(tmp_path: Path, data: bytes, name: str = "f") -> os.stat_result:
    file = tmp_path / name
    file.write_bytes(data)
    return file.stat()


def _later(info: os.stat_result) -> int:
    return info.st_ctime_ns + SETTLE_NS


def test_cache_hits_only_the_same_file(tmp_path: Path) -> None:
    cache = SmallFileCache(100, 1000)
    info = _stat(tmp_path, b"abc")
    cache.put("p", info, b"abc", _later(info))
    assert "p" in cache and cache.get("p", info) == b"abc"
    other = _stat(tmp_path, b"abc", "g")
    assert cache.get("p", other) is None and cache.get("q", info) is None


def test_cache_skips_recent_large_and_torn_files(tmp_path: Path) -> None:
    cache = SmallFileCache(4, 1000)
    info = _stat(tmp_path, b"abc")
    cache.put("recent", info, b"abc", _later(info) - 1)
    big = _stat(tmp_path, b"abcde", "big")
    cache.put("big", big, b"abcde", _later(big))
    cache.put("torn", info, b"ab", _later(info))
    assert "recent" not in cache and "big" not in cache and "torn" not in cache


def test_cache_drops_the_oldest_to_stay_in_its_bytes(tmp_path: Path) -> None:
    cache = SmallFileCache(10, 10)
    infos = [_stat(tmp_path, b"x" * 4, f"f{i}") for i in range(3)]
    for i, info in enumerate(infos):
        cache.put(f"f{i}", info, b"x" * 4, _later(info))
    assert "f0" not in cache and cache.get("f1", infos[1]) == cache.get("f2", infos[2]) == b"xxxx"
    cache.put("f1", infos[1], b"x" * 4, _later(infos[1]))  # the same path again, no growth
    assert cache.get("f2", infos[2]) == b"xxxx"


def test_cache_refuses_negative_caps() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        SmallFileCache(-1, 10)
