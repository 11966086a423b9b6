"""The rollout rule: deployments and device labels in, desired state out (pure, no I/O).

Everything here is a function of records; the store feeds it and writes back
what it returns. An ``all-at-once`` deployment reaches every device its group
selects; a staged one (``canary``, ``waves``, ``rolling``, ``ab``) reaches the devices its
rollout admitted, as the state machine of :mod:`cloud.rollout.engine` decides
from its plan (:mod:`cloud.rollout.plan`) and gates (:mod:`cloud.rollout.gates`).
"""

from cloud.rollout.rule import ActiveDeployment, DesiredSkill, compute_desired, compute_fleet
from cloud.rollout.strategy import DEFAULT_STRATEGY, Strategy, parse_strategy

__all__ = [
    "DEFAULT_STRATEGY",
    "ActiveDeployment",
    "DesiredSkill",
    "Strategy",
    "compute_desired",
    "compute_fleet",
    "parse_strategy",
]
