"""Property tests of what parses hostile input on the device: the manifest and the archive checker.

Whatever the input, the parsers either accept it (and then it is what it
claims) or refuse it with their own error; nothing else escapes, and a
refused archive leaves nothing behind. ``make fuzz`` runs the same targets
under atheris for longer.
"""

from __future__ import annotations

import io
import tarfile
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skills.archive import ArchiveLimits, safe_extract
from skills.errors import ArchiveError, ManifestError
from skills.manifest import Manifest

VALID = """
[skill]
name = "digits"
version = "1.0.0"
entrypoint = "digits_skill:DigitsSkill"

[resources]
memory_mb = 256
"""

_SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(st.text(max_size=2000))
def test_any_text_is_a_manifest_or_a_manifest_error(text: str) -> None:
    try:
        manifest = Manifest.from_toml(text)
    except ManifestError:
        return
    assert Manifest.from_toml(manifest.to_toml()) == manifest


@_SETTINGS
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["name", "version", "entrypoint", "description", "memory_mb", "x"]),
            st.one_of(
                st.text(max_size=80), st.integers(-(2**70), 2**70), st.booleans(), st.floats()
            ),
        ),
        max_size=6,
    )
)
def test_mutated_manifest_fields_are_accepted_consistently_or_refused(
    edits: list[tuple[str, object]],
) -> None:
    lines = VALID.strip().splitlines()
    for key, value in edits:
        rendered = (
            repr(value).replace("'", '"') if not isinstance(value, bool) else str(value).lower()
        )
        section = "[resources]" if key == "memory_mb" else "[skill]"
        lines.insert(lines.index(section) + 1, f"{key} = {rendered}")
    try:
        manifest = Manifest.from_toml("\n".join(lines))
    except ManifestError:
        return
    assert manifest.resources.memory_mb > 0
    assert Manifest.from_toml(manifest.to_toml()) == manifest


_NAMES = st.one_of(
    st.sampled_from(
        [
            "skill.toml",
            "control/a.py",
            "../evil",
            "/etc/passwd",
            "a/../../b",
            "models/",
            "./x",
            "a//b",
            "control/../../x",
            "",
            ".",
            "a\x00b",
            "dup",
        ]
    ),
    st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=40),
)
_TYPES = st.sampled_from(
    [
        tarfile.REGTYPE,
        tarfile.DIRTYPE,
        tarfile.SYMTYPE,
        tarfile.LNKTYPE,
        tarfile.FIFOTYPE,
        tarfile.CHRTYPE,
    ]
)


def _tar(members: list[tuple[str, bytes, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            info.type = kind
            info.linkname = "../../etc/passwd" if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE) else ""
            info.size = len(data) if kind == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
    return buf.getvalue()


def _inside(root: Path) -> list[Path]:
    return list(root.rglob("*"))


@_SETTINGS
@given(st.lists(st.tuples(_NAMES, _TYPES, st.binary(max_size=64)), max_size=8))
def test_an_archive_is_extracted_whole_inside_dest_or_refused_leaving_nothing(
    members: list[tuple[str, bytes, bytes]],
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        archive = work / "b.skill"
        try:
            archive.write_bytes(_tar(members))
        except (ValueError, UnicodeEncodeError, tarfile.TarError):
            return  # tarfile itself cannot write this name
        dest = work / "out"
        limits = ArchiveLimits(max_entries=16, max_total_bytes=1 << 20, max_file_bytes=1 << 16)
        try:
            names = safe_extract(archive, dest, limits)
        except ArchiveError:
            assert not dest.exists() or _inside(dest) == []
            return
        resolved = dest.resolve()
        for path in _inside(dest):
            assert not path.is_symlink()
            assert path.resolve().is_relative_to(resolved)
            assert path.is_file() or path.is_dir()
        assert len(names) == len(set(names))


@_SETTINGS
@given(st.binary(max_size=4096))
def test_random_bytes_are_never_an_archive_that_escapes(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "b.skill"
        archive.write_bytes(data)
        dest = Path(tmp) / "out"
        try:
            safe_extract(archive, dest)
        except ArchiveError:
            assert not dest.exists() or _inside(dest) == []
            return
        assert all(p.resolve().is_relative_to(dest.resolve()) for p in _inside(dest))
