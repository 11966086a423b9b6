"""Decoding images, WAV audio and text without Pillow: compared with Pillow on real files."""

from __future__ import annotations

import io
import sys
import wave
import zlib
from pathlib import Path

import numpy as np
import pytest
import skimage
from PIL import Image

from edge_agent.errors import InputError
from edge_agent.media import decode_png, decode_pnm, read_image, read_lines, read_wav

DATA = Path(skimage.__file__).parent / "data"


def _pillow(path: Path | io.BytesIO) -> np.ndarray:
    with Image.open(path) as image:
        grey = image.mode in ("L", "I;16", "1")
        return np.asarray(image.convert("L" if grey else "RGB"))


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("*.png")))
def test_every_scikit_image_png_decodes_as_pillow_decodes_it(name: str) -> None:
    np.testing.assert_array_equal(read_image(DATA / name), _pillow(DATA / name))


@pytest.mark.parametrize("mode", ["1", "L", "P", "RGB", "RGBA", "LA", "I;16"])
def test_each_png_colour_type_and_depth_decodes(mode: str) -> None:
    photo = Image.open(DATA / "chelsea.png").convert("RGB").resize((61, 37))
    image = photo.convert("L").convert("I;16") if mode == "I;16" else photo.convert(mode)
    buffer = io.BytesIO()
    image.save(buffer, "PNG", optimize=mode in ("P", "1"))
    with Image.open(buffer) as saved:
        if mode == "I;16":  # 16-bit samples keep their high byte (Pillow clips at 255)
            expected = (np.asarray(saved).astype(np.uint16) >> 8).astype(np.uint8)
        else:
            expected = np.asarray(saved.convert("L" if mode in ("1", "L", "LA") else "RGB"))
    np.testing.assert_array_equal(decode_png(buffer.getvalue()), expected)


@pytest.mark.parametrize("mode", ["L", "RGB"])
def test_pgm_and_ppm_decode(mode: str, tmp_path: Path) -> None:
    image = Image.open(DATA / "astronaut.png").convert(mode)
    image.save(tmp_path / "x.pnm")
    np.testing.assert_array_equal(read_image(tmp_path / "x.pnm"), np.asarray(image))


def test_a_sixteen_bit_pgm_is_scaled_to_eight_bits() -> None:
    header = b"P5\n# made here\n2 1\n65535\n"
    assert decode_pnm(header + b"\xff\xff\x80\x00").tolist() == [[255, 128]]


def _png(ihdr: bytes, data: bytes) -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body).to_bytes(4, "big")
        return len(body).to_bytes(4, "big") + kind + body + crc

    magic = b"\x89PNG\r\n\x1a\n"
    return magic + chunk(b"IHDR", ihdr) + chunk(b"IDAT", data) + chunk(b"IEND", b"")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"GIF89a", "not a PNG"),
        (
            _png(b"\x00\x00\x00\x02\x00\x00\x00\x01\x08\x00\x00\x00\x00", zlib.compress(b"\0\0")),
            "holds",
        ),
        (_png(b"\xff\xff\xff\xff\xff\xff\xff\xff\x08\x00\x00\x00\x00", b""), "pixels"),
        (_png(b"\x00\x00\x00\x01\x00\x00\x00\x01\x08\x00\x00\x00\x01", b""), "interlaced"),
        (_png(b"\x00\x00\x00\x01\x00\x00\x00\x01\x08\x00\x00\x00\x00", b"junk"), "corrupt"),
        (_png(b"\x00\x00\x00\x01\x00\x00\x00\x01\x08\x00\x00\x00\x00", b"")[:-6], "ends before"),
    ],
)
def test_bad_pngs_are_refused_clearly(data: bytes, message: str) -> None:
    with pytest.raises(InputError, match=message):
        decode_png(data)


def test_a_zip_bomb_is_refused_without_inflating_it() -> None:
    bomb = zlib.compress(b"\0" * (64 << 20))
    with pytest.raises(InputError, match="holds"):
        decode_png(_png(b"\x00\x00\x00\x10\x00\x00\x00\x10\x08\x00\x00\x00\x00", bomb))


def test_other_formats_go_through_pillow_when_it_is_there(tmp_path: Path) -> None:
    jpeg = read_image(DATA / "rocket.jpg")
    np.testing.assert_array_equal(jpeg, _pillow(DATA / "rocket.jpg"))


def test_other_formats_without_a_library_say_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for module in ("PIL.Image", "cv2"):  # None in sys.modules: importing it fails
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(InputError, match="install one of them"):
        read_image(DATA / "rocket.jpg")


def _wav(path: Path, pcm: np.ndarray, rate: int, channels: int = 1, width: int = 2) -> Path:
    with wave.open(str(path), "wb") as out:
        out.setnchannels(channels)
        out.setsampwidth(width)
        out.setframerate(rate)
        out.writeframes(pcm.tobytes())
    return path


def test_wav_is_mixed_to_mono_and_resampled_to_16k(tmp_path: Path) -> None:
    t = np.arange(8000) / 8000
    tone = (np.sin(2 * np.pi * 440 * t) * 10000).astype("<i2")
    stereo = np.stack([tone, tone], axis=1)
    samples = read_wav(_wav(tmp_path / "a.wav", stereo, 8000, channels=2))
    assert samples.dtype == np.int16 and len(samples) == 16000
    spectrum = np.abs(np.fft.rfft(samples))
    assert abs(np.argmax(spectrum) - 440) <= 1  # one second: bin i is i Hz
    eight_bit = read_wav(_wav(tmp_path / "b.wav", np.array([0, 128, 255], np.uint8), 16000, 1, 1))
    assert eight_bit.tolist() == [-32768, 0, 32512]


def test_a_file_that_is_not_wav_is_refused(tmp_path: Path) -> None:
    (tmp_path / "x.wav").write_bytes(b"RIFF....not a wave")
    with pytest.raises(InputError, match="not a PCM WAV"):
        read_wav(tmp_path / "x.wav")


def test_text_lines_are_stripped_and_blank_ones_dropped(tmp_path: Path) -> None:
    (tmp_path / "t.txt").write_text("  one \n\n two\n", encoding="utf-8")
    assert read_lines(tmp_path / "t.txt") == ["one", "two"]
    (tmp_path / "b.txt").write_bytes(b"\xff\xfe")
    with pytest.raises(InputError, match="UTF-8"):
        read_lines(tmp_path / "b.txt")
