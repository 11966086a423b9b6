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
    "digits_arrays",
    "evaluate_accuracy",
    "load_digits_data",
    "split_dataset",
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


def split_dataset(
    x: np.ndarray, y: np.ndarray, *, seed: int = 0, val: float = 0.1, test: float = 0.2
) -> DigitsData:
    """Split arrays into stratified train / val / test parts.

    Args:
        x: Images ``[N, C, H, W]`` float32.
        y: Labels ``[N]`` int64.
        seed: Seed of the split.
        val: Fraction for validation.
        test: Fraction for the held-out test split.

    Raises:
        DatasetError: The fractions are invalid or a class has too few images to stratify.
    """
    from sklearn.model_selection import train_test_split  # noqa: PLC0415  (slow import)

    if not (0 < val < 1 and 0 < test < 1 and val + test < 1):
        raise DatasetError(f"bad split fractions val={val} test={test}")
    rest = round(val + test, 6)
    try:
        x_train, x_rest, y_train, y_rest = train_test_split(
            x, y, test_size=rest, stratify=y, random_state=seed
        )
        x_val, x_test, y_val, y_test = train_test_split(
            x_rest,
            y_rest,
            test_size=round(len(y_rest) * test / rest),
            stratify=y_rest,
            random_state=seed,
        )
    except ValueError as exc:
        raise DatasetError(f"cannot split the data set: {exc}") from exc
    return DigitsData(
        train=Split(np.ascontiguousarray(x_train), y_train),
        val=Split(np.ascontiguousarray(x_val), y_val),
        test=Split(np.ascontiguousarray(x_test), y_test),
    )


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """All 1797 digits in scikit-learn's order: ``x`` ``[N, 1, 8, 8]`` float32, ``y`` int64.

    Raises:
        DatasetError: scikit-learn's data could not be loaded.
    """
    from sklearn.datasets import load_digits  # noqa: PLC0415  (slow import, only when used)

    try:
        bunch = load_digits()
    except (OSError, ValueError) as exc:
        raise DatasetError(f"cannot load scikit-learn digits: {exc}") from exc
    x = (np.asarray(bunch.images, dtype=np.float32) / _PIXEL_MAX)[:, None, :, :]
    return np.ascontiguousarray(x), np.asarray(bunch.target, dtype=np.int64)


def load_digits_data(seed: int = 0) -> DigitsData:
    """Load scikit-learn's digits and split them 70/10/20, stratified by class.

    Args:
        seed: Seed of the split, so the same seed gives the same splits.

    Returns:
        The three splits; ``x`` is ``[N, 1, 8, 8]`` float32 pixel/16, ``y`` int64.

    Raises:
        DatasetError: scikit-learn's data could not be loaded.
    """
    x, y = digits_arrays()
    return split_dataset(x, y, seed=seed)


class DigitsCNN(nn.Module):
    """Two conv layers and two fully connected layers over 8x8 digits upsampled to 16x16."""

    def __init__(
        self,
        conv1: int = 16,
        conv2: int = 32,
        hidden: int = 64,
        *,
        in_channels: int = 1,
        num_classes: int = NUM_CLASSES,
    ) -> None:
        """Build the network.

        Args:
            conv1: Channels of the first convolution.
            conv2: Channels of the second convolution.
            hidden: Width of the hidden fully connected layer.
            in_channels: Channels of the 8x8 input images.
            num_classes: Number of logits.
        """
        super().__init__()
        self.widths = (conv1, conv2, hidden)
        self.in_channels = in_channels
        self.num_classes = num_classes
        self.upsample = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        self.conv1 = nn.Conv2d(in_channels, conv1, 3, padding=1)
        self.conv2 = nn.Conv2d(conv1, conv2, 3, padding=1)
        self.fc1 = nn.Linear(conv2 * 4 * 4, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)
        self.pool = nn.MaxPool2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return logits ``[N, num_classes]`` for images ``[N, C, 8, 8]`` in ``[0, 1]``."""
        x = self.pool(torch.relu(self.conv1(self.upsample(x))))
        x = self.pool(torch.relu(self.conv2(x)))
        return self.fc2(torch.relu(self.fc1(torch.flatten(x, 1))))


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
