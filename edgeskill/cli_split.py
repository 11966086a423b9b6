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
    from skills.split_plan import SplitPlan

__all__ = ["cuts_table", "split"]

_CODEC_BYTES = {"fp32": 1.0, "fp16": 0.5, "int8": 0.25}


def split(
    onnx_path: Annotated[Path, typer.Argument(help="The full ONNX model.", metavar="ONNX")],
    skill_dir: Annotated[Path, typer.Option(help="The skill's source folder.")],
    model: Annotated[str, typer.Option(help="The model's name in the manifest.")],
    k: Annotated[int, typer.Option(help="The most middle cuts to ship.")] = 6,
    codec: Annotated[str, typer.Option(help="Activation codec at the cut: fp32, fp16, int8.")] = (
        "fp16"
    ),
) -> None:
    """Write MODEL's segments and split.json under SKILL_DIR/models/MODEL/ and show the cuts.

    Add the printed [[split]] table to the skill's skill.toml.
    """
    from cloud.split_build import add_split  # noqa: PLC0415
    from converters.errors import ConverterError  # noqa: PLC0415
    from skills.errors import SkillError  # noqa: PLC0415
    from skills.split_plan import SplitPlan  # noqa: PLC0415

    try:
        with console.status(f"cutting {onnx_path.name} into segments"):
            spec = add_split(skill_dir, model, onnx_path, k=k, codec=codec)
        plan = SplitPlan.load(skill_dir / spec.plan)
    except (ConverterError, SkillError) as exc:
        print_error(str(exc))
        raise typer.Exit(2) from exc
    console.print(cuts_table(plan, codec))
    console.print(
        f"\n[[split]]\nmodel = {spec.model!r}\nplan = {spec.plan!r}\ncodec = {spec.codec!r}\n"
        f"deadline_ms = {spec.deadline_ms}".replace("'", '"'),
        markup=False,
    )


def cuts_table(plan: SplitPlan, codec: str) -> Table:
    """The cuts of ``plan``: what crosses, and the time on each side at the build machine."""
    table = Table(title=f"{plan.model}: {len(plan.segments)} segments")
    for column in ("cut", "after", "tensors", "bytes", f"{codec} bytes", "device ms", "hub ms"):
        table.add_column(column, justify="left" if column in ("cut", "tensors") else "right")
    ratio = _CODEC_BYTES.get(codec, 1.0)
    for cut in plan.cuts:
        device_ms = sum(plan.device_ms[: cut.after + 1])
        hub_ms = sum(plan.hub_ms[cut.after + 1 :])
        table.add_row(
            cut.name[:48],
            str(cut.after),
            str(len(cut.tensors)),
            f"{cut.nbytes:,}",
            f"{int(cut.nbytes * ratio):,}",
            f"{device_ms:.2f}",
            f"{hub_ms:.2f}",
        )
    table.add_row(
        "device", str(len(plan.segments) - 1), "-", "0", "0", f"{sum(plan.device_ms):.2f}", "0.00"
    )
    return table
