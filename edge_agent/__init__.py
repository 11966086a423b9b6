"""The EdgeSkill edge agent: connects a device to its hub and runs its skills.

Importing this package must not load torch, fastapi or sqlalchemy.
"""

__version__ = "0.1.0"
