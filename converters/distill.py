"""Knowledge distillation: train a smaller student to match a teacher's softened outputs."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from converters.digits import DigitsCNN, DigitsData
from converters.errors import CompressionError
from converters.fit import EpochMetrics, TrainConfig, fit
from converters.mobilenet import MobileNet, MobileNetConfig, count_parameters

__all__ = ["DEFAULT_DISTILL", "DistillResult", "distill", "make_student"]

DEFAULT_DISTILL = TrainConfig(epochs=15, lr=5e-3, batch_size=32)


@dataclass(frozen=True)
class DistillResult:
    """A trained student.

    Attributes:
        model: The student, in eval mode.
        teacher_params: Parameters of the teacher.
        student_params: Parameters of the student.
        metrics: Training epochs.
    """

    model: nn.Module
    teacher_params: int
    student_params: int
    metrics: tuple[EpochMetrics, ...]


def make_student(teacher: nn.Module, width: float = 0.5) -> nn.Module:
    """An untrained, narrower network of the teacher's kind.

    Args:
        teacher: A :class:`MobileNet` or :class:`DigitsCNN`.
        width: Channel multiplier relative to the teacher's default layout.

    Raises:
        CompressionError: Unsupported teacher or ``width`` outside ``(0, 1]``.
    """
    if not 0.0 < width <= 1.0:
        raise CompressionError(f"student width must be in (0, 1], got {width}")
    if isinstance(teacher, MobileNet):
        cfg = teacher.config
        return MobileNet(
            MobileNetConfig.scaled(
                width,
                in_channels=cfg.in_channels,
                num_classes=cfg.num_classes,
                resize_to=cfg.resize_to,
            )
        )
    if isinstance(teacher, DigitsCNN):
        conv1, conv2, hidden = (max(4, round(w * width)) for w in teacher.widths)
        return DigitsCNN(
            conv1, conv2, hidden, in_channels=teacher.in_channels, num_classes=teacher.num_classes
        )
    raise CompressionError(f"no student design for {type(teacher).__name__}")


def distill(
    teacher: nn.Module,
    student: nn.Module,
    data: DigitsData,
    *,
    config: TrainConfig = DEFAULT_DISTILL,
    temperature: float = 4.0,
    alpha: float = 0.7,
) -> DistillResult:
    """Train ``student`` in place on a mix of the teacher's soft targets and the labels.

    The loss is ``alpha * T^2 * KL(teacher_T || student_T) + (1 - alpha) * CE(student, y)``
    (Hinton et al.), where ``_T`` is a softmax at temperature ``T``.

    Args:
        teacher: Trained model, used frozen in eval mode.
        student: Model to train; its output size must match the teacher's.
        data: Splits for training and validation.
        config: Training options of the student.
        temperature: Softening temperature, at least 1.
        alpha: Weight of the distillation term, in ``[0, 1]``.

    Raises:
        CompressionError: Bad ``temperature`` or ``alpha``.
        TrainingError: Training diverged or the outputs do not line up.
    """
    if not temperature >= 1.0 or not 0.0 <= alpha <= 1.0:
        raise CompressionError(
            f"need temperature >= 1 and alpha in [0, 1], got {temperature}, {alpha}"
        )
    teacher.eval()

    def loss_fn(logits: torch.Tensor, labels: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            soft = torch.log_softmax(teacher(x) / temperature, dim=1)
        kd = nn.functional.kl_div(
            torch.log_softmax(logits / temperature, dim=1),
            soft,
            reduction="batchmean",
            log_target=True,
        )
        hard = nn.functional.cross_entropy(logits, labels)
        return alpha * temperature**2 * kd + (1.0 - alpha) * hard

    metrics = fit(student, data, config, loss_fn=loss_fn)
    return DistillResult(
        student.eval(), count_parameters(teacher), count_parameters(student), tuple(metrics)
    )
