"""Names of the ``EDGESKILL_*`` variables that carry settings into the control process.

Kept apart from the worker so the parent can name them without importing the
worker module (``python -m`` warns when its module is already imported).
"""

__all__ = [
    "ENV_CONFIG",
    "ENV_CPU_SECONDS",
    "ENV_MAX_OPEN_FILES",
    "ENV_MEMORY_MB",
    "ENV_SKILL_DIR",
    "ENV_TARGETS",
]

ENV_SKILL_DIR = "EDGESKILL_SKILL_DIR"
ENV_TARGETS = "EDGESKILL_TARGETS"
ENV_CONFIG = "EDGESKILL_CONFIG"
ENV_MEMORY_MB = "EDGESKILL_MEMORY_MB"
ENV_CPU_SECONDS = "EDGESKILL_CPU_SECONDS"
ENV_MAX_OPEN_FILES = "EDGESKILL_MAX_OPEN_FILES"
