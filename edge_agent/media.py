"""Decoding the files a device feeds its skills: PNG and PNM images, WAV audio, text.

The agent installs without Pillow or OpenCV, so the lossless formats a camera
pipeline or a test set is most often saved in are read here with numpy and the
standard library (``zlib``, ``wave``). Other image formats (JPEG, ...) are read
through Pillow or OpenCV when one of them is installed, and refused with a
message that says so when neither is.

Images come out as ``uint8`` arrays, ``[H, W]`` for grey and ``[H, W, 3]`` for
colour (an alpha channel is dropped, a palette is expanded, 16-bit samples keep
their high byte); audio as 16 kHz mono ``int16``. Every size read from a file
has a cap: a hostile file gets an :class:`~edge_agent.errors.InputError`, never
an unbounded allocation.
"""

from __future__ import annotations

import importlib
import struct
import wave
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from edge_agent.errors import InputError

__all__ = [
    "AUDIO_RATE",
    "IMAGE_SUFFIXES",
    "MAX_FILE_BYTES",
    "MAX_PIXELS",
    "decode_png",
    "decode_pnm",
    "read_image",
    "read_lines",
    "read_wav",
]

MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_PIXELS = 64 * 1024 * 1024
MAX_LINES = 100_000
MAX_AUDIO_S = 3600
AUDIO_RATE = 16000
IMAGE_SUFFIXES = frozenset({".png", ".ppm", ".pgm", ".pnm", ".jpg", ".jpeg", ".bmp", ".webp"})

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # colour type: samples per pixel


def _read_capped(path: Path) -> bytes:
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise InputError(f"{path} is larger than {MAX_FILE_BYTES} bytes")
        return path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from exc


def _check_size(width: int, height: int, what: str) -> None:
    if not (width > 0 and height > 0 and width * height <= MAX_PIXELS):
        raise InputError(f"{what}: {width}x{height} pixels is outside 1..{MAX_PIXELS}")


# -- PNG ------------------------------------------------------------------------------


def _chunks(data: bytes) -> dict[bytes, list[bytes]]:
    if not data.startswith(_PNG_MAGIC):
        raise InputError("not a PNG file")
    found: dict[bytes, list[bytes]] = {}
    at = len(_PNG_MAGIC)
    while at + 8 <= len(data):
        size, kind = struct.unpack(">I4s", data[at : at + 8])
        body = data[at + 8 : at + 8 + size]
        if len(body) != size or zlib.crc32(kind + body) != int.from_bytes(
            data[at + 8 + size : at + 12 + size], "big"
        ):
            raise InputError(f"PNG chunk {kind!r} is truncated or corrupt")
        found.setdefault(kind, []).append(body)
        at += 12 + size
        if kind == b"IEND":
            return found
    raise InputError("PNG file ends before its IEND chunk")


def _inflate(data: bytes, limit: int) -> bytes:
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error as exc:
        raise InputError(f"PNG image data is corrupt: {exc}") from exc
    if len(out) != limit or inflater.unconsumed_tail:
        raise InputError(f"PNG image data holds {len(out)} bytes, not the {limit} its size says")
    return out


def _unfilter_row(kind: int, line: np.ndarray, prev: np.ndarray, bpp: int) -> np.ndarray:
    """One scan line without its PNG filter (RFC 2083, 6.3)."""
    if kind == 0:
        return line
    if kind == 1:  # Sub: a running sum per byte position of a pixel, modulo 256
        return line.reshape(-1, bpp).cumsum(axis=0, dtype=np.uint8).reshape(-1)
    if kind == 2:
        return line + prev  # uint8 arithmetic wraps, as the filter's does
    if kind not in (3, 4):
        raise InputError(f"PNG row filter {kind} is unknown")
    out, up = bytearray(line.tobytes()), prev.tobytes()
    for i in range(len(out)):  # Average and Paeth depend on the byte just decoded
        a = out[i - bpp] if i >= bpp else 0
        b = up[i]
        if kind == 3:
            out[i] = (out[i] + ((a + b) >> 1)) & 0xFF
            continue
        c = up[i - bpp] if i >= bpp else 0
        p = a + b - c
        pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
        out[i] = (out[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
    return np.frombuffer(bytes(out), np.uint8)


def _samples(raw: np.ndarray, depth: int, width: int, channels: int) -> np.ndarray:
    """Unpacked samples of one image, ``[H, W, channels]`` (8-bit; 16-bit keeps its high byte)."""
    height = raw.shape[0]
    if depth == 16:
        return raw.reshape(height, width, channels, 2)[..., 0]
    if depth == 8:
        return raw.reshape(height, width, channels)
    bits = np.unpackbits(raw, axis=1).reshape(height, -1, depth)
    weights = (1 << np.arange(depth - 1, -1, -1)).astype(np.uint8)
    values = (bits * weights).sum(axis=2, dtype=np.uint8)[:, :width]
    return values[..., None]


def decode_png(data: bytes) -> np.ndarray:
    """A non-interlaced PNG image as ``uint8`` ``[H, W]`` (grey) or ``[H, W, 3]`` (colour).

    Raises:
        InputError: Not a PNG, corrupt, interlaced, or over :data:`MAX_PIXELS`.
    """
    chunks = _chunks(data)
    if b"IHDR" not in chunks or len(chunks[b"IHDR"][0]) != 13:
        raise InputError("PNG file has no valid IHDR chunk")
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", chunks[b"IHDR"][0])
    _check_size(width, height, "PNG image")
    if colour not in _PNG_CHANNELS or depth not in (1, 2, 4, 8, 16):
        raise InputError(f"PNG colour type {colour} at {depth} bits is not supported")
    if interlace:
        raise InputError("interlaced PNG images are not supported; save it without interlace")
    channels = _PNG_CHANNELS[colour]
    stride = (width * channels * depth + 7) // 8
    raw = _inflate(b"".join(chunks.get(b"IDAT", [])), height * (stride + 1))
    rows = np.frombuffer(raw, np.uint8).reshape(height, stride + 1)
    bpp = max(1, channels * depth // 8)
    out = np.empty((height, stride), np.uint8)
    prev = np.zeros(stride, np.uint8)
    for y in range(height):
        prev = out[y] = _unfilter_row(int(rows[y, 0]), rows[y, 1:], prev, bpp)
    pixels = _samples(out, depth, width, channels)
    if colour == 3:
        palette = np.frombuffer(chunks.get(b"PLTE", [b""])[0], np.uint8).reshape(-1, 3)
        if pixels.max(initial=0) >= len(palette):
            raise InputError("PNG palette index outside its palette")
        return palette[pixels[..., 0]]
    if depth < 8:  # grey at 1, 2 or 4 bits: stretch to 0..255
        pixels = pixels * np.uint8(255 // ((1 << depth) - 1))
    if channels in (1, 2):
        return np.ascontiguousarray(pixels[..., 0])
    return np.ascontiguousarray(pixels[..., :3])


# -- PNM ------------------------------------------------------------------------------


def decode_pnm(data: bytes) -> np.ndarray:
    """A binary PGM (``P5``) or PPM (``P6``) image, as :func:`decode_png` returns images.

    Raises:
        InputError: Not such a file, truncated, or over :data:`MAX_PIXELS`.
    """
    fields: list[bytes] = []
    at = 0
    while len(fields) < 4:
        while at < len(data) and data[at : at + 1].isspace():
            at += 1
        if data[at : at + 1] == b"#":
            at = data.find(b"\n", at) + 1 or len(data)
            continue
        end = at
        while end < len(data) and not data[end : end + 1].isspace():
            end += 1
        if end == at:
            raise InputError("PNM header is truncated")
        fields.append(data[at:end])
        at = end
    magic, *sizes = fields
    if magic not in (b"P5", b"P6") or not all(s.isdigit() for s in sizes):
        raise InputError("not a binary PGM (P5) or PPM (P6) file")
    width, height, top = (int(s) for s in sizes)
    _check_size(width, height, "PNM image")
    if not 0 < top < 65536:
        raise InputError(f"PNM maximum value {top} is outside 1..65535")
    channels = 3 if magic == b"P6" else 1
    dtype = np.dtype(">u2") if top > 255 else np.dtype(np.uint8)
    size = width * height * channels * dtype.itemsize
    body = data[at + 1 : at + 1 + size]
    if len(body) != size:
        raise InputError("PNM pixel data is truncated")
    pixels = np.frombuffer(body, dtype).astype(np.float64) * (255.0 / top)
    image = pixels.round().astype(np.uint8).reshape(height, width, channels)
    return image[..., 0] if channels == 1 else image


# -- other images, through a library the device may have ----------------------------------


def _decode_with_library(path: Path) -> np.ndarray:
    for module, read in (("PIL.Image", _read_pillow), ("cv2", _read_opencv)):
        try:
            library = importlib.import_module(module)
        except ImportError:
            continue
        return read(library, path)
    raise InputError(
        f"{path.name}: only PNG, PGM and PPM images are read without Pillow or OpenCV; "
        "install one of them (pip install pillow) or convert the image to PNG"
    )


def _read_pillow(library: object, path: Path) -> np.ndarray:
    try:
        with library.open(path) as image:  # type: ignore[attr-defined]
            width, height = image.size
            _check_size(width, height, path.name)
            grey = image.mode in ("L", "I;16", "1")
            return np.asarray(image.convert("L" if grey else "RGB"))
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read the image {path}: {exc}") from exc


def _read_opencv(library: object, path: Path) -> np.ndarray:
    image = library.imread(str(path))  # type: ignore[attr-defined]
    if image is None:
        raise InputError(f"cannot read the image {path}")
    return np.ascontiguousarray(image[..., ::-1]) if image.ndim == 3 else image


def read_image(path: Path) -> np.ndarray:
    """The image in ``path``: PNG, PGM or PPM here, other formats through Pillow or OpenCV.

    Raises:
        InputError: It cannot be read, is malformed, too large, or needs a missing library.
    """
    data = _read_capped(path)
    try:
        if data.startswith(_PNG_MAGIC):
            return decode_png(data)
        if data[:2] in (b"P5", b"P6"):
            return decode_pnm(data)
    except InputError as exc:
        raise InputError(f"{path}: {exc}") from exc
    return _decode_with_library(path)


# -- audio and text -------------------------------------------------------------------


def resample(samples: np.ndarray, rate: int, to: int = AUDIO_RATE) -> np.ndarray:
    """``samples`` (float) at ``rate`` Hz, linearly resampled to ``to`` Hz."""
    if rate == to or samples.size == 0:
        return samples
    times = np.arange(round(samples.size * to / rate)) * (rate / to)
    return np.interp(times, np.arange(samples.size), samples)


def read_wav(path: Path) -> np.ndarray:
    """A PCM WAV file as 16 kHz mono ``int16`` samples (channels averaged, resampled).

    Raises:
        InputError: Not a PCM WAV file, longer than :data:`MAX_AUDIO_S`, or unreadable.
    """
    try:
        with wave.open(str(path), "rb") as wav:
            rate, width, channels = wav.getframerate(), wav.getsampwidth(), wav.getnchannels()
            if wav.getnframes() > MAX_AUDIO_S * rate:
                raise InputError(f"{path} is longer than {MAX_AUDIO_S} s")
            frames = wav.readframes(wav.getnframes())
    except (OSError, EOFError, wave.Error) as exc:
        raise InputError(f"{path} is not a PCM WAV file: {exc}") from exc
    if width not in (1, 2, 4) or not 0 < rate <= 384_000 or channels < 1:
        raise InputError(f"{path}: {width * 8}-bit samples at {rate} Hz are not supported")
    dtype: np.dtype[Any] = np.dtype({1: "u1", 2: "<i2", 4: "<i4"}[width])
    pcm = np.frombuffer(frames[: len(frames) // (width * channels) * width * channels], dtype)
    values = pcm.astype(np.float64).reshape(-1, channels).mean(axis=1)
    if width == 1:  # unsigned 8-bit, centred on 128
        values = (values - 128.0) * 256.0
    elif width == 4:
        values /= 65536.0
    mono = resample(values, rate)
    return np.clip(mono.round(), -32768, 32767).astype(np.int16)


def read_lines(path: Path) -> list[str]:
    """The non-empty lines of a UTF-8 text file, stripped, at most :data:`MAX_LINES`.

    Raises:
        InputError: It is unreadable, not UTF-8, or has too many lines.
    """
    try:
        text = _read_capped(path).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path} is not UTF-8 text") from exc
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) > MAX_LINES:
        raise InputError(f"{path} has more than {MAX_LINES} lines")
    return lines
