"""Folder-per-class data sets: decoding, content hash, caps and refusals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from converters.datasets import (
    DatasetCaps,
    builtin_dataset,
    hash_image_folder,
    load_dataset,
    load_image_folder,
)
from converters.errors import DatasetError


def _make_folder(root: Path, per_class: int = 6, side: int = 12) -> Path:
    rng = np.random.default_rng(0)
    for label in ("cat", "dog"):
        (root / label).mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / label / f"{i}.png")
    return root


def test_folder_loads_with_labels_shapes_and_hash(tmp_path: Path) -> None:
    root = _make_folder(tmp_path / "pets")
    (root / "cat" / ".DS_Store").write_bytes(b"junk")  # hidden files are ignored
    data = load_image_folder(root, size=(8, 10))
    assert data.classes == ("cat", "dog")
    assert data.x.shape == (12, 1, 8, 10) and data.x.dtype == np.float32
    assert float(data.x.min()) >= 0.0 and float(data.x.max()) <= 1.0
    assert list(data.y) == [0] * 6 + [1] * 6
    assert data.content_hash == hash_image_folder(root)
    rgb = load_image_folder(root, size=(4, 4), grayscale=False)
    assert rgb.x.shape == (12, 3, 4, 4)
    assert rgb.content_hash == data.content_hash  # the hash is of the files, not the decoding


def test_hash_changes_with_bytes_and_names(tmp_path: Path) -> None:
    root = _make_folder(tmp_path / "pets")
    before = hash_image_folder(root)
    image = root / "dog" / "0.png"
    image.rename(root / "dog" / "zz.png")
    renamed = hash_image_folder(root)
    assert renamed != before
    data = bytearray((root / "dog" / "zz.png").read_bytes())
    data[-20] ^= 0xFF
    (root / "dog" / "zz.png").write_bytes(bytes(data))
    assert hash_image_folder(root) not in {before, renamed}


def test_split_is_stratified(tmp_path: Path) -> None:
    data = load_image_folder(_make_folder(tmp_path / "pets", per_class=10), size=(8, 8))
    splits = data.split(seed=0)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (14, 2, 4)
    assert sorted(splits.test.y.tolist()) == [0, 0, 1, 1]


@pytest.mark.parametrize(
    ("caps", "match"),
    [
        (DatasetCaps(max_files=5), "more than 5"),
        (DatasetCaps(max_file_bytes=100), "over the cap"),
        (DatasetCaps(max_side=8), "over 8 px"),
        (DatasetCaps(max_classes=1), "classes"),
        (DatasetCaps(max_total_bytes=1000), "in all"),
    ],
)
def test_caps_refuse_before_decoding(tmp_path: Path, caps: DatasetCaps, match: str) -> None:
    root = _make_folder(tmp_path / "pets")
    with pytest.raises(DatasetError, match=match):
        load_image_folder(root, caps=caps)


def test_bad_layouts_are_refused(tmp_path: Path) -> None:
    root = _make_folder(tmp_path / "pets")
    (root / "loose.png").write_bytes((root / "cat" / "0.png").read_bytes())
    with pytest.raises(DatasetError, match="not a class folder"):
        load_image_folder(root)
    (root / "loose.png").unlink()
    (root / "cat" / "notes.txt").write_text("hello")
    with pytest.raises(DatasetError, match="not an image"):
        load_image_folder(root)
    (root / "cat" / "notes.txt").unlink()
    (root / "cat" / "link.png").symlink_to(root / "dog" / "0.png")
    with pytest.raises(DatasetError, match="not a regular file"):
        load_image_folder(root)
    (root / "cat" / "link.png").unlink()
    (root / "cat" / "broken.png").write_bytes(b"\x89PNG not really")
    with pytest.raises(DatasetError, match="cannot decode"):
        load_image_folder(root)
    with pytest.raises(DatasetError):
        load_image_folder(tmp_path / "missing")


def test_builtin_digits() -> None:
    digits = builtin_dataset("digits")
    assert digits.x.shape == (1797, 1, 8, 8) and digits.classes[0] == "0"
    assert digits.content_hash == builtin_dataset("digits").content_hash
    assert load_dataset("digits").content_hash == digits.content_hash
    with pytest.raises(DatasetError, match="unknown built-in"):
        builtin_dataset("imagenet")
