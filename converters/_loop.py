"""Training and evaluation loops shared by the trainers (private)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from converters.errors import TrainingError

LossFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""``(logits, labels, input batch) -> loss``; the input lets distillation query a teacher."""


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor, _x: torch.Tensor) -> torch.Tensor:
    """Plain cross-entropy, the default loss."""
    return nn.functional.cross_entropy(logits, labels)


def predict(model: nn.Module, x: np.ndarray, batch_size: int = 512) -> np.ndarray:
    """Logits of a torch model over an array, in eval mode, without gradients."""
    model.eval()
    outs = []
    with torch.no_grad():
        for start in range(0, x.shape[0], batch_size):
            chunk = np.ascontiguousarray(x[start : start + batch_size], dtype=np.float32)
            outs.append(model(torch.from_numpy(chunk)).numpy())
    return np.concatenate(outs, axis=0) if outs else np.zeros((0, 0), np.float32)


def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    """Top-1 accuracy of a torch model."""
    if x.shape[0] == 0:
        return 0.0
    return float(np.mean(predict(model, x).argmax(axis=1) == y))


def train_epoch(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    generator: torch.Generator,
    batch_size: int = 32,
    loss_fn: LossFn = cross_entropy,
    after_step: Callable[[], None] | None = None,
) -> float:
    """One shuffled pass over ``(x, y)``; returns the mean loss.

    Args:
        model: Trained in place.
        optimizer: Steps once per batch.
        x: Inputs.
        y: Labels.
        generator: Source of the shuffle order, so runs are reproducible.
        batch_size: Examples per step.
        loss_fn: The loss.
        after_step: Called after each optimizer step (pruning re-applies its masks here).

    Raises:
        TrainingError: The loss is not finite.
    """
    model.train()
    order = torch.randperm(x.shape[0], generator=generator)
    total, batches = 0.0, 0
    for start in range(0, x.shape[0], batch_size):
        idx = order[start : start + batch_size]
        xb = x[idx]
        optimizer.zero_grad()
        loss = loss_fn(model(xb), y[idx], xb)
        loss.backward()
        optimizer.step()
        if after_step is not None:
            after_step()
        total += float(loss.item())
        batches += 1
    mean = total / max(batches, 1)
    if not np.isfinite(mean):
        raise TrainingError("training loss diverged (not finite)")
    model.eval()
    return mean
