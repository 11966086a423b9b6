"""Pruning with fine-tuning: unstructured magnitude pruning and structured channel pruning.

Magnitude pruning zeroes the smallest weights; the tensors keep their shape, so
the ONNX file only shrinks once compressed. Channel pruning removes whole
channels and rebuilds a narrower network, so every tensor (and the file) is smaller.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from converters.digits import DigitsCNN, DigitsData
from converters.errors import CompressionError
from converters.fit import EpochMetrics, TrainConfig, fit
from converters.mobilenet import ConvBN, MobileNet, MobileNetConfig, count_parameters

__all__ = ["DEFAULT_FINETUNE", "PruneResult", "channel_prune", "magnitude_prune"]

DEFAULT_FINETUNE = TrainConfig(epochs=3, lr=2e-3, schedule="onecycle")
_MIN_CHANNELS = 4


@dataclass(frozen=True)
class PruneResult:
    """A pruned, fine-tuned copy of a model.

    Attributes:
        model: The new model (the input model is left untouched), in eval mode.
        params_before: Parameters of the input model.
        params_after: Parameters of the new model.
        zero_fraction: Fraction of exactly-zero weights in conv and linear layers.
        metrics: Fine-tuning epochs.
    """

    model: nn.Module
    params_before: int
    params_after: int
    zero_fraction: float
    metrics: tuple[EpochMetrics, ...]


def _prunable(model: nn.Module) -> list[torch.Tensor]:
    return [m.weight for m in model.modules() if isinstance(m, nn.Conv2d | nn.Linear)]


def _zero_fraction(model: nn.Module) -> float:
    weights = _prunable(model)
    total = sum(w.numel() for w in weights)
    return sum(int((w == 0).sum()) for w in weights) / max(total, 1)


def magnitude_prune(
    model: nn.Module,
    data: DigitsData,
    *,
    sparsity: float = 0.5,
    finetune: TrainConfig = DEFAULT_FINETUNE,
) -> PruneResult:
    """Zero the globally smallest conv / linear weights, then fine-tune with the zeros held.

    Args:
        model: Trained model; not modified.
        data: Splits for fine-tuning.
        sparsity: Fraction of weights to zero, in ``[0, 0.99]``.
        finetune: Fine-tuning options.

    Raises:
        CompressionError: ``sparsity`` is out of range.
        TrainingError: Fine-tuning diverged.
    """
    if not 0.0 <= sparsity <= 0.99:
        raise CompressionError(f"sparsity must be in [0, 0.99], got {sparsity}")
    pruned = copy.deepcopy(model)
    weights = _prunable(pruned)
    magnitudes = torch.cat([w.detach().abs().flatten() for w in weights])
    k = int(sparsity * magnitudes.numel())
    threshold = torch.kthvalue(magnitudes, k).values if k > 0 else torch.tensor(-1.0)
    masks = [(w.detach().abs() > threshold).to(w.dtype) for w in weights]

    def apply_masks() -> None:
        with torch.no_grad():
            for weight, mask in zip(weights, masks, strict=True):
                weight.mul_(mask)

    apply_masks()
    metrics = fit(pruned, data, finetune, after_step=apply_masks)
    params = count_parameters(model)
    return PruneResult(pruned.eval(), params, params, _zero_fraction(pruned), tuple(metrics))


def channel_prune(
    model: nn.Module,
    data: DigitsData,
    *,
    keep: float = 0.5,
    finetune: TrainConfig | None = DEFAULT_FINETUNE,
) -> PruneResult:
    """Remove the least important channels of every layer, then fine-tune.

    A channel's importance is the L1 norm of its filter times the scale batch
    norm gives it (where there is one). Each layer keeps ``keep`` of its channels,
    at least four. Works on :class:`DigitsCNN` and :class:`MobileNet`.

    Args:
        model: Trained model; not modified.
        data: Splits for fine-tuning.
        keep: Fraction of channels to keep, in ``(0, 1]``.
        finetune: Fine-tuning options; ``None`` skips fine-tuning (to fine-tune by
            distillation instead, see :func:`converters.distill.distill`).

    Raises:
        CompressionError: ``keep`` is out of range or the model type is unsupported.
        TrainingError: Fine-tuning diverged.
    """
    if not 0.0 < keep <= 1.0:
        raise CompressionError(f"keep must be in (0, 1], got {keep}")
    if isinstance(model, MobileNet):
        pruned: nn.Module = _prune_mobilenet(model, keep)
    elif isinstance(model, DigitsCNN):
        pruned = _prune_digits_cnn(model, keep)
    else:
        raise CompressionError(f"channel pruning does not support {type(model).__name__}")
    metrics = fit(pruned, data, finetune) if finetune is not None else []
    return PruneResult(
        pruned.eval(),
        count_parameters(model),
        count_parameters(pruned),
        _zero_fraction(pruned),
        tuple(metrics),
    )


def _top(scores: torch.Tensor, keep: float) -> torch.Tensor:
    count = min(scores.numel(), max(_MIN_CHANNELS, round(scores.numel() * keep)))
    return torch.sort(torch.topk(scores, count).indices).values


def _filter_l1(conv: nn.Conv2d | nn.Linear) -> torch.Tensor:
    return conv.weight.detach().abs().flatten(1).sum(dim=1)


def _bn_scale(bn: nn.BatchNorm2d) -> torch.Tensor:
    assert bn.running_var is not None
    return bn.weight.detach().abs() / torch.sqrt(bn.running_var + bn.eps)


def _copy_conv_bn(
    src: ConvBN, dst: ConvBN, out_idx: torch.Tensor, in_idx: torch.Tensor | None
) -> None:
    """Copy a conv + batch norm, keeping output channels ``out_idx`` (and inputs ``in_idx``)."""
    weight = src.conv.weight.detach()[out_idx]
    if in_idx is not None:
        weight = weight[:, in_idx]
    dst.conv.weight.copy_(weight)
    for name in ("weight", "bias", "running_mean", "running_var"):
        getattr(dst.bn, name).copy_(getattr(src.bn, name).detach()[out_idx])


def _importance(layer: ConvBN) -> torch.Tensor:
    return _filter_l1(layer.conv) * _bn_scale(layer.bn)


@torch.no_grad()
def _prune_mobilenet(model: MobileNet, keep: float) -> MobileNet:
    cfg = model.config
    kept = [_top(_importance(model.stem), keep)]
    kept += [_top(_importance(block.pointwise), keep) for block in model.separable]
    new_cfg = MobileNetConfig(
        stem=len(kept[0]),
        blocks=tuple((len(idx), s) for idx, (_, s) in zip(kept[1:], cfg.blocks, strict=True)),
        in_channels=cfg.in_channels,
        num_classes=cfg.num_classes,
        resize_to=cfg.resize_to,
    )
    new = MobileNet(new_cfg)
    _copy_conv_bn(model.stem, new.stem, kept[0], None)
    for i, (old_block, new_block) in enumerate(zip(model.separable, new.separable, strict=True)):
        _copy_conv_bn(old_block.depthwise, new_block.depthwise, kept[i], None)
        _copy_conv_bn(old_block.pointwise, new_block.pointwise, kept[i + 1], kept[i])
    new.head.weight.copy_(model.head.weight.detach()[:, kept[-1]])
    new.head.bias.copy_(model.head.bias.detach())
    return new


@torch.no_grad()
def _prune_digits_cnn(model: DigitsCNN, keep: float) -> DigitsCNN:
    idx1, idx2, idx_h = (
        _top(_filter_l1(layer), keep) for layer in (model.conv1, model.conv2, model.fc1)
    )
    new = DigitsCNN(
        len(idx1),
        len(idx2),
        len(idx_h),
        in_channels=model.in_channels,
        num_classes=model.num_classes,
    )
    spatial = model.fc1.in_features // model.conv2.out_channels  # flattened features per channel
    columns = (idx2[:, None] * spatial + torch.arange(spatial)).flatten()
    new.conv1.weight.copy_(model.conv1.weight[idx1])
    _copy_bias(model.conv1, new.conv1, idx1)
    new.conv2.weight.copy_(model.conv2.weight[idx2][:, idx1])
    _copy_bias(model.conv2, new.conv2, idx2)
    new.fc1.weight.copy_(model.fc1.weight[idx_h][:, columns])
    new.fc1.bias.copy_(model.fc1.bias[idx_h])
    new.fc2.weight.copy_(model.fc2.weight[:, idx_h])
    new.fc2.bias.copy_(model.fc2.bias)
    return new


def _copy_bias(src: nn.Conv2d, dst: nn.Conv2d, idx: torch.Tensor) -> None:
    if src.bias is None or dst.bias is None:
        raise CompressionError("expected convolutions with a bias")
    dst.bias.copy_(src.bias.detach()[idx])
