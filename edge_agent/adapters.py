"""Input adapters: files, folders and devices turned into the items skills process.

A source is anything with a length and ``item(i) -> (item, label or None)``, as
:class:`~edge_agent.workload.ReplaySource` is; the agent feeds each running
skill from one. The adapters here make such sources out of what a device
really has (files are decoded by :mod:`edge_agent.media`, numpy and the
standard library only):

- an image file or a folder of them: one ``{"image": uint8 array}`` per image;
- a WAV file: 16 kHz mono ``int16`` chunks, ``{"audio": chunk}``, the first with
  ``"reset": true`` and the last with ``"flush": true`` (a stream, as the
  voice and wake-word skills take it);
- a text file: one ``{"text": line}`` per non-empty line;
- a video file (``.mp4``, ``.avi``, ``.mkv``, ``.mov``, ``.webm``, ``.m4v``): one
  ``{"image": uint8 RGB frame}`` per frame, decoded by OpenCV (the ``video`` extra);
- ``camera:N`` (OpenCV) and ``mic:SECONDS`` (sounddevice): live, when that
  library is installed, refused with a message saying what to install when not;
- an ``.npz`` replay file (``x``, ``y``): the existing replay source;
- an inputs file (``.toml``) naming one of the above per skill::

      [inputs]
      face-detect = "photos"          # relative to the inputs file
      voice-activity = "speech.wav"

  so one agent feeds several skills, each its own kind of input.
"""

from __future__ import annotations

import importlib
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from edge_agent.errors import InputError
from edge_agent.media import AUDIO_RATE, IMAGE_SUFFIXES, read_image, read_lines, read_wav
from edge_agent.workload import ReplaySource

__all__ = [
    "VIDEO_SUFFIXES",
    "AudioStream",
    "Camera",
    "ImageFiles",
    "Microphone",
    "SkillInputs",
    "Source",
    "TextLines",
    "check_input",
    "load_input",
    "names",
    "source_for",
]

MAX_IMAGES = 10_000
#: Frames one video file may give; a longer video is refused (cut it, or use camera:PATH).
MAX_VIDEO_FRAMES = 100_000
VIDEO_SUFFIXES = frozenset({".mp4", ".avi", ".mkv", ".mov", ".webm", ".m4v"})
_OPENCV = "pip install 'edgeskill[video]' (opencv-python-headless)"
MAX_INPUTS_BYTES = 64 * 1024
DEFAULT_CHUNK_S = 0.5
_SKILL_RE = re.compile(r"[a-z][a-z0-9-]{0,62}")


class Source(Protocol):
    """Items for a skill, by index."""

    def __len__(self) -> int:
        """How many items there are."""
        ...

    def item(self, i: int) -> tuple[dict[str, Any], int | None]:
        """The ``i``-th item and its label, if known."""
        ...


@dataclass
class ImageFiles:
    """Images read from files, one item each, decoded when asked for."""

    paths: tuple[Path, ...]

    @classmethod
    def from_path(cls, path: Path) -> ImageFiles:
        """One image file, or every image file in a folder (sorted by name, not recursive).

        Raises:
            InputError: No image is there, or more than :data:`MAX_IMAGES`.
        """
        if path.is_file():
            return cls((path,))
        try:
            files = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        except OSError as exc:
            raise InputError(f"cannot list {path}: {exc.strerror or exc}") from exc
        if not files or len(files) > MAX_IMAGES:
            raise InputError(f"{path} holds {len(files)} image files, not 1..{MAX_IMAGES}")
        return cls(tuple(files))

    def __len__(self) -> int:
        return len(self.paths)

    def item(self, i: int) -> tuple[dict[str, Any], int | None]:
        """``{"image": ...}`` of the ``i``-th file."""
        return {"image": read_image(self.paths[i])}, None

    def name(self, i: int) -> str:
        """The ``i``-th file's name."""
        return self.paths[i].name


@dataclass
class AudioStream:
    """16 kHz mono samples cut into chunks: one stream, from reset to flush."""

    samples: np.ndarray
    chunk: int = round(DEFAULT_CHUNK_S * AUDIO_RATE)

    def __len__(self) -> int:
        return max(1, -(-len(self.samples) // self.chunk))

    def item(self, i: int) -> tuple[dict[str, Any], int | None]:
        """The ``i``-th chunk; the first resets the skill's stream, the last flushes it."""
        chunk = self.samples[i * self.chunk : (i + 1) * self.chunk]
        item: dict[str, Any] = {"audio": chunk}
        if i == 0:
            item["reset"] = True
        if i == len(self) - 1:
            item["flush"] = True
        return item, None

    def name(self, i: int) -> str:
        """Where the chunk starts, in seconds."""
        return f"{i * self.chunk / AUDIO_RATE:.2f} s"


@dataclass
class TextLines:
    """Lines of text, one item each."""

    lines: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.lines)

    def item(self, i: int) -> tuple[dict[str, Any], int | None]:
        """``{"text": ...}`` of the ``i``-th line."""
        return {"text": self.lines[i]}, None

    def name(self, i: int) -> str:
        """The line, shortened."""
        line = self.lines[i]
        return line if len(line) <= 40 else line[:39] + "…"


def _library(module: str, install: str, what: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise InputError(f"{what} needs {module}, which is not installed: {install}") from exc


@dataclass
class Camera:
    """Frames of a camera (or a video file) through OpenCV, ``frames`` of them."""

    device: int | str
    frames: int = 100
    _capture: Any = field(default=None, repr=False)

    def open(self) -> Camera:
        """Open the device.

        Raises:
            InputError: OpenCV is not installed or the device does not open.
        """
        cv2 = _library("cv2", _OPENCV, "a camera input")
        self._capture = cv2.VideoCapture(self.device)
        if not self._capture.isOpened():
            raise InputError(f"camera {self.device} does not open")
        return self

    @classmethod
    def video(cls, path: Path) -> Camera:
        """Every frame of the video file at ``path``, in order.

        Raises:
            InputError: OpenCV is not installed, the file does not decode, or it has
                no frames or more than :data:`MAX_VIDEO_FRAMES`.
        """
        cv2 = _library("cv2", _OPENCV, "a video input")
        source = cls(str(path))
        source._capture = cv2.VideoCapture(str(path))
        if not source._capture.isOpened():
            raise InputError(f"video {path} does not decode")
        frames = int(source._capture.get(cv2.CAP_PROP_FRAME_COUNT))
        if not 0 < frames <= MAX_VIDEO_FRAMES:
            source._capture.release()
            raise InputError(f"video {path} has {frames} frames; 1..{MAX_VIDEO_FRAMES} are read")
        source.frames = frames
        return source

    def name(self, i: int) -> str:
        """The frame's number."""
        return f"frame {i}"

    def __len__(self) -> int:
        return self.frames

    def item(self, i: int) -> tuple[dict[str, Any], int | None]:
        """The next frame, as RGB.

        Raises:
            InputError: The camera gave no frame.
        """
        ok, frame = self._capture.read()
        if not ok:
            raise InputError(f"camera {self.device} gave no frame")
        return {"image": np.ascontiguousarray(frame[..., ::-1])}, None


@dataclass
class Microphone:
    """The default microphone through sounddevice: ``seconds`` of audio in chunks."""

    seconds: float
    chunk: int = round(DEFAULT_CHUNK_S * AUDIO_RATE)
    _device: Any = field(default=None, repr=False)

    def open(self) -> Microphone:
        """Check that the library is there.

        Raises:
            InputError: sounddevice (and PortAudio) are not installed.
        """
        self._device = _library("sounddevice", "pip install sounddevice", "a microphone input")
        return self

    def __len__(self) -> int:
        return max(1, round(self.seconds * AUDIO_RATE / self.chunk))

    def item(self, i: int) -> tuple[dict[str, Any], int | None]:
        """The next chunk recorded, as a stream chunk of :class:`AudioStream`."""
        pcm = self._device.rec(self.chunk, samplerate=AUDIO_RATE, channels=1, dtype="int16")
        self._device.wait()
        item: dict[str, Any] = {"audio": np.asarray(pcm).reshape(-1)}
        item.update({"reset": True} if i == 0 else {})
        item.update({"flush": True} if i == len(self) - 1 else {})
        return item, None


@dataclass
class SkillInputs:
    """A source per skill name, from an inputs file."""

    sources: Mapping[str, Source]

    def __len__(self) -> int:
        return 0  # never fed as one source: see source_for

    def item(self, i: int) -> tuple[dict[str, Any], int | None]:
        """Not used: each skill gets its own source.

        Raises:
            InputError: Always.
        """
        raise InputError("an inputs file feeds each skill its own source")


def source_for(source: Source | None, skill: str) -> Source | None:
    """What ``skill`` is fed from ``source``: its own entry of an inputs file, or all of it."""
    if isinstance(source, SkillInputs):
        return source.sources.get(skill)
    return source


def _live(spec: str) -> Source:
    kind, _, arg = spec.partition(":")
    try:
        if kind == "camera":
            device: int | str = int(arg) if arg.isdigit() else arg
            return Camera(device).open()
        seconds = float(arg or "10")
    except ValueError as exc:
        raise InputError(f"{spec!r}: give mic:SECONDS") from exc
    if not 0 < seconds <= 24 * 3600:
        raise InputError(f"{spec!r}: seconds must be in (0, 86400]")
    return Microphone(seconds).open()


def _read_inputs_file(path: Path) -> dict[str, str | Path]:
    try:
        if path.stat().st_size > MAX_INPUTS_BYTES:
            raise InputError(f"inputs file {path} is larger than {MAX_INPUTS_BYTES} bytes")
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise InputError(f"cannot read the inputs file {path}: {exc}") from exc
    inputs = doc.get("inputs")
    if set(doc) != {"inputs"} or not isinstance(inputs, dict) or not inputs:
        raise InputError(f"inputs file {path} must hold one [inputs] table of skill = path")
    out: dict[str, str | Path] = {}
    for skill, rel in inputs.items():
        if not _SKILL_RE.fullmatch(skill) or not isinstance(rel, str) or rel.endswith(".toml"):
            raise InputError(f"inputs file {path}: {skill!r} = {rel!r} is not skill = path")
        out[skill] = rel if ":" in rel and not Path(rel).exists() else path.parent / rel
    return out


#: The single-file sources by suffix (images, folders and inputs files aside).
_FILE_READERS: dict[str, Callable[[Path], Source]] = {
    ".wav": lambda path: AudioStream(read_wav(path)),
    ".txt": lambda path: TextLines(tuple(read_lines(path))),
    ".npz": ReplaySource.load,
    **dict.fromkeys(VIDEO_SUFFIXES, Camera.video),
}


def load_input(spec: str | Path) -> Source:
    """The source ``spec`` names (see the module's list).

    Args:
        spec: A path (image, folder, ``.wav``, video, ``.txt``, ``.npz``, inputs
            ``.toml``), ``camera:N`` (or ``camera:URL``) or ``mic:SECONDS``.

    Raises:
        InputError: It does not exist, is of no known kind, or cannot be read.
        AgentError: An ``.npz`` replay file cannot be read.
    """
    text = str(spec)
    if isinstance(spec, str) and re.fullmatch(r"(camera|mic):.*", spec):
        return _live(spec)
    path = Path(text)
    if not path.exists():
        raise InputError(f"input {path} does not exist")
    suffix = path.suffix.lower()
    if path.is_dir() or suffix in IMAGE_SUFFIXES:
        return ImageFiles.from_path(path)
    if (reader := _FILE_READERS.get(suffix)) is not None:
        return reader(path)
    if suffix == ".toml":
        entries = _read_inputs_file(path)
        return SkillInputs({skill: load_input(entry) for skill, entry in entries.items()})
    raise InputError(
        f"input {path}: not an image, a folder of images, .wav, a video, .txt, .npz or an "
        "inputs .toml"
    )


def check_input(spec: str | Path) -> None:
    """Check that ``spec`` names a readable source, reading it as the agent will.

    Raises:
        InputError: As :func:`load_input`.
        AgentError: As :func:`load_input`.
    """
    source = load_input(spec)
    for sub in source.sources.values() if isinstance(source, SkillInputs) else (source,):
        if isinstance(sub, ImageFiles):
            sub.item(0)  # decodes: a corrupt first image fails here, not in the field


def names(source: Source) -> Sequence[str]:
    """A short name per item (file, offset or line) where the source has them."""
    name = getattr(source, "name", None)
    return [name(i) if name else str(i) for i in range(len(source))]
