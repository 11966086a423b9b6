"""``edgeskill agent try``: a skill's control code on an input, through the skill runtime."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import skimage
import skimage.io
import typer
from typer.testing import CliRunner

from cloud.models.library import LIBRARY, materialise_skill
from edgeskill.cli_try import agent_try, result_summary
from skills.bundle import build_bundle

DATA = Path(skimage.__file__).parent / "data"

# The command as cli.py registers it (agent_app.command("try")), on an app of its own.
app = typer.Typer()
agent = typer.Typer()
agent.command("try")(agent_try)
app.add_typer(agent, name="agent")
runner = CliRunner()


@pytest.fixture(scope="module")
def face_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("try")
    materialise_skill(LIBRARY / "face-detect", work / "src")
    return build_bundle(work / "src", work / "dist")


def test_a_bundle_runs_on_a_folder_of_photos(face_bundle: Path, tmp_path: Path) -> None:
    for name in ("astronaut.png", "coffee.png"):
        shutil.copyfile(DATA / name, tmp_path / name)
    args = ["agent", "try", str(face_bundle), str(tmp_path), "--board", "arm64-cpu"]
    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "face-detect 1.0.0" in result.output and "detector: tflite/fp32" in result.output
    rows = {line.split("│")[1].strip(): line for line in result.output.splitlines() if "│" in line}
    assert '"label": "face"' in rows["astronaut.png"]
    assert '"label": "none"' in rows["coffee.png"]


@pytest.mark.parametrize(
    ("board", "variant"), [("x86-cpu", "onnx-cpu/fp32"), ("arm64-cpu", "tflite/fp32")]
)
def test_each_board_runs_its_variant_and_finds_the_same_face(
    face_bundle: Path, board: str, variant: str
) -> None:
    photo = str(DATA / "astronaut.png")
    args = ["agent", "try", str(face_bundle), photo, "--board", board]
    shown = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert f"detector: {variant}" in shown.output, shown.output
    (line,) = runner.invoke(app, [*args, "--json"]).output.splitlines()
    faces = json.loads(line)["faces"]
    assert len(faces) == 1 and faces[0]["score"] > 0.85


def test_a_video_file_is_tried_frame_by_frame(face_bundle: Path, tmp_path: Path) -> None:
    import cv2  # noqa: PLC0415 - the video extra

    clip = tmp_path / "clip.avi"
    writer = cv2.VideoWriter(str(clip), cv2.VideoWriter_fourcc(*"MJPG"), 5.0, (512, 512))
    for photo in ("astronaut.png", "coffee.png", "astronaut.png"):
        bgr = skimage.io.imread(DATA / photo)[..., ::-1]  # OpenCV writes BGR
        writer.write(cv2.resize(np.ascontiguousarray(bgr), (512, 512)))
    writer.release()
    result = runner.invoke(app, ["agent", "try", str(face_bundle), str(clip), "--json"])
    assert result.exit_code == 0, result.output
    labels = [json.loads(line)["label"] for line in result.output.splitlines()]
    assert labels == ["face", "none", "face"]


def test_json_lines_and_config(face_bundle: Path) -> None:
    photo = str(DATA / "chelsea.png")
    result = runner.invoke(app, ["agent", "try", str(face_bundle), photo, "--json"])
    (line,) = result.output.splitlines()
    assert json.loads(line)["label"] == "face"  # the cat's weak detection, above 0.5
    strict = runner.invoke(
        app, ["agent", "try", str(face_bundle), photo, "--json", "--config", "min_score=0.75"]
    )
    assert json.loads(strict.output)["label"] == "none"


def test_a_library_source_folder_runs_with_its_models_built(tmp_path: Path) -> None:
    (tmp_path / "lines.txt").write_text("okay\nA man plays a guitar.\n")
    result = runner.invoke(
        app, ["agent", "try", str(LIBRARY / "text-embed"), str(tmp_path / "lines.txt"), "--json"]
    )
    assert result.exit_code == 0, result.output
    assert [len(json.loads(line)["embedding"]) for line in result.output.splitlines()] == [384] * 2


def test_a_failing_item_is_shown_and_the_exit_code_says_so(face_bundle: Path) -> None:
    result = runner.invoke(
        app, ["agent", "try", str(face_bundle), str(DATA / "page.png"), "--config", "min_score=2"]
    )
    assert result.exit_code == 2 and "min_score" in result.output  # setup refused it


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.png"], "does not exist"),
        (["camera:9"], "camera 9 does not open"),  # no camera on this machine
        (["x.png", "--config", "novalue"], "KEY=VALUE"),
    ],
)
def test_bad_inputs_exit_2_with_one_line(face_bundle: Path, args: list[str], message: str) -> None:
    result = runner.invoke(app, ["agent", "try", str(face_bundle), *args])
    assert result.exit_code == 2 and message in result.output


def test_results_are_summarised_to_one_cell() -> None:
    text = result_summary({"embedding": [0.1] * 384, "label": "x", "confidence": 0.91234})
    assert text == '{"label": "x", "confidence": 0.912, "embedding": "[384 numbers]"}'
