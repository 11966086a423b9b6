"""Image data sets: a folder per class (what users bring) or a built-in one.

Every data set has a content hash, so a training job can name the exact data it
saw. For folders the hash covers the sorted relative paths and the file bytes;
it is computed from the raw files, before any decoding.
"""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from converters.digits import DigitsData, digits_arrays, split_dataset
from converters.errors import DatasetError

__all__ = [
    "BUILTIN_DATASETS",
    "DatasetCaps",
    "ImageDataset",
    "builtin_dataset",
    "hash_image_folder",
    "list_image_folder",
    "load_dataset",
    "load_image_folder",
    "split_dataset",
]

BUILTIN_DATASETS = ("digits",)
IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".pgm", ".ppm", ".webp"})
_PIL_FORMATS = ("PNG", "JPEG", "BMP", "GIF", "PPM", "WEBP")


@dataclass(frozen=True)
class DatasetCaps:
    """Limits on a folder data set; anything over them is refused before it is decoded.

    Attributes:
        max_files: Images in the whole data set.
        max_file_bytes: Size of one image file.
        max_total_bytes: Size of all image files together.
        max_side: Width or height of one image, in pixels.
        max_classes: Number of class folders.
    """

    max_files: int = 50_000
    max_file_bytes: int = 16 * 1024**2
    max_total_bytes: int = 2 * 1024**3
    max_side: int = 4096
    max_classes: int = 1000


@dataclass(frozen=True)
class ImageDataset:
    """A decoded data set.

    Attributes:
        name: Built-in name or folder name.
        classes: Class names, index = label.
        x: float32 ``[N, C, H, W]`` in ``[0, 1]``.
        y: int64 labels ``[N]``.
        content_hash: ``"sha256:<hex>"`` of the source data.
    """

    name: str
    classes: tuple[str, ...]
    x: np.ndarray
    y: np.ndarray
    content_hash: str

    def split(self, seed: int = 0) -> DigitsData:
        """Stratified 70 / 10 / 20 train / val / test split (see :func:`split_dataset`)."""
        return split_dataset(self.x, self.y, seed=seed)


def list_image_folder(root: Path, caps: DatasetCaps | None = None) -> list[tuple[str, Path]]:
    """List ``(class, file)`` pairs of a folder-per-class data set, sorted and within caps.

    Hidden files (``.DS_Store``...) are ignored. Symbolic links, nested folders,
    files of other types and loose files at the top level are refused.

    Raises:
        DatasetError: The layout is wrong or a cap is exceeded.
    """
    caps = caps or DatasetCaps()
    if not root.is_dir():
        raise DatasetError(f"{root} is not a folder")
    class_dirs = sorted(p for p in root.iterdir() if not p.name.startswith("."))
    if len(class_dirs) > caps.max_classes:
        raise DatasetError(f"{len(class_dirs)} classes, over the cap of {caps.max_classes}")
    if len(class_dirs) < 2:
        raise DatasetError(f"{root.name} needs at least two class folders")
    entries: list[tuple[str, Path]] = []
    total = 0
    for class_dir in class_dirs:
        if class_dir.is_symlink() or not class_dir.is_dir():
            raise DatasetError(f"{class_dir.name} at the top level is not a class folder")
        files = sorted(p for p in class_dir.iterdir() if not p.name.startswith("."))
        if not files:
            raise DatasetError(f"class folder {class_dir.name} is empty")
        for path in files:
            total += _check_file(path, caps)
            entries.append((class_dir.name, path))
            if len(entries) > caps.max_files:
                raise DatasetError(f"more than {caps.max_files} images")
            if total > caps.max_total_bytes:
                raise DatasetError(f"images exceed {caps.max_total_bytes} bytes in all")
    return entries


def _check_file(path: Path, caps: DatasetCaps) -> int:
    rel = f"{path.parent.name}/{path.name}"
    if path.is_symlink() or not path.is_file():
        raise DatasetError(f"{rel} is not a regular file (links and nested folders are refused)")
    if path.suffix.lower() not in IMAGE_SUFFIXES:
        raise DatasetError(f"{rel} is not an image ({', '.join(sorted(IMAGE_SUFFIXES))})")
    size = path.stat().st_size
    if size > caps.max_file_bytes:
        raise DatasetError(f"{rel} is {size} bytes, over the cap of {caps.max_file_bytes}")
    return size


def hash_image_folder(root: Path, caps: DatasetCaps | None = None) -> str:
    """Content hash of a folder data set: sha256 over sorted relative paths and file bytes.

    Raises:
        DatasetError: As :func:`list_image_folder`.
    """
    digest = hashlib.sha256(b"edgeskill-image-folder/1\0")
    for class_name, path in list_image_folder(root, caps):
        _hash_file(digest, f"{class_name}/{path.name}", path.read_bytes())
    return f"sha256:{digest.hexdigest()}"


def _hash_file(digest: hashlib._Hash, rel: str, data: bytes) -> None:
    # Lengths make the concatenation unambiguous: no two file sets hash the same bytes.
    name = rel.encode()
    digest.update(len(name).to_bytes(8, "big") + name + len(data).to_bytes(8, "big"))
    digest.update(data)


def load_image_folder(
    root: Path,
    *,
    size: tuple[int, int] = (32, 32),
    grayscale: bool = True,
    caps: DatasetCaps | None = None,
) -> ImageDataset:
    """Decode a folder-per-class data set, resized to ``size`` (height, width).

    Raises:
        DatasetError: Layout or caps are violated, or an image cannot be decoded.
            Nothing is returned in part.
    """
    caps = caps or DatasetCaps()
    entries = list_image_folder(root, caps)
    classes = tuple(sorted({name for name, _ in entries}))
    index = {name: i for i, name in enumerate(classes)}
    digest = hashlib.sha256(b"edgeskill-image-folder/1\0")
    images, labels = [], []
    for class_name, path in entries:
        data = path.read_bytes()
        _hash_file(digest, f"{class_name}/{path.name}", data)
        images.append(_decode(data, f"{class_name}/{path.name}", size, grayscale, caps))
        labels.append(index[class_name])
    return ImageDataset(
        name=root.name,
        classes=classes,
        x=np.stack(images).astype(np.float32),
        y=np.asarray(labels, dtype=np.int64),
        content_hash=f"sha256:{digest.hexdigest()}",
    )


def _decode(
    data: bytes, rel: str, size: tuple[int, int], grayscale: bool, caps: DatasetCaps
) -> np.ndarray:
    import io  # noqa: PLC0415

    from PIL import Image  # noqa: PLC0415

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=_PIL_FORMATS) as img:
                width, height = img.size
                if max(width, height) > caps.max_side:
                    raise DatasetError(f"{rel} is {width}x{height}, over {caps.max_side} px")
                converted = img.convert("L" if grayscale else "RGB")
                resized = converted.resize((size[1], size[0]), Image.Resampling.BILINEAR)
                pixels = np.asarray(resized, dtype=np.float32) / 255.0
    except DatasetError:
        raise
    except (
        OSError,
        ValueError,
        Image.DecompressionBombError,
        Image.DecompressionBombWarning,
    ) as exc:
        raise DatasetError(f"cannot decode {rel}: {exc}") from exc
    return pixels[None, :, :] if grayscale else pixels.transpose(2, 0, 1)


def builtin_dataset(name: str) -> ImageDataset:
    """A data set that ships with a dependency; ``"digits"`` is scikit-learn's 8x8 digits.

    Raises:
        DatasetError: Unknown name.
    """
    if name != "digits":
        raise DatasetError(
            f"unknown built-in data set {name!r}; known: {', '.join(BUILTIN_DATASETS)}"
        )
    x, y = digits_arrays()
    digest = hashlib.sha256(b"edgeskill-builtin/digits/1\0")
    digest.update(x.tobytes())
    digest.update(y.tobytes())
    classes = tuple(str(i) for i in range(10))
    return ImageDataset("digits", classes, x, y, f"sha256:{digest.hexdigest()}")


def load_dataset(
    source: str, *, size: tuple[int, int] = (8, 8), grayscale: bool = True
) -> ImageDataset:
    """A built-in data set by name, or a folder data set by path.

    Raises:
        DatasetError: Neither a built-in name nor a valid folder.
    """
    if source in BUILTIN_DATASETS:
        return builtin_dataset(source)
    return load_image_folder(Path(source), size=size, grayscale=grayscale)
