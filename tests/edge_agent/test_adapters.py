"""Input adapters: files, folders and inputs files become the items skills take."""

from __future__ import annotations

import shutil
import sys
import wave
from pathlib import Path

import numpy as np
import pytest
import skimage

from edge_agent.adapters import (
    AudioStream,
    Camera,
    ImageFiles,
    SkillInputs,
    TextLines,
    check_input,
    load_input,
    names,
    source_for,
)
from edge_agent.errors import InputError
from edge_agent.startup_checks import SettingsError, check_source
from edge_agent.workload import ReplaySource

DATA = Path(skimage.__file__).parent / "data"


def test_a_folder_gives_its_images_in_name_order(tmp_path: Path) -> None:
    for name in ("page.png", "camera.png", "astronaut.png"):
        shutil.copyfile(DATA / name, tmp_path / name)
    (tmp_path / "notes.txt").write_text("not an image")
    source = load_input(tmp_path)
    assert isinstance(source, ImageFiles)
    assert names(source) == ["astronaut.png", "camera.png", "page.png"]
    item, label = source.item(2)
    assert label is None and item["image"].shape == (191, 384)


def test_a_wav_file_is_one_stream_from_reset_to_flush(tmp_path: Path) -> None:
    with wave.open(str(tmp_path / "s.wav"), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes(np.arange(20000, dtype="<i2").tobytes())
    source = load_input(tmp_path / "s.wav")
    assert isinstance(source, AudioStream) and len(source) == 3
    items = [source.item(i)[0] for i in range(3)]
    assert [len(i["audio"]) for i in items] == [8000, 8000, 4000]
    assert [i.get("reset", False) for i in items] == [True, False, False]
    assert [i.get("flush", False) for i in items] == [False, False, True]
    assert np.concatenate([i["audio"] for i in items]).tolist() == list(range(20000))


def test_text_lines_and_replay_files(tmp_path: Path) -> None:
    (tmp_path / "l.txt").write_text("first\nsecond\n")
    source = load_input(tmp_path / "l.txt")
    assert isinstance(source, TextLines) and source.item(1) == ({"text": "second"}, None)
    np.savez(tmp_path / "r.npz", x=np.zeros((2, 8, 8)), y=np.array([3, 4]))
    replay = load_input(tmp_path / "r.npz")
    assert isinstance(replay, ReplaySource) and replay.item(1)[1] == 4


def test_an_inputs_file_feeds_each_skill_its_own(tmp_path: Path) -> None:
    shutil.copyfile(DATA / "camera.png", tmp_path / "camera.png")
    (tmp_path / "l.txt").write_text("hello\n")
    (tmp_path / "in.toml").write_text(
        '[inputs]\nface-detect = "camera.png"\ntext-embed = "l.txt"\n'
    )
    source = load_input(tmp_path / "in.toml")
    assert isinstance(source, SkillInputs)
    assert isinstance(source_for(source, "face-detect"), ImageFiles)
    assert isinstance(source_for(source, "text-embed"), TextLines)
    assert source_for(source, "ocr") is None  # a skill it does not name is not fed
    plain = load_input(tmp_path / "l.txt")
    assert source_for(plain, "anything") is plain  # one source feeds every skill


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[inputs]\n", "one \\[inputs\\] table"),
        ('[other]\nx = "a"\n', "one \\[inputs\\] table"),
        ('[inputs]\nBad_Name = "l.txt"\n', "not skill = path"),
        ('[inputs]\nocr = "nested.toml"\n', "not skill = path"),
        ('[inputs]\nocr = "missing.png"\n', "does not exist"),
        ("[inputs", "cannot read"),
    ],
)
def test_bad_inputs_files_are_refused(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "l.txt").write_text("x\n")
    (tmp_path / "in.toml").write_text(text)
    with pytest.raises(InputError, match=message):
        load_input(tmp_path / "in.toml")


def test_unknown_kinds_and_empty_folders_are_refused(tmp_path: Path) -> None:
    (tmp_path / "x.bin").write_bytes(b"\0")
    with pytest.raises(InputError, match="not an image"):
        load_input(tmp_path / "x.bin")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="0 image files"):
        load_input(tmp_path / "empty")


def test_camera_video_and_microphone_need_their_libraries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in ("cv2", "sounddevice"):  # as on a device without them: import fails
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(InputError, match=r"needs cv2.*edgeskill\[video\]"):
        load_input("camera:0")
    (tmp_path / "clip.mp4").write_bytes(b"\0")
    with pytest.raises(InputError, match=r"a video input needs cv2"):
        load_input(tmp_path / "clip.mp4")
    with pytest.raises(InputError, match=r"needs sounddevice.*pip install sounddevice"):
        load_input("mic:5")
    with pytest.raises(InputError, match="give mic:SECONDS"):
        load_input("mic:soon")


def test_the_agents_start_up_check_reads_inputs_as_the_agent_will(tmp_path: Path) -> None:
    (tmp_path / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\nbroken")
    with pytest.raises(SettingsError, match=r"source .*bad\.png"):
        check_source(tmp_path / "bad.png")
    shutil.copyfile(DATA / "page.png", tmp_path / "page.png")
    check_source(tmp_path / "page.png")
    check_input(tmp_path / "page.png")


def _video(path: Path, frames: list[np.ndarray]) -> Path:
    """``frames`` (RGB) written as a Motion-JPEG AVI by OpenCV itself."""
    import cv2  # noqa: PLC0415 - the video extra

    height, width = frames[0].shape[:2]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 10.0, (width, height))
    assert writer.isOpened()
    for frame in frames:
        writer.write(np.ascontiguousarray(frame[..., ::-1]))  # OpenCV writes BGR
    writer.release()
    return path


def test_a_video_file_gives_its_frames_in_order_as_rgb(tmp_path: Path) -> None:
    astronaut = skimage.data.astronaut()[:256, :256]
    red = np.zeros_like(astronaut)
    red[..., 0] = 255
    clip = _video(tmp_path / "clip.avi", [astronaut, red, astronaut])
    source = load_input(clip)
    assert isinstance(source, Camera) and len(source) == 3
    assert names(source) == ["frame 0", "frame 1", "frame 2"]
    first, second = source.item(0)[0]["image"], source.item(1)[0]["image"]
    assert first.shape == (256, 256, 3) and first.dtype == np.uint8
    assert np.abs(first.astype(int) - astronaut).mean() < 6  # JPEG-compressed, RGB order
    assert second[..., 0].mean() > 240 and second[..., 1:].mean() < 15  # red stays red
    source.item(2)
    with pytest.raises(InputError, match="gave no frame"):
        source.item(3)


def test_a_broken_video_is_refused(tmp_path: Path) -> None:
    (tmp_path / "broken.mp4").write_bytes(b"\0\0\0\x18ftypmp42" + b"\xff" * 64)
    with pytest.raises(InputError, match=r"does not decode|has 0 frames"):
        load_input(tmp_path / "broken.mp4")
