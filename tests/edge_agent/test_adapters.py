"""Input adapters: files, folders and inputs files become the items skills take."""

from __future__ import annotations

import importlib.util
import shutil
import wave
from pathlib import Path

import numpy as np
import pytest
import skimage

from edge_agent.adapters import (
    AudioStream,
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


@pytest.mark.skipif(
    any(importlib.util.find_spec(m) for m in ("cv2", "sounddevice")),
    reason="asserts the message given when OpenCV and sounddevice are missing",
)
def test_camera_and_microphone_need_their_libraries() -> None:
    with pytest.raises(InputError, match=r"needs cv2.*opencv-python-headless"):
        load_input("camera:0")
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
