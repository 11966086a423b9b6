"""Skill control code in its own process: clean environment, resource limits, a pipe.

The child side is ``python -m edge_agent.sandbox.worker`` (not imported here, so
that running it as ``__main__`` does not import it twice).
"""

from edge_agent.sandbox.launcher import SkillLauncher, make_launcher
from edge_agent.sandbox.limits import SandboxLimits
from edge_agent.sandbox.process import SkillItemError, SkillProcess
from edge_agent.sandbox.protocol import MAX_FRAME_BYTES, PipeProtocolError

__all__ = [
    "MAX_FRAME_BYTES",
    "PipeProtocolError",
    "SandboxLimits",
    "SkillItemError",
    "SkillLauncher",
    "SkillProcess",
    "make_launcher",
]
