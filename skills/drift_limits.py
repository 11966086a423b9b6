"""The caps on a drift reference read from a bundle, without numpy.

A manifest's ``[drift]`` table (:mod:`skills.drift_spec`) names these caps; the
reference itself (:mod:`skills.drift_reference`, numpy) is read only when a
skill version starts. :mod:`skills.drift_reference` re-exports every name here.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_LIMITS", "ReferenceLimits"]


@dataclass(frozen=True)
class ReferenceLimits:
    """Caps on a drift reference read from a bundle.

    Attributes:
        max_bytes: The JSON document's size.
        max_classes: Classes in the class mix.
        max_bins: Bins of the confidence histogram.
        max_inputs: Declared input summaries.
        max_points: Reference points per input summary.
        max_name_chars: Length of a class or input name.
        max_n: The sample size an input's points may stand for.
    """

    max_bytes: int = 1 << 20
    max_classes: int = 1024
    max_bins: int = 256
    max_inputs: int = 64
    max_points: int = 4096
    max_name_chars: int = 128
    max_n: int = 10**12


DEFAULT_LIMITS = ReferenceLimits()
