from __future__ import annotations

import gzip
import io
import os
import stat
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from skills.archive import ArchiveLimits, read_member, safe_extract, write_archive
from skills.errors import ArchiveError

Snapshot = Callable[[Path], list[str]]


def _add(tar: tarfile.TarFile, name: str, data: bytes = b"", mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    tar.addfile(info, io.BytesIO(data))


def _add_dir(tar: tarfile.TarFile, name: str, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = mode
    tar.addfile(info)


def _tree(root: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
    }


def test_extracts_files_with_fixed_modes(tmp_path: Path) -> None:
    archive = tmp_path / "ok.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        _add_dir(tar, "./")
        _add_dir(tar, "bin", mode=0o777)
        _add(tar, "bin/tool", b"#!/bin/sh\n", mode=0o4755)  # setuid + exec must not survive
        _add(tar, "./deep/er/data.txt", b"hello")  # parents created implicitly
        _add_dir(tar, "deep")  # an explicit entry after its implicit creation is fine
    dest = tmp_path / "out"
    names = safe_extract(archive, dest)
    assert names == ["bin", "bin/tool", "deep/er/data.txt", "deep"]
    assert (dest / "deep" / "er" / "data.txt").read_bytes() == b"hello"
    assert stat.S_IMODE((dest / "bin" / "tool").stat().st_mode) == 0o644
    assert stat.S_IMODE((dest / "bin").stat().st_mode) == 0o755
    assert stat.S_IMODE((dest / "deep" / "er").stat().st_mode) == 0o755


def test_extracts_into_existing_empty_dir(tmp_path: Path) -> None:
    archive = tmp_path / "ok.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        _add(tar, "a", b"1")
    dest = tmp_path / "out"
    dest.mkdir()
    assert safe_extract(archive, dest) == ["a"]


def test_refuses_non_empty_destination_and_keeps_it(tmp_path: Path) -> None:
    archive = tmp_path / "ok.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        _add(tar, "a", b"1")
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "keep").write_text("mine")
    with pytest.raises(ArchiveError, match="not an empty directory"):
        safe_extract(archive, dest)
    assert (dest / "keep").read_text() == "mine"


def test_refuses_symlinked_destination(tmp_path: Path) -> None:
    archive = tmp_path / "ok.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        _add(tar, "a", b"1")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "out").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ArchiveError, match="symbolic link"):
        safe_extract(archive, tmp_path / "out")
    assert not any((tmp_path / "elsewhere").iterdir())


def test_unsafe_archive_is_refused_and_cleaned(
    unsafe_archive: tuple[Path, Any], tmp_path: Path, snapshot: Snapshot
) -> None:
    archive, case = unsafe_archive
    (tmp_path / "box").mkdir()
    dest = tmp_path / "box" / "dest"
    before = snapshot(tmp_path)
    with pytest.raises(ArchiveError) as err:
        safe_extract(archive, dest, case.limits)
    assert case.reason in str(err.value)
    assert snapshot(tmp_path) == before


def test_unsafe_archive_leaves_existing_empty_dest_empty(
    unsafe_archive: tuple[Path, Any], tmp_path: Path, snapshot: Snapshot
) -> None:
    archive, case = unsafe_archive
    dest = tmp_path / "dest"
    dest.mkdir()
    before = snapshot(tmp_path)
    with pytest.raises(ArchiveError):
        safe_extract(archive, dest, case.limits)
    assert snapshot(tmp_path) == before


def test_error_names_the_entry(tmp_path: Path) -> None:
    archive = tmp_path / "evil.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        _add(tar, "fine.txt", b"x")
        _add(tar, "../escape.txt", b"x")
    with pytest.raises(ArchiveError, match=r"'\.\./escape\.txt'.*'\.\.'"):
        safe_extract(archive, tmp_path / "out")


def test_refuses_archive_over_size_cap_before_creating_dest(tmp_path: Path) -> None:
    archive = tmp_path / "big.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        _add(tar, "a", os.urandom(4000))
    with pytest.raises(ArchiveError, match="over"):
        safe_extract(archive, tmp_path / "out", ArchiveLimits(max_archive_bytes=1000))
    assert not (tmp_path / "out").exists()


def test_refuses_truncated_and_garbage_archives(tmp_path: Path) -> None:
    good = tmp_path / "good.tar.gz"
    with tarfile.open(good, "w:gz") as tar:
        _add(tar, "a", os.urandom(50_000))
    truncated = tmp_path / "truncated.tar.gz"
    truncated.write_bytes(good.read_bytes()[:20_000])
    garbage = tmp_path / "garbage.tar.gz"
    garbage.write_bytes(b"this is not gzip at all")
    for archive in (truncated, garbage):
        with pytest.raises(ArchiveError, match="unreadable"):
            safe_extract(archive, tmp_path / "out")
        assert not (tmp_path / "out").exists()


def test_oversized_pax_header_is_cut_off(tmp_path: Path) -> None:
    archive = tmp_path / "pax.tar.gz"
    with tarfile.open(archive, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("a")
        info.pax_headers = {"comment": os.urandom(200_000).hex()}
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(ArchiveError, match="headers exceed"):
        safe_extract(archive, tmp_path / "out")


def test_compressible_small_archive_is_not_a_bomb(tmp_path: Path) -> None:
    archive = tmp_path / "text.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        _add(tar, "zeros", bytes(500_000))  # ratio far over 100, but under the 1 MiB floor
    assert safe_extract(archive, tmp_path / "out") == ["zeros"]


def test_read_member(tmp_path: Path) -> None:
    archive = tmp_path / "a.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        _add(tar, "first.bin", os.urandom(3000))
        _add(tar, "./skill.toml", b"[skill]\n")
        link = tarfile.TarInfo("later-symlink")
        link.type = tarfile.SYMTYPE
        link.linkname = "/etc/passwd"
        tar.addfile(link)
    # Reading stops at the member, so the unsafe entry after it does not matter.
    assert read_member(archive, "skill.toml", 100) == b"[skill]\n"
    with pytest.raises(ArchiveError, match="symbolic link"):
        read_member(archive, "nope", 100)
    with pytest.raises(ArchiveError, match="at most 4 bytes"):
        read_member(archive, "skill.toml", 4)


def test_read_member_reports_missing_member(tmp_path: Path) -> None:
    archive = tmp_path / "a.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        _add(tar, "a", b"1")
    assert read_member(archive, "skill.toml", 100) is None


def _sample_tree(root: Path) -> Path:
    (root / "b" / "c").mkdir(parents=True)
    (root / "a.txt").write_text("a")
    (root / "b" / "c" / "d.bin").write_bytes(os.urandom(5000))
    (root / "z.txt").write_text("z")
    return root


def test_write_archive_is_deterministic(tmp_path: Path) -> None:
    src = _sample_tree(tmp_path / "src")
    write_archive(src, tmp_path / "one.tar.gz")
    for path in src.rglob("*"):
        os.utime(path, (1_000_000, 1_000_000))
    (src / "a.txt").chmod(0o600)
    write_archive(src, tmp_path / "two.tar.gz")
    data = (tmp_path / "one.tar.gz").read_bytes()
    assert data == (tmp_path / "two.tar.gz").read_bytes()
    assert data[4:8] == b"\0\0\0\0"  # gzip header mtime
    with tarfile.open(tmp_path / "one.tar.gz") as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == ["a.txt", "z.txt", "b", "b/c", "b/c/d.bin"]
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0, 0, "", "")}
    assert {m.mode for m in members} == {0o644, 0o755}


def test_write_archive_round_trips_through_safe_extract(tmp_path: Path) -> None:
    src = _sample_tree(tmp_path / "src")
    write_archive(
        src,
        tmp_path / "a.tar.gz",
        overrides={"z.txt": b"replaced"},
        skip=lambda r: r == "b/c/d.bin",
    )
    safe_extract(tmp_path / "a.tar.gz", tmp_path / "out")
    tree = _tree(tmp_path / "out")
    assert tree == {"a.txt": b"a", "b": None, "b/c": None, "z.txt": b"replaced"}
    assert (src / "z.txt").read_text() == "z"


def test_write_archive_refuses_links_and_keeps_old_output(tmp_path: Path) -> None:
    src = _sample_tree(tmp_path / "src")
    out = tmp_path / "a.tar.gz"
    write_archive(src, out)
    old = out.read_bytes()
    (src / "link").symlink_to("/etc/passwd")
    with pytest.raises(ArchiveError, match="symbolic link"):
        write_archive(src, out)
    assert out.read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tar.gz", "src"]


def test_write_archive_refuses_override_of_missing_file(tmp_path: Path) -> None:
    src = _sample_tree(tmp_path / "src")
    with pytest.raises(ArchiveError, match=r"missing\.txt"):
        write_archive(src, tmp_path / "a.tar.gz", overrides={"missing.txt": b""})
    assert not (tmp_path / "a.tar.gz").exists()


def test_gzip_member_is_plain_gzip(tmp_path: Path) -> None:
    src = _sample_tree(tmp_path / "src")
    write_archive(src, tmp_path / "a.tar.gz")
    raw = gzip.decompress((tmp_path / "a.tar.gz").read_bytes())
    assert len(raw) % 512 == 0
