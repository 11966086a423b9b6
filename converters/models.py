"""The architectures this package trains, and how their weights are saved and loaded.

A saved model is a torch file holding only tensors and plain values (loaded with
``weights_only=True``, so no pickled code runs): the architecture name, the layout
needed to rebuild it (pruned models are narrower than the defaults) and the weights.
"""

from __future__ import annotations

import io
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from converters._files import atomic_write_bytes
from converters.digits import DigitsCNN
from converters.errors import ConversionError
from converters.mobilenet import MobileNet, MobileNetConfig

__all__ = [
    "ARCHITECTURES",
    "MAX_MODEL_FILE_BYTES",
    "architecture_of",
    "build_model",
    "load_model",
    "save_model",
]

ARCHITECTURES = ("digits-cnn", "mobilenet")
MAX_MODEL_FILE_BYTES = 512 * 1024**2
_FORMAT = "edgeskill-model/1"


def architecture_of(model: nn.Module) -> tuple[str, dict[str, Any]]:
    """Name and JSON-able layout of a model built by this package.

    Raises:
        ConversionError: The model is not one of :data:`ARCHITECTURES`.
    """
    if isinstance(model, DigitsCNN):
        conv1, conv2, hidden = model.widths
        return "digits-cnn", {
            "conv1": conv1,
            "conv2": conv2,
            "hidden": hidden,
            "in_channels": model.in_channels,
            "num_classes": model.num_classes,
        }
    if isinstance(model, MobileNet):
        layout = asdict(model.config)
        layout["blocks"] = [list(b) for b in model.config.blocks]
        return "mobilenet", layout
    raise ConversionError(f"unsupported model type {type(model).__name__}")


def build_model(arch: str, layout: dict[str, Any]) -> nn.Module:
    """Build an untrained model from :func:`architecture_of`'s output.

    Raises:
        ConversionError: Unknown architecture or a layout that does not fit it.
    """
    try:
        if arch == "digits-cnn":
            return DigitsCNN(
                int(layout["conv1"]),
                int(layout["conv2"]),
                int(layout["hidden"]),
                in_channels=int(layout["in_channels"]),
                num_classes=int(layout["num_classes"]),
            )
        if arch == "mobilenet":
            blocks = tuple((int(c), int(s)) for c, s in layout["blocks"])
            config = MobileNetConfig(
                stem=int(layout["stem"]),
                blocks=blocks,
                in_channels=int(layout["in_channels"]),
                num_classes=int(layout["num_classes"]),
                resize_to=int(layout["resize_to"]),
            )
            return MobileNet(config)
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise ConversionError(f"bad layout for {arch}: {exc}") from exc
    raise ConversionError(f"unknown architecture {arch!r}; known: {', '.join(ARCHITECTURES)}")


def save_model(model: nn.Module, path: Path) -> Path:
    """Save architecture, layout and weights atomically.

    Raises:
        ConversionError: The model is not one of :data:`ARCHITECTURES`.
    """
    arch, layout = architecture_of(model)
    buffer = io.BytesIO()
    torch.save(
        {"format": _FORMAT, "arch": arch, "layout": layout, "state": model.state_dict()}, buffer
    )
    atomic_write_bytes(path, buffer.getvalue())
    return path


def load_model(path: Path) -> nn.Module:
    """Load a model saved by :func:`save_model`, in eval mode.

    Raises:
        ConversionError: The file is missing, too large, corrupt or not a model of ours.
    """
    try:
        size = path.stat().st_size
        if size > MAX_MODEL_FILE_BYTES:
            raise ConversionError(f"{path.name} is {size} bytes, over {MAX_MODEL_FILE_BYTES}")
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except ConversionError:
        raise
    except Exception as exc:  # torch.load raises pickle, zip and runtime errors alike
        raise ConversionError(f"cannot read model file {path.name}: {exc}") from exc
    if not isinstance(blob, dict) or blob.get("format") != _FORMAT:
        raise ConversionError(f"{path.name} is not an EdgeSkill model file")
    model = build_model(str(blob["arch"]), dict(blob["layout"]))
    try:
        model.load_state_dict(blob["state"])
    except (RuntimeError, KeyError, TypeError) as exc:
        detail = str(exc)[:300]
        raise ConversionError(f"weights in {path.name} do not fit its layout: {detail}") from exc
    return model.eval()
