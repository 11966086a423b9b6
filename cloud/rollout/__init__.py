"""The rollout rule: deployments and device labels in, desired state out (pure, no I/O).

Everything here is a function of records; the store feeds it and writes back
what it returns. Strategies (today only ``all-at-once``) decide which selected
devices a deployment reaches; canary, waves and gates will be further
strategies and a state machine beside the rule.
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
