"""A MobileNet-style classifier: a stem convolution and depthwise-separable blocks.

Big enough (about half a million parameters at width 1.0) that compression
numbers mean something, small enough to train on the digits in under a minute
on two cores. Like :class:`~converters.digits.DigitsCNN` it upsamples inside the
model, so the exported graph takes the data set's own image size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

__all__ = [
    "DEFAULT_BLOCKS",
    "ConvBN",
    "MobileNet",
    "MobileNetConfig",
    "SeparableBlock",
    "block_channels",
    "count_parameters",
]

DEFAULT_BLOCKS: tuple[tuple[int, int], ...] = (
    (64, 2),
    (128, 1),
    (128, 2),
    (256, 1),
    (256, 2),
    (512, 1),
    (512, 1),
)
"""``(output channels, stride)`` of each depthwise-separable block at width 1.0."""


@dataclass(frozen=True)
class MobileNetConfig:
    """Shape of a :class:`MobileNet`; channel counts are stored explicitly so that
    structured pruning can describe the smaller network it produces.

    Attributes:
        stem: Output channels of the stem convolution.
        blocks: ``(output channels, stride)`` per separable block.
        in_channels: Channels of the input images.
        num_classes: Number of logits.
        resize_to: Side the input is upsampled to inside the model.
    """

    stem: int = 32
    blocks: tuple[tuple[int, int], ...] = DEFAULT_BLOCKS
    in_channels: int = 1
    num_classes: int = 10
    resize_to: int = 32

    @classmethod
    def scaled(cls, width: float, **kwargs: int) -> MobileNetConfig:
        """The default layout with every channel count multiplied by ``width`` (at least 4)."""
        stem = max(4, round(32 * width))
        blocks = tuple((max(4, round(c * width)), s) for c, s in DEFAULT_BLOCKS)
        return cls(stem=stem, blocks=blocks, **kwargs)  # type: ignore[arg-type]


class ConvBN(nn.Module):
    """Convolution (no bias), batch norm, ReLU."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, groups: int = 1) -> None:
        """Build the layer; ``groups == cin`` makes it depthwise."""
        super().__init__()
        self.conv = nn.Conv2d(
            cin, cout, kernel, stride=stride, padding=kernel // 2, groups=groups, bias=False
        )
        self.bn = nn.BatchNorm2d(cout)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the layer."""
        return self.act(self.bn(self.conv(x)))


class SeparableBlock(nn.Module):
    """A 3x3 depthwise convolution then a 1x1 pointwise one, each with batch norm and ReLU."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        """Build the block.

        Args:
            cin: Input channels (also the depthwise channels).
            cout: Output channels of the pointwise convolution.
            stride: Stride of the depthwise convolution.
        """
        super().__init__()
        self.depthwise = ConvBN(cin, cin, 3, stride, groups=cin)
        self.pointwise = ConvBN(cin, cout, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the block."""
        return self.pointwise(self.depthwise(x))


class MobileNet(nn.Module):
    """MobileNet-v1-style classifier over small images."""

    def __init__(self, config: MobileNetConfig | None = None) -> None:
        """Build the network.

        Args:
            config: Layout; the default is width 1.0 for 1-channel 10-class input.
        """
        super().__init__()
        self.config = config or MobileNetConfig()
        cfg = self.config
        self.resize = nn.Upsample(size=(cfg.resize_to, cfg.resize_to), mode="bilinear")
        self.stem = ConvBN(cfg.in_channels, cfg.stem, 3, 1)
        blocks: list[SeparableBlock] = []
        cin = cfg.stem
        for cout, stride in cfg.blocks:
            blocks.append(SeparableBlock(cin, cout, stride))
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.separable: tuple[SeparableBlock, ...] = tuple(blocks)  # typed view of ``blocks``
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(0.1)
        self.head = nn.Linear(cin, cfg.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return logits ``[N, num_classes]`` for images ``[N, C, H, W]`` in ``[0, 1]``."""
        features = self.pool(self.blocks(self.stem(self.resize(x))))
        return self.head(self.dropout(torch.flatten(features, 1)))


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def block_channels(config: MobileNetConfig) -> Sequence[int]:
    """Output channels of the stem followed by those of each block."""
    return [config.stem, *(c for c, _ in config.blocks)]
