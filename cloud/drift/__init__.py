"""The hub's drift policy: device drift windows in, incident decisions out (pure, no I/O).

* :mod:`cloud.drift.aggregate` — :class:`DriftWindow` (one device's drift
  metrics for one telemetry window) and :class:`DriftAggregate` (a skill
  version's windows on a group, with per-device states and fleet numbers).
* :mod:`cloud.drift.policy` — :class:`DriftPolicy` and :func:`evaluate`,
  which opens incidents (debounced) and closes them (with hysteresis).
* :mod:`cloud.drift.incident` — :class:`IncidentState` and the transitions
  of an incident from ``open`` through retraining and canary to its outcome.
"""

from cloud.drift.aggregate import (
    METRIC_KEYS,
    DeviceDrift,
    DriftAggregate,
    DriftKey,
    DriftWindow,
    FleetDrift,
)
from cloud.drift.incident import (
    ENDED,
    IllegalTransitionError,
    IncidentState,
    Stage,
    StageChange,
    clear,
    fail,
    mark_built,
    open_incident,
    promote,
    roll_back,
    start_canary,
    start_retraining,
)
from cloud.drift.policy import CloseIncident, Decision, DriftPolicy, OpenIncident, evaluate

__all__ = [
    "ENDED",
    "METRIC_KEYS",
    "CloseIncident",
    "Decision",
    "DeviceDrift",
    "DriftAggregate",
    "DriftKey",
    "DriftPolicy",
    "DriftWindow",
    "FleetDrift",
    "IllegalTransitionError",
    "IncidentState",
    "OpenIncident",
    "Stage",
    "StageChange",
    "clear",
    "evaluate",
    "fail",
    "mark_built",
    "open_incident",
    "promote",
    "roll_back",
    "start_canary",
    "start_retraining",
]
