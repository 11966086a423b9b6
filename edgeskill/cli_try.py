"""``edgeskill agent try``: run a skill on an input here, as a device would, and show it."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from edgeskill._common import console, print_error

__all__ = ["agent_try", "plain", "result_summary"]

_MAX_CELL = 90


def _config(pairs: list[str] | None) -> dict[str, str]:
    config = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            print_error(f"--config takes KEY=VALUE, got {pair!r}")
            raise typer.Exit(2)
        config[key] = value
    return config


def plain(value: Any) -> Any:
    """``value`` with numpy arrays and numbers as lists and Python numbers (JSON-able)."""
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def _short(value: Any) -> Any:
    """``value`` with long lists and floats shortened, for one table cell."""
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, list):
        if len(value) > 6 and all(isinstance(v, int | float) for v in value):
            return f"[{len(value)} numbers]"
        return [_short(v) for v in value]
    if isinstance(value, dict):
        return {k: _short(v) for k, v in value.items()}
    return value


def result_summary(result: dict[str, Any]) -> str:
    """One line of a skill's result: its fields, numbers rounded, long vectors counted."""
    first: dict[str, Any] = {k: result[k] for k in ("label", "class", "confidence") if k in result}
    ordered = {**first, **{k: v for k, v in result.items() if k not in first}}
    text = json.dumps(_short(plain(ordered)), ensure_ascii=False, separators=(", ", ": "))
    return text if len(text) <= _MAX_CELL else text[: _MAX_CELL - 1] + "…"


def agent_try(
    skill: Annotated[
        Path, typer.Argument(help="A .skill bundle, or a skill folder (a library source too).")
    ],
    input_spec: Annotated[
        str,
        typer.Argument(
            metavar="INPUT",
            help="An image, a folder of images, a .wav, a .txt (one item a line), an .npz "
            "replay file, camera:N or mic:SECONDS.",
        ),
    ],
    config: Annotated[
        list[str] | None, typer.Option(help="A config KEY=VALUE for the skill; repeat.")
    ] = None,
    board: Annotated[
        str | None, typer.Option(help="Pick model variants as this board would.")
    ] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="Process at most this many.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON result a line.")] = False,
) -> None:
    """Run a skill's control code on an input through the agent's skill runtime.

    The skill runs in its own process with the models the runtime picks for this
    device, exactly as it would after a deployment; nothing is sent anywhere.

    Examples:
      edgeskill agent try skills/library/face-detect photo.png
      edgeskill agent try dist/ocr-1.0.0.skill scans/ --limit 5
      edgeskill agent try dist/voice-activity-1.0.0.skill speech.wav
    """
    from cloud.errors import HubError  # noqa: PLC0415 - a library source's models
    from edge_agent.adapters import load_input  # noqa: PLC0415
    from edge_agent.errors import AgentError  # noqa: PLC0415
    from edgeskill.skill_runner import (  # noqa: PLC0415
        prepare_skill,
        run_source,
        running,
        try_targets,
    )
    from skills.errors import SkillError  # noqa: PLC0415

    settings = _config(config)

    try:
        source = load_input(input_spec)
        with tempfile.TemporaryDirectory(prefix="edgeskill-try-") as tmp:
            skill_dir = prepare_skill(skill, Path(tmp))
            with running(skill_dir, try_targets(board), settings) as proc:
                outcomes = list(run_source(proc, source, limit=limit))
                models = dict(proc.models)
                name = f"{proc.manifest.name} {proc.manifest.version}"
    except (AgentError, SkillError, HubError) as exc:
        print_error(str(exc))
        raise typer.Exit(2) from exc
    if as_json:
        for o in outcomes:
            line = {"input": o.name, "ms": o.latency_ms, **(o.result or {})}
            typer.echo(json.dumps(plain(line) if not o.error else {**line, "error": o.error}))
    else:
        _table(console, name, models, outcomes)
    if any(o.error for o in outcomes):
        raise typer.Exit(1)


def _table(out: Console, name: str, models: dict[str, str], outcomes: list[Any]) -> None:
    used = ", ".join(f"{m}: {v}" for m, v in sorted(models.items())) or "none"
    table = Table(title=f"{escape(name)} (models {escape(used)})")
    table.add_column("input")
    table.add_column("ms", justify="right")
    table.add_column("result")
    for o in outcomes:
        cell = f"[red]{escape(o.error)}[/]" if o.error else escape(result_summary(o.result))
        table.add_row(escape(o.name), f"{o.latency_ms:.1f}", cell)
    out.print(table)
