"""``edgeskill model split``: cut an ONNX model into segments for split inference in a skill.

Registered on the ``model`` group by :mod:`edgeskill.cli_model`; the hub's
split builder (and ONNX Runtime) are imported only when the command runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from edgeskill._common import console, print_error

if TYPE_CHECKING:
    import numpy as np

    from skills.manifest import SplitSpec
    from skills.split_plan import SplitPlan

__all__ = ["cuts_table", "split"]

#: The largest ``--samples`` or ``--labels`` file read.
MAX_SAMPLES_FILE_BYTES = 512 * 1024 * 1024


def _npy(path: Path | None, what: str) -> np.ndarray | None:
    """An array from a ``.npy`` file (no pickles), under the size cap; None when not given.

    Raises:
        ConversionError: Missing, too large, or not a plain ``.npy`` array.
    """
    import numpy as np  # noqa: PLC0415

    from converters.errors import ConversionError  # noqa: PLC0415

    if path is None:
        return None
    try:
        if path.stat().st_size > MAX_SAMPLES_FILE_BYTES:
            raise ConversionError(f"{what} {path} is larger than {MAX_SAMPLES_FILE_BYTES} bytes")
        return np.asarray(np.load(path, allow_pickle=False))
    except (OSError, ValueError) as exc:
        raise ConversionError(f"{what} {path} is not a readable .npy array: {exc}") from exc


def split(
    onnx_path: Annotated[Path, typer.Argument(help="The full ONNX model.", metavar="ONNX")],
    skill_dir: Annotated[Path, typer.Option(help="The skill's source folder.")],
    model: Annotated[str, typer.Option(help="The model's name in the manifest.")],
    k: Annotated[int, typer.Option(help="The most middle cuts to ship.")] = 6,
    codec: Annotated[
        str, typer.Option(help="Activation codec at the cut: fp32, fp16, int8, or auto per cut.")
    ] = "fp16",
    samples: Annotated[
        Path | None,
        typer.Option(help="Inputs (.npy, batch first) to measure each codec's accuracy cost on."),
    ] = None,
    labels: Annotated[
        Path | None, typer.Option(help="Their true classes (.npy); else the loss is disagreement.")
    ] = None,
    max_loss_pt: Annotated[
        float, typer.Option(help="With --codec auto: the most top-1 points a cut's codec may cost.")
    ] = 0.5,
) -> None:
    """Write MODEL's segments and split.json under SKILL_DIR/models/MODEL/ and show the cuts.

    With --samples, each codec's accuracy cost at each cut is measured and kept in
    split.json; --codec auto (needs --samples) then gives each cut the smallest
    codec within --max-loss-pt. Add the printed [[split]] table to the skill's skill.toml.
    """
    from cloud.split_build import add_split  # noqa: PLC0415
    from converters.errors import ConverterError  # noqa: PLC0415
    from skills.errors import SkillError  # noqa: PLC0415
    from skills.split_plan import SplitPlan  # noqa: PLC0415

    try:
        inputs, classes = _npy(samples, "samples"), _npy(labels, "labels")
        with console.status(f"cutting {onnx_path.name} into segments"):
            spec = add_split(
                skill_dir,
                model,
                onnx_path,
                k=k,
                codec=codec,
                samples=inputs,
                labels=classes,
                max_loss_pt=max_loss_pt,
            )
        plan = SplitPlan.load(skill_dir / spec.plan)
    except (ConverterError, SkillError) as exc:
        print_error(str(exc))
        raise typer.Exit(2) from exc
    console.print(cuts_table(plan, spec))
    console.print(
        f"\n[[split]]\nmodel = {spec.model!r}\nplan = {spec.plan!r}\ncodec = {spec.codec!r}\n"
        f"deadline_ms = {spec.deadline_ms}".replace("'", '"'),
        markup=False,
    )


def cuts_table(plan: SplitPlan, spec: SplitSpec) -> Table:
    """The cuts of ``plan``: what crosses in which codec, its measured cost, each side's time."""
    from skills.codec_limits import BYTES_PER_FP32  # noqa: PLC0415

    table = Table(title=f"{plan.model}: {len(plan.segments)} segments")
    columns = ("cut", "after", "tensors", "bytes", "codec", "sent bytes", "loss pt fp16/int8")
    for column in (*columns, "device ms", "hub ms"):
        table.add_column(column, justify="left" if column in ("cut", "codec") else "right")
    for cut in plan.cuts:
        used = spec.codec_at(cut.codec)
        losses = dict(cut.loss_pt)
        table.add_row(
            cut.name[:48],
            str(cut.after),
            str(len(cut.tensors)),
            f"{cut.nbytes:,}",
            used,
            f"{int(cut.nbytes * BYTES_PER_FP32[used]):,}",
            "/".join(f"{losses[c]:.2f}" if c in losses else "-" for c in ("fp16", "int8")),
            f"{sum(plan.device_ms[: cut.after + 1]):.2f}",
            f"{sum(plan.hub_ms[cut.after + 1 :]):.2f}",
        )
    device = f"{sum(plan.device_ms):.2f}"
    table.add_row("device", str(len(plan.segments) - 1), "-", "0", "-", "0", "-", device, "0.00")
    return table
