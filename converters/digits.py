"""The scikit-learn digits data set and a small CNN trained on it.

The digits are 8x8 grey images with 17 levels; they ship inside scikit-learn's
wheel, so nothing is downloaded. The CNN upsamples inside the model so that the
exported ONNX graph takes the raw 8x8 input a device would send.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from converters._loop import accuracy, train_epoch
from converters.errors import DatasetError, TrainingError

__all__ = [
    "DigitsCNN",
    "DigitsData",
    "Split",
    "evaluate_accuracy",
    "load_digits_data",
    "train_digits",
]

NUM_CLASSES = 10
_PIXEL_MAX = 16.0


@dataclass(frozen=True)
class Split:
    """One part of a data set.

    Attributes:
        x: float32 images ``[N, C, H, W]`` scaled to ``[0, 1]``.
        y: int64 class labels ``[N]``.
    """

    x: np.ndarray
    y: np.ndarray

    def __post_init__(self) -> None:
        if self.x.ndim != 4 or self.x.dtype != np.float32:
            raise DatasetError(f"x must be float32 [N,C,H,W], got {self.x.dtype} {self.x.shape}")
        if self.y.shape != (self.x.shape[0],) or self.y.dtype != np.int64:
            raise DatasetError(
                f"y must be int64 [{self.x.shape[0]}], got {self.y.dtype} {self.y.shape}"
            )

    def __len__(self) -> int:
        return int(self.x.shape[0])


@dataclass(frozen=True)
class DigitsData:
    """Stratified train / validation / test splits (70 / 10 / 20 %)."""

    train: Split
    val: Split
    test: Split


def load_digits_data(seed: int = 0) -> DigitsData:
    """Load scikit-learn's digits and split them 70/10/20, stratified by class.

    Args:
        seed: Seed of the split, so the same seed gives the same splits.

    Returns:
        The three splits; ``x`` is ``[N, 1, 8, 8]`` float32 pixel/16, ``y`` int64.

    Raises:
        DatasetError: scikit-learn's data could not be loaded.
    """
    from sklearn.datasets import load_digits  # noqa: PLC0415  (slow import, only when used)
    from sklearn.model_selection import train_test_split  # noqa: PLC0415

    try:
        bunch = load_digits()
    except (OSError, ValueError) as exc:
        raise DatasetError(f"cannot load scikit-learn digits: {exc}") from exc
    x = (np.asarray(bunch.images, dtype=np.float32) / _PIXEL_MAX)[:, None, :, :]
    y = np.asarray(bunch.target, dtype=np.int64)
    x_train, x_rest, y_train, y_rest = train_test_split(
        x, y, test_size=0.3, stratify=y, random_state=seed
    )
    # 10 % of the whole is a third of the remaining 30 %.
    x_val, x_test, y_val, y_test = train_test_split(
        x_rest, y_rest, test_size=2 / 3, stratify=y_rest, random_state=seed
    )
    return DigitsData(
        train=Split(np.ascontiguousarray(x_train), y_train),
        val=Split(np.ascontiguousarray(x_val), y_val),
        test=Split(np.ascontiguousarray(x_test), y_test),
    )


class DigitsCNN(nn.Module):
    """Two conv layers and two fully connected layers over 8x8 digits upsampled to 16x16."""

    def __init__(self, conv1: int = 16, conv2: int = 32, hidden: int = 64) -> None:
        """Build the network.

        Args:
            conv1: Channels of the first convolution.
            conv2: Channels of the second convolution.
            hidden: Width of the hidden fully connected layer.
        """
        super().__init__()
        self.upsample = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        self.features = nn.Sequential(
            nn.Conv2d(1, conv1, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(conv1, conv2, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(conv2 * 4 * 4, hidden),
            nn.ReLU(),
            nn.Linear(hidden, NUM_CLASSES),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return logits ``[N, 10]`` for images ``[N, 1, 8, 8]`` in ``[0, 1]``."""
        return self.classifier(self.features(self.upsample(x)))


def evaluate_accuracy(model: nn.Module, split: Split) -> float:
    """Top-1 accuracy of a torch model on a split (the model is put in eval mode)."""
    return accuracy(model, split.x, split.y)


def train_digits(
    data: DigitsData,
    *,
    epochs: int = 8,
    seed: int = 0,
    on_epoch: Callable[[int, float, float], None] | None = None,
) -> tuple[DigitsCNN, float]:
    """Train a :class:`DigitsCNN` and measure it on the test split.

    Args:
        data: The splits from :func:`load_digits_data`.
        epochs: Passes over the training split.
        seed: Seed of weight initialisation and shuffling.
        on_epoch: Called after each epoch with ``(epoch, mean train loss, val accuracy)``,
            epochs counted from 1.

    Returns:
        The trained model (in eval mode) and its test accuracy.

    Raises:
        TrainingError: ``epochs`` is not positive or the loss diverged.
    """
    if epochs < 1:
        raise TrainingError(f"epochs must be >= 1, got {epochs}")
    torch.manual_seed(seed)
    model = DigitsCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(seed)
    x_train = torch.from_numpy(data.train.x)
    y_train = torch.from_numpy(data.train.y)
    for epoch in range(1, epochs + 1):
        loss = train_epoch(model, optimizer, x_train, y_train, generator=generator)
        if on_epoch is not None:
            on_epoch(epoch, loss, evaluate_accuracy(model, data.val))
    model.eval()
    return model, evaluate_accuracy(model, data.test)
