"""Desired-state messages as a hub sends them, for driving a reconciler directly."""

from __future__ import annotations

from protos import pb


def desired_state(name: str, generation: int, version: str) -> pb.DesiredState:
    """Generation ``generation`` wants ``version`` of ``name``, fetched as ``name/version``."""
    msg = pb.DesiredState(generation=generation)
    msg.skills.add(name=name, version=version, target_name=f"{name}/{version}")
    return msg
