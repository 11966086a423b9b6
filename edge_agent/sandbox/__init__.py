"""Skill control code in its own process: clean environment, resource limits, a pipe.

The child side is ``python -m edge_agent.sandbox.worker`` (not imported here, so
that running it as ``__main__`` does not import it twice).
"""

from edge_agent.sandbox.limits import SandboxLimits
from edge_agent.sandbox.process import SkillItemError, SkillProcess
from edge_agent.sandbox.protocol import MAX_FRAME_BYTES, ProtocolError

__all__ = ["MAX_FRAME_BYTES", "ProtocolError", "SandboxLimits", "SkillItemError", "SkillProcess"]
