"""What compressing the activation at a cut costs, for the split benchmark's ``compression`` list.

Each codec of :mod:`skills.tensor_codec` (fp16; int8 with a per-tensor scale) is
applied per sample at each cut, as the device sends one request at a time
(:func:`converters.split_accuracy.codec_costs`):

* **EfficientNet-Lite0** at the cuts the skill ships, over scikit-image's photos:
  there are no labels, so ``accuracy_loss_pt`` is ``100 * (1 - agreement)``, the
  share of photos whose top-1 changes against the uncompressed split;
* **the digits CNN** (trained here in seconds) at three of its cuts, over its
  held-out test split: a real top-1 accuracy loss in points.

``bytes_ratio`` is the encoded payload (its header included) over the cut's float32 bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from converters.split import enumerate_cuts
from converters.split_accuracy import CodecCost, Roundtrip, codec_costs
from skills import tensor_codec

CODECS = ("fp16", "int8")


def roundtrip(codec: str) -> Roundtrip:
    """Encode then decode one sample's tensors with ``codec``; the decoded arrays and the size."""

    def run(tensors: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], int]:
        data = tensor_codec.encode(tensors, codec)
        return tensor_codec.decode(data), len(data)

    return run


def _rows(model: str, costs: Sequence[CodecCost], labelled: bool) -> list[dict[str, Any]]:
    rows = []
    for cost in costs:
        if labelled and cost.accuracy_loss_pt is not None:
            loss, basis = cost.accuracy_loss_pt, "top-1 accuracy on labels"
        else:
            loss, basis = 100.0 * (1.0 - cost.agreement), "top-1 disagreement, no labels"
        rows.append(
            {
                "model": model,
                "codec": cost.codec,
                "cut": cost.cut,
                "bytes_ratio": round(cost.bytes_ratio, 4),
                "accuracy_loss_pt": round(loss, 3),
                "agreement": round(cost.agreement, 4),
                "labelled": labelled,
                "loss_basis": basis,
            }
        )
    return rows


def efficientnet_costs(
    onnx_path: Path, cut_names: Sequence[str], images: int
) -> list[dict[str, Any]]:
    """Each codec at each of ``cut_names`` over the first ``images`` photos (6 or up to 42).

    Raises:
        ConversionError: A cut does not run, or scikit-image is missing.
    """
    from converters.efficientnet import sample_photos  # noqa: PLC0415 (pulls torch)

    model = onnx.load(str(onnx_path))
    cuts = [c for c in enumerate_cuts(model).cuts if c.name in set(cut_names)]
    x, _ = sample_photos(augment=images > 6)
    codecs = {name: roundtrip(name) for name in CODECS}
    return _rows("efficientnet-lite0", codec_costs(model, x[:images], cuts, codecs), False)


def digits_costs(work: Path) -> list[dict[str, Any]]:
    """Each codec at three cuts of a freshly trained digits CNN, over its test split.

    Raises:
        ConversionError: The export or a cut failed.
        TrainingError: Training diverged.
    """
    import torch  # noqa: PLC0415

    from converters.digits import load_digits_data, train_digits  # noqa: PLC0415
    from converters.onnx_export import export_onnx  # noqa: PLC0415

    torch.set_num_threads(1)  # two threads on two shared cores run several times slower
    data = load_digits_data()
    net, _ = train_digits(data)
    path = export_onnx(net, data.test.x[:4], work / "digits.onnx")
    model = onnx.load(str(path))
    every = enumerate_cuts(model).cuts
    picked = [every[round(i * (len(every) - 1) / 2)] for i in range(3)]
    codecs = {name: roundtrip(name) for name in CODECS}
    costs = codec_costs(model, data.test.x, picked, codecs, labels=data.test.y)
    return _rows("digits-cnn", costs, True)
