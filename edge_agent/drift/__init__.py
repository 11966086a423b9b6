"""Drift detection on the device: is a skill still seeing what it was built for?

Pure numpy and the standard library (no pandas, scipy or river), no I/O and no
clock, so the agent stays light and everything is tested without a device:

* :mod:`edge_agent.drift.windowed` — PSI between a reference histogram and a
  live window; the two-sample Kolmogorov–Smirnov test with an asymptotic
  p-value; a sliding-window KS detector (:class:`KSWindowDetector`);
* :mod:`edge_agent.drift.sequential` — the Page-Hinkley and ADWIN detectors
  (one value at a time) and an :class:`AccuracyMonitor` over labelled feedback;
* :mod:`skills.drift_reference` — a skill version's :class:`DriftReference`
  (built by the hub with :func:`build_reference`, shipped as capped JSON in the
  bundle and read back defensively), re-exported here with its
  :class:`Histogram`: the bundle format owns it, so the hub builds references
  without importing the agent;
* :mod:`edge_agent.drift.summary` — the :class:`DriftMonitor` a running skill
  feeds, which yields one :class:`DriftSummary` per window for the hub.
"""

from edge_agent.drift.sequential import ADWIN, AccuracyMonitor, DriftDetector, PageHinkley
from edge_agent.drift.summary import MAX_WINDOW, DriftMonitor, DriftSummary, InputDrift
from edge_agent.drift.windowed import (
    DEFAULT_EPSILON,
    PSI_MAJOR,
    PSI_MODERATE,
    KSResult,
    KSWindowDetector,
    categorical_psi,
    histogram_psi,
    kolmogorov_sf,
    ks_2samp,
    ks_statistic,
    psi,
    psi_level,
)
from skills.drift_reference import (
    DEFAULT_LIMITS,
    REFERENCE_FORMAT,
    DriftReference,
    Histogram,
    InputReference,
    ReferenceLimits,
    build_reference,
)

__all__ = [
    "ADWIN",
    "DEFAULT_EPSILON",
    "DEFAULT_LIMITS",
    "MAX_WINDOW",
    "PSI_MAJOR",
    "PSI_MODERATE",
    "REFERENCE_FORMAT",
    "AccuracyMonitor",
    "DriftDetector",
    "DriftMonitor",
    "DriftReference",
    "DriftSummary",
    "Histogram",
    "InputDrift",
    "InputReference",
    "KSResult",
    "KSWindowDetector",
    "PageHinkley",
    "ReferenceLimits",
    "build_reference",
    "categorical_psi",
    "histogram_psi",
    "kolmogorov_sf",
    "ks_2samp",
    "ks_statistic",
    "psi",
    "psi_level",
]
