"""``edgeskill model``: train on a folder data set in a job process, compress, convert, list
and show the lineage; bad input ends with a clear error and exit code 2.

The app is tested on its own; ``edgeskill.cli`` mounts it as ``edgeskill model``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from cloud.hub import Hub
from edgeskill.cli_model import app

runner = CliRunner()
COMMANDS = ["train", "compress", "convert", "import", "link", "ls", "jobs", "show"]


@pytest.mark.parametrize(
    "command", [[], *([c] for c in COMMANDS)], ids=lambda c: " ".join(c) or "model"
)
def test_every_command_explains_itself(command: list[str]) -> None:
    result = runner.invoke(app, [*command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output and len(result.output.splitlines()) > 4


def shapes_folder(root: Path) -> Path:
    """Two classes a tiny network can tell apart: bright top half or bright bottom half."""
    rng = np.random.default_rng(0)
    for label, rows in (("top", slice(0, 8)), ("bottom", slice(8, 16))):
        (root / label).mkdir(parents=True)
        for i in range(20):
            pixels = rng.integers(0, 60, (16, 16), dtype=np.uint8)
            pixels[rows] += 150
            Image.fromarray(pixels).save(root / label / f"{i}.png")
    return root


def invoke(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_train_compress_convert_and_show_on_a_folder_data_set(tmp_path: Path) -> None:
    home = str(tmp_path / "hub")
    Hub.init(tmp_path / "hub").close()
    folder = shapes_folder(tmp_path / "shapes")
    out = invoke(
        "train", "--dataset-dir", str(folder), "--arch", "mobilenet", "--width", "0.25",
        "--image-size", "16", "--epochs", "2", "--name", "shapes-net",
        "--out", str(tmp_path / "shapes.onnx"), "--home", home,
    )  # fmt: skip
    assert "data set shapes v1: 40 images, 2 classes" in out
    assert "job 1 succeeded" in out and "shapes-net" in out
    assert (tmp_path / "shapes.onnx").stat().st_size > 10_000

    out = invoke("compress", "shapes-net", "--variants", "int8", "--no-tflite", "--home", home)
    assert "float" in out and "int8" in out and "size ratio" in out
    out = invoke("convert", "shapes-net", "--target", "openvino", "--out",
                 str(tmp_path / "ov"), "--home", home)  # fmt: skip
    assert "checked with openvino" in out
    assert sorted(p.suffix for p in (tmp_path / "ov").iterdir()) == [".bin", ".xml"]

    listed = invoke("ls", "--home", home)
    assert "shapes-net" in listed and "mobilenet" in listed and "openvino" in listed
    shown = invoke("show", "1", "--home", home)
    for expected in ("data set shapes v1", "job #1 succeeded", "training", "variants",
                     "artefacts", "onnxruntime ms", "openvino"):  # fmt: skip
        assert expected in shown, expected
    assert "succeeded" in invoke("jobs", "--home", home)

    again = runner.invoke(app, ["train", "--resume", "1", "--home", home])
    assert again.exit_code == 2 and "already succeeded" in again.output


def test_bad_input_ends_with_a_clear_error(tmp_path: Path) -> None:
    missing = runner.invoke(app, ["ls", "--home", str(tmp_path / "nowhere")])
    assert missing.exit_code == 2 and "hub init" in missing.output
    home = str(tmp_path / "hub")
    Hub.init(tmp_path / "hub").close()
    for args, message in (
        (["show", "42"], "no model"),
        (["train", "--arch", "resnet", "--epochs", "1"], "arch must be one of"),
        (["train", "--dataset", "cifar"], "unknown built-in data set"),
        (["train", "--dataset-dir", str(tmp_path / "absent")], "not a folder"),
        (["convert", "1", "--target", "om"], "no model"),
        (["link", "digits", "1.0.0"], "no skill version"),
    ):
        result = runner.invoke(app, [*args, "--home", home])
        assert result.exit_code == 2, result.output
        assert message in result.output, result.output
    (tmp_path / "model.bin").write_bytes(b"\0" * 64)
    result = runner.invoke(app, ["import", str(tmp_path / "model.bin"), "--name", "x",
                                 "--home", home])  # fmt: skip
    assert result.exit_code == 2 and "unsupported model format" in result.output
    assert "shapes" not in invoke("ls", "--home", home)
