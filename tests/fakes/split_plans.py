"""A three-segment split plan for the agent's planner tests (no files behind it)."""

from __future__ import annotations

from skills.split_plan import CutInfo, SegmentInfo, SplitPlan


def three_segment_plan(
    *,
    input_bytes: int,
    output_bytes: int,
    mid_bytes: int,
    late_bytes: int,
    hub_ms: float,
    device_ms: float,
) -> SplitPlan:
    """Segments a, b, c; cuts ``input`` (hub only), ``mid`` (after a), ``late`` (after b)."""
    return SplitPlan(
        model="net",
        input_names=("x",),
        output_names=("y",),
        input_bytes=input_bytes,
        output_bytes=output_bytes,
        segments=tuple(SegmentInfo(f, (), ()) for f in ("a", "b", "c")),
        cuts=(
            CutInfo("input", -1, ("x",), input_bytes),
            CutInfo("mid", 0, ("m",), mid_bytes),
            CutInfo("late", 1, ("l",), late_bytes),
        ),
        hub_ms=(hub_ms,) * 3,
        device_ms=(device_ms,) * 3,
    )
