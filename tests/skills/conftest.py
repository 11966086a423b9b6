"""Shared fixtures for the skills tests: a valid skill source folder and unsafe archives."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from skills.archive import ArchiveLimits
from skills.drift_reference import build_reference

MANIFEST = """\
[skill]
name = "face-detect"
version = "1.2.0"
entrypoint = "detector:FaceDetect"
description = "Finds faces"

[[inputs]]
name = "image"
dtype = "float32"
shape = [1, 3, -1, -1]

[[outputs]]
name = "boxes"
dtype = "float32"
shape = [-1, 4]

[[models]]
model = "detector"
target = "onnx-cpu"
path = "models/detector.onnx"

[[models]]
model = "detector"
target = "tflite"
path = "models/detector.tflite"
precision = "int8"

[drift]
reference = "drift/reference.json"
inputs = ["brightness"]
"""

#: A drift reference holding the one input summary ``MANIFEST`` declares.
REFERENCE = build_reference(
    ["face", "face", "none"], [0.9, 0.7, 0.4], {"brightness": [0.2, 0.5, 0.6]}
).to_json()


@pytest.fixture
def skill_src(tmp_path: Path) -> Path:
    """A skill source folder that builds, with a Python cache that must stay out."""
    src = tmp_path / "src"
    (src / "control" / "__pycache__").mkdir(parents=True)
    (src / "models").mkdir()
    (src / "data").mkdir()
    (src / "drift").mkdir()
    (src / "skill.toml").write_text(MANIFEST)
    (src / "control" / "detector.py").write_text("class FaceDetect:\n    pass\n")
    (src / "control" / "__pycache__" / "detector.cpython-311.pyc").write_bytes(os.urandom(64))
    (src / "models" / "detector.onnx").write_bytes(os.urandom(3000))
    (src / "models" / "detector.tflite").write_bytes(os.urandom(2000))
    (src / "drift" / "reference.json").write_text(REFERENCE)
    (src / "data" / "labels.txt").write_text("face\n")
    return src


def add_file(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    tar.addfile(info, io.BytesIO(data))


def add_special(tar: tarfile.TarFile, name: str, kind: bytes, linkname: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    if kind in (tarfile.CHRTYPE, tarfile.BLKTYPE):
        info.devmajor, info.devminor = 1, 3
    tar.addfile(info)


def add_zeros(tar: tarfile.TarFile, name: str, size: int) -> None:
    info = tarfile.TarInfo(name)
    info.size = size

    class Zeros(io.RawIOBase):
        def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
            # Endless zeros; tarfile reads exactly info.size bytes.
            buffer[:] = bytes(len(buffer))
            return len(buffer)

    tar.addfile(info, Zeros())


@dataclass(frozen=True)
class Unsafe:
    """An archive that must be refused: how to fill it and what the error must say."""

    fill: Callable[[tarfile.TarFile, Path], None]
    reason: str
    limits: ArchiveLimits = field(default_factory=ArchiveLimits)


def _valid_prefix(tar: tarfile.TarFile) -> None:
    # Real content first, so the test also proves that files already written are removed.
    add_file(tar, "skill.toml", b"[skill]\n")
    add_file(tar, "control/ok.py", b"x = 1\n")


UNSAFE: dict[str, Unsafe] = {
    "traversal": Unsafe(lambda t, r: add_file(t, "../evil", b"x"), "'..'"),
    "deep-traversal": Unsafe(lambda t, r: add_file(t, "control/../../../evil", b"x"), "'..'"),
    "absolute": Unsafe(lambda t, r: add_file(t, str(r / "abs-evil"), b"x"), "absolute"),
    "symlink": Unsafe(lambda t, r: add_special(t, "link", tarfile.SYMTYPE, str(r)), "symbolic"),
    "hardlink": Unsafe(
        lambda t, r: add_special(t, "hard", tarfile.LNKTYPE, "skill.toml"), "hard link"
    ),
    "char-device": Unsafe(lambda t, r: add_special(t, "null", tarfile.CHRTYPE), "character"),
    "block-device": Unsafe(lambda t, r: add_special(t, "disk", tarfile.BLKTYPE), "block"),
    "fifo": Unsafe(lambda t, r: add_special(t, "pipe", tarfile.FIFOTYPE), "fifo"),
    "duplicate": Unsafe(lambda t, r: add_file(t, "control/ok.py", b"y"), "duplicate"),
    "duplicate-double-slash": Unsafe(lambda t, r: add_file(t, "control//ok.py", b"y"), "duplicate"),
    "duplicate-dot": Unsafe(lambda t, r: add_file(t, "./control/ok.py", b"y"), "duplicate"),
    "file-over-dir": Unsafe(lambda t, r: add_file(t, "control", b"y"), "directory"),
    "bomb": Unsafe(lambda t, r: add_zeros(t, "models/zeros.bin", 50_000_000), "ratio"),
    "too-many-entries": Unsafe(
        lambda t, r: [add_file(t, f"data/{i}", b"x") for i in range(10)],
        "entries",
        ArchiveLimits(max_entries=8),
    ),
    "file-over-cap": Unsafe(
        lambda t, r: add_file(t, "models/big.bin", os.urandom(2000)),
        "cap",
        ArchiveLimits(max_file_bytes=1000),
    ),
    "total-over-cap": Unsafe(
        lambda t, r: [add_file(t, f"models/{i}.bin", os.urandom(900)) for i in range(3)],
        "cap",
        ArchiveLimits(max_total_bytes=2000),
    ),
}


@pytest.fixture(params=sorted(UNSAFE))
def unsafe_archive(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, Unsafe]:
    """Each unsafe archive in turn, written to ``tmp_path/unsafe.skill``."""
    case = UNSAFE[request.param]
    path = tmp_path / "unsafe.skill"
    with tarfile.open(path, "w:gz") as tar:
        _valid_prefix(tar)
        case.fill(tar, tmp_path)
    return path, case


def _snapshot(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture
def snapshot() -> Callable[[Path], list[str]]:
    """Lists every path under a folder, to prove nothing was left behind or written outside."""
    return _snapshot
