"""A group's drift settings: the policy that opens incidents and how the hub answers one (pure).

Stored per group as a plain table (:meth:`DriftSettings.to_dict`); a group
without a row has the defaults, which are :class:`DriftPolicy`'s.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cloud.drift.policy import DriftPolicy
from cloud.errors import ValidationError

__all__ = ["DriftSettings"]

_POLICY_KEYS = frozenset(f.name for f in dataclasses.fields(DriftPolicy))


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValidationError(message)


@dataclass(frozen=True)
class DriftSettings:
    """What drift does on one group.

    Attributes:
        policy: When an incident opens and closes.
        retrain: Whether an incident starts retraining by itself.
        teacher: A bigger hub model (a model name in the factory) that labels
            samples no label came back for; "" for none (then only labelled
            samples are trained on: a model's own answers teach it nothing).
        retrain_samples: Usable samples (labelled or teacher-labelled) a
            retraining needs; an incident waits for them.
        min_gain: Accuracy points on the shifted hold-out the new version must
            gain over the running one to be deployed.
        canary: The canary's size, ``"10%"`` or a device count.
        accuracy_gate: Most accuracy points the canary may lose against the
            running version (the rollout's ``accuracy_drop`` gate).
        canary_wait_s: Seconds from the canary's start before the rest of the
            group gets the version, its gates holding (the rollout's
            ``wave_interval_s``).
        canary_min_samples: Labelled inferences the canary's accuracy gate needs
            before it judges.

    Raises:
        ValidationError: A bad setting.
    """

    policy: DriftPolicy = field(default_factory=DriftPolicy)
    retrain: bool = True
    teacher: str = ""
    retrain_samples: int = 20
    min_gain: float = 0.0
    canary: str = "34%"
    accuracy_gate: float = 2.0
    canary_wait_s: float = 60.0
    canary_min_samples: int = 10

    def __post_init__(self) -> None:
        """Check the settings beside the policy's own checks."""
        _check(isinstance(self.retrain, bool), f"retrain={self.retrain!r} is not true or false")
        _check(isinstance(self.teacher, str) and len(self.teacher) <= 64, "bad teacher name")
        n = self.retrain_samples
        ok = isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 100_000
        _check(ok, f"retrain_samples={n!r} not in 1..100000")
        for name in ("min_gain", "accuracy_gate"):
            value = getattr(self, name)
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            _check(ok and math.isfinite(value) and 0 <= value <= 100, f"{name}={value!r} bad")
        _check(isinstance(self.canary, str) and bool(self.canary), "canary needs a size")
        wait = self.canary_wait_s
        ok = isinstance(wait, int | float) and not isinstance(wait, bool)
        _check(ok and math.isfinite(wait) and 0 <= wait <= 86_400, f"canary_wait_s={wait!r} bad")
        m = self.canary_min_samples
        ok = isinstance(m, int) and not isinstance(m, bool) and 1 <= m <= 1_000_000
        _check(ok, f"canary_min_samples={m!r} not in 1..1000000")

    def to_dict(self) -> dict[str, Any]:
        """The settings as a flat table (policy keys beside the others)."""
        out = dataclasses.asdict(self.policy)
        out.update({f.name: getattr(self, f.name) for f in dataclasses.fields(self)})
        del out["policy"]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DriftSettings:
        """Settings from a flat table; missing keys take the defaults.

        Raises:
            ValidationError: An unknown key or a bad value.
        """
        own = {f.name for f in dataclasses.fields(cls)} - {"policy"}
        unknown = sorted(set(data) - own - _POLICY_KEYS)
        _check(not unknown, f"unknown drift settings {', '.join(unknown)}")
        try:
            policy = DriftPolicy(**{k: v for k, v in data.items() if k in _POLICY_KEYS})
            return cls(policy=policy, **{k: v for k, v in data.items() if k in own})
        except TypeError as exc:
            raise ValidationError(f"bad drift settings: {exc}") from exc

    def with_changes(self, changes: Mapping[str, Any]) -> DriftSettings:
        """These settings with some keys changed.

        Raises:
            ValidationError: An unknown key or a bad value.
        """
        return DriftSettings.from_dict({**self.to_dict(), **changes})
