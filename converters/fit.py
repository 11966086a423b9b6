"""A resumable training loop: AdamW + one-cycle schedule, an atomic checkpoint every epoch.

Everything that shapes the run (weights, optimizer, schedule, shuffle and dropout
random state, metrics so far) is in the checkpoint, so a run killed after epoch k
and resumed ends where an uninterrupted run would have.
"""

from __future__ import annotations

import io
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from converters._files import atomic_write_bytes
from converters._loop import LossFn, accuracy, cross_entropy, train_epoch
from converters.digits import DigitsData
from converters.errors import TrainingError

__all__ = ["EpochMetrics", "TrainConfig", "fit", "load_checkpoint_metrics"]

MAX_EPOCHS = 1000
MAX_BATCH = 4096
_CKPT_FORMAT = "edgeskill-checkpoint/1"


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of one training run.

    Attributes:
        epochs: Passes over the training split (1 to 1000).
        lr: Peak learning rate.
        batch_size: Examples per step (1 to 4096).
        weight_decay: AdamW weight decay.
        seed: Seed of initialisation, shuffling and dropout.
        schedule: ``"onecycle"`` or ``"constant"``.
    """

    epochs: int = 10
    lr: float = 0.01
    batch_size: int = 64
    weight_decay: float = 1e-4
    seed: int = 0
    schedule: str = "onecycle"

    def __post_init__(self) -> None:
        if not 1 <= self.epochs <= MAX_EPOCHS:
            raise TrainingError(f"epochs must be in 1..{MAX_EPOCHS}, got {self.epochs}")
        if not 1 <= self.batch_size <= MAX_BATCH:
            raise TrainingError(f"batch_size must be in 1..{MAX_BATCH}, got {self.batch_size}")
        if not (self.lr > 0 and math.isfinite(self.lr)) or not self.weight_decay >= 0:
            raise TrainingError(f"bad lr {self.lr} or weight_decay {self.weight_decay}")
        if self.schedule not in {"onecycle", "constant"}:
            raise TrainingError(f"schedule must be 'onecycle' or 'constant', not {self.schedule!r}")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TrainConfig:
        """Parse :meth:`to_dict`'s output.

        Raises:
            TrainingError: Unknown keys or invalid values.
        """
        unknown = set(raw) - set(cls.__dataclass_fields__)
        if unknown:
            raise TrainingError(f"unknown training options: {', '.join(sorted(unknown))}")
        try:
            return cls(**raw)
        except TypeError as exc:
            raise TrainingError(f"bad training options: {exc}") from exc


@dataclass(frozen=True)
class EpochMetrics:
    """What one epoch produced."""

    epoch: int
    train_loss: float
    val_accuracy: float
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able form."""
        return asdict(self)


def _make_optimizer(
    model: nn.Module, config: TrainConfig, steps_per_epoch: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler | None]:
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.lr, weight_decay=config.weight_decay
    )
    if config.schedule == "constant":
        return optimizer, None
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=config.lr, total_steps=config.epochs * steps_per_epoch
    )
    return optimizer, scheduler


def _state(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    generator: torch.Generator,
    history: list[EpochMetrics],
    config: TrainConfig,
) -> dict[str, Any]:
    return {
        "format": _CKPT_FORMAT,
        "config": config.to_dict(),
        "epoch": len(history),
        "history": [m.to_dict() for m in history],
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "generator": generator.get_state(),
        "torch_rng": torch.get_rng_state(),
    }


def _read_checkpoint(path: Path) -> dict[str, Any]:
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch.load raises pickle, zip and runtime errors alike
        raise TrainingError(f"checkpoint {path.name} is unreadable: {exc}") from exc
    if not isinstance(blob, dict) or blob.get("format") != _CKPT_FORMAT:
        raise TrainingError(f"{path.name} is not a training checkpoint")
    return blob


def load_checkpoint_metrics(path: Path) -> list[EpochMetrics]:
    """Metrics of the epochs a checkpoint covers.

    Raises:
        TrainingError: The checkpoint is unreadable.
    """
    return [EpochMetrics(**m) for m in _read_checkpoint(path)["history"]]


def fit(
    model: nn.Module,
    data: DigitsData,
    config: TrainConfig,
    *,
    loss_fn: LossFn = cross_entropy,
    on_epoch: Callable[[EpochMetrics], None] | None = None,
    after_step: Callable[[], None] | None = None,
    checkpoint: Path | None = None,
) -> list[EpochMetrics]:
    """Train ``model`` in place, resuming from ``checkpoint`` when it exists.

    Args:
        model: The model; its initial weights are replaced by the checkpoint's on resume.
        data: Train split for steps, val split for the per-epoch accuracy.
        config: Hyper-parameters; must equal the checkpoint's on resume.
        loss_fn: ``(logits, labels, inputs) -> loss``.
        on_epoch: Called after each epoch's checkpoint is written.
        after_step: Called after every optimizer step.
        checkpoint: File rewritten atomically after every epoch; ``None`` for none.

    Returns:
        Metrics of every epoch, including those done before a resume.

    Raises:
        TrainingError: The loss diverged, or the checkpoint is unreadable or was
            written for a different configuration or model.
    """
    torch.manual_seed(config.seed)
    steps = math.ceil(len(data.train) / config.batch_size)
    optimizer, scheduler = _make_optimizer(model, config, steps)
    generator = torch.Generator().manual_seed(config.seed)
    history: list[EpochMetrics] = []
    if checkpoint is not None and checkpoint.exists():
        history = _resume(checkpoint, config, model, optimizer, scheduler, generator)
    x, y = torch.from_numpy(data.train.x), torch.from_numpy(data.train.y)
    step_hook = _chain(scheduler.step if scheduler is not None else None, after_step)
    for epoch in range(len(history) + 1, config.epochs + 1):
        started = time.perf_counter()
        loss = train_epoch(
            model, optimizer, x, y, generator=generator, batch_size=config.batch_size,
            loss_fn=loss_fn, after_step=step_hook,
        )  # fmt: skip
        metrics = EpochMetrics(
            epoch, loss, accuracy(model, data.val.x, data.val.y), time.perf_counter() - started
        )
        history.append(metrics)
        if checkpoint is not None:
            buffer = io.BytesIO()
            torch.save(_state(model, optimizer, scheduler, generator, history, config), buffer)
            atomic_write_bytes(checkpoint, buffer.getvalue())
        if on_epoch is not None:
            on_epoch(metrics)
    model.eval()
    return history


def _chain(*hooks: Callable[[], None] | None) -> Callable[[], None] | None:
    present = [h for h in hooks if h is not None]
    if not present:
        return None

    def run() -> None:
        for hook in present:
            hook()

    return run


def _resume(
    path: Path,
    config: TrainConfig,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    generator: torch.Generator,
) -> list[EpochMetrics]:
    blob = _read_checkpoint(path)
    if blob["config"] != config.to_dict():
        raise TrainingError(f"checkpoint {path.name} was written with different options")
    try:
        model.load_state_dict(blob["model"])
        optimizer.load_state_dict(blob["optimizer"])
        if scheduler is not None:
            scheduler.load_state_dict(blob["scheduler"])
        generator.set_state(blob["generator"])
        torch.set_rng_state(blob["torch_rng"])
    except (RuntimeError, KeyError, ValueError, TypeError) as exc:
        raise TrainingError(f"checkpoint {path.name} does not fit this model: {exc}") from exc
    return [EpochMetrics(**m) for m in blob["history"]]
