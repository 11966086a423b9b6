"""The ``face-detect`` skill: BlazeFace on scikit-image's sample photos.

The astronaut's face is found where a person sees it (the box checked by eye:
cheek to cheek, hairline to chin), with its eyes and nose in place; photos with
no person in them give no face. The cat in ``chelsea`` is honestly reported: the
model (trained on human faces) gives it a weak detection, just above its default
threshold and far below a human face's score.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import skimage.data

from tests.skills.library.conftest import Harness

#: The astronaut's face, x0, y0, x1, y1 in pixels, read off the photo by eye.
ASTRONAUT_FACE = (183.0, 78.0, 272.0, 182.0)
#: The cameraman's face in ``camera`` (in profile: ear to nose, forehead to chin), by eye.
CAMERAMAN_FACE = (180.0, 122.0, 255.0, 200.0)


def _iou(a: tuple[float, ...] | list[float], b: tuple[float, ...] | list[float]) -> float:
    width = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    height = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = width * height
    area = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1])
    return inter / (area - inter)


@pytest.fixture(scope="module")
def face(library_skill: Callable[[str], Harness]) -> Harness:
    return library_skill("face-detect")


def test_anchors_are_mediapipes_896_in_output_order(face: Harness) -> None:
    anchors = face.module().anchors()
    assert anchors.shape == (896, 2)
    # 16x16 cells with 2 anchors each, then 8x8 cells with 6 (three layers of stride 16)
    np.testing.assert_allclose(anchors[:2], [[1 / 32, 1 / 32]] * 2)
    np.testing.assert_allclose(anchors[2], [3 / 32, 1 / 32])
    np.testing.assert_allclose(anchors[512:518], [[1 / 16, 1 / 16]] * 6)
    np.testing.assert_allclose(anchors[-1], [15 / 16, 15 / 16])


def test_the_astronauts_face_is_found_with_its_eyes_and_nose(face: Harness) -> None:
    result = face.skill().process({"image": skimage.data.astronaut()})
    assert result["label"] == "face" and len(result["faces"]) == 1
    found = result["faces"][0]
    assert _iou(found["box"], ASTRONAUT_FACE) > 0.7
    assert found["score"] > 0.85
    right_eye, left_eye, nose = (np.array(p) for p in found["keypoints"][:3])
    assert right_eye[0] < nose[0] < left_eye[0]  # the person's right eye is on the image's left
    assert abs(right_eye[1] - left_eye[1]) < 8 and nose[1] > right_eye[1]
    assert 95 < right_eye[1] < 125  # the eyes lie at about y = 102..115 in the photo


def test_the_cameramans_face_is_found_in_a_grey_photo(face: Harness) -> None:
    result = face.skill().process({"image": skimage.data.camera()})
    assert [_iou(f["box"], CAMERAMAN_FACE) > 0.6 for f in result["faces"]] == [True]


@pytest.mark.parametrize("photo", ["coffee", "rocket", "coins", "hubble_deep_field", "page"])
def test_photos_without_a_person_have_no_face(face: Harness, photo: str) -> None:
    result = face.skill().process({"image": getattr(skimage.data, photo)()})
    assert result["faces"] == [] and result["label"] == "none"
    assert 0.5 < result["confidence"] <= 1.0


def test_the_cat_gets_only_a_weak_detection(face: Harness) -> None:
    cat = skimage.data.chelsea()
    weak = face.skill().process({"image": cat})["faces"]
    assert len(weak) == 1 and 0.5 < weak[0]["score"] < 0.7
    assert face.skill({"min_score": "0.75"}).process({"image": cat})["faces"] == []


def test_results_carry_the_drift_fields(face: Harness) -> None:
    photo = skimage.data.astronaut()
    result = face.skill().process({"image": photo})
    assert result["summaries"]["brightness"] == pytest.approx(photo.mean() / 255)
    assert result["confidence"] == result["faces"][0]["score"]


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ({}, "no 'image'"),
        ({"image": np.zeros((4, 4, 3), np.float32)}, "uint8"),
        ({"image": np.zeros((9000, 2, 3), np.uint8)}, "outside"),
    ],
)
def test_bad_images_fail_the_item(face: Harness, item: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        face.skill().process(item)


def test_bad_config_fails_setup(face: Harness) -> None:
    with pytest.raises(ValueError, match="min_score"):
        face.skill({"min_score": "2"})


@pytest.mark.parametrize("photo", ["astronaut", "camera", "chelsea", "coffee"])
def test_the_onnx_variant_finds_the_same_faces_as_the_tflite_one(face: Harness, photo: str) -> None:
    """The build's ONNX variant (converted from the .tflite) is the same detector."""
    image = getattr(skimage.data, photo)()
    model = face.context(targets=("onnx-cpu",)).model("detector")
    assert (model.target, model.backend) == ("onnx-cpu", "onnxruntime")
    converted = face.skill(targets=("onnx-cpu",)).process({"image": image})
    original = face.skill(targets=("tflite",)).process({"image": image})
    assert converted["label"] == original["label"]
    assert len(converted["faces"]) == len(original["faces"])
    for got, want in zip(converted["faces"], original["faces"], strict=True):
        np.testing.assert_allclose(got["box"], want["box"], atol=0.5)
        np.testing.assert_allclose(got["keypoints"], want["keypoints"], atol=0.5)
        assert got["score"] == pytest.approx(want["score"], abs=1e-3)


def test_the_build_lists_both_variants_of_the_detector(face: Harness) -> None:
    variants = {(m.model, m.target): m.path for m in face.manifest.models}
    assert variants == {
        ("detector", "tflite"): "models/detector.tflite",
        ("detector", "onnx-cpu"): "models/detector.onnx",
    }
    assert all((face.root / path).is_file() for path in variants.values())
