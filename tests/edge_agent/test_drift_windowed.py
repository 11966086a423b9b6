"""PSI and KS: hand computations, scipy's answers, properties; the sliding KS detector."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_agent.drift import (
    PSI_MAJOR,
    PSI_MODERATE,
    Histogram,
    KSWindowDetector,
    categorical_psi,
    histogram_psi,
    kolmogorov_sf,
    ks_2samp,
    ks_statistic,
    psi,
    psi_level,
)

# --- PSI ----------------------------------------------------------------------------------


def test_psi_by_hand() -> None:
    # (0.5 - 0.25) ln 2 + 0 + (0.25 - 0.5) ln(1/2) = 0.5 ln 2
    assert psi([25, 25, 50], [50, 25, 25]) == pytest.approx(0.5 * math.log(2), rel=1e-12)
    assert psi([0.25, 0.25, 0.5], [0.25, 0.25, 0.5]) == 0.0


def test_psi_raises_empty_bins_to_epsilon() -> None:
    expected = (0.25 - 0.5) * math.log(0.25 / 0.5) + (0.25 - 1e-4) * math.log(0.25 / 1e-4)
    assert psi([1, 1, 0], [2, 1, 1]) == pytest.approx(expected, rel=1e-12)
    looser = (0.25 - 0.5) * math.log(0.5) + (0.25 - 0.01) * math.log(0.25 / 0.01)
    assert psi([1, 1, 0], [2, 1, 1], epsilon=0.01) == pytest.approx(looser, rel=1e-12)


def test_histogram_psi_bins_live_values_on_the_reference_edges() -> None:
    reference = Histogram((0.0, 0.5, 1.0), (30.0, 70.0))
    # -5 and 0 fall in the first bin, 0.5, 1 (the last edge is closed) and 7 in the last
    assert reference.bin_counts([-5, 0, 0.5, 1, 7]).tolist() == [2.0, 3.0]
    assert histogram_psi(reference, [0.1, 0.6, 0.7]) == pytest.approx(psi([30, 70], [1, 2]))
    values = np.random.default_rng(0).random(1000)
    edges = np.linspace(0, 1, 11)
    assert Histogram.from_values(values, edges).counts == tuple(np.histogram(values, edges)[0])


def test_categorical_psi_counts_classes_missing_on_either_side() -> None:
    reference = {"cat": 60.0, "dog": 40.0}
    live = ["cat"] * 50 + ["dog"] * 30 + ["fox"] * 20
    e, a = [0.6, 0.4, 1e-4], [0.5, 0.3, 0.2]
    by_hand = sum((ai - ei) * math.log(ai / ei) for ei, ai in zip(e, a, strict=True))
    assert categorical_psi(reference, live) == pytest.approx(by_hand, rel=1e-12)
    assert categorical_psi(reference, {"cat": 5, "dog": 30}) == pytest.approx(
        psi([60, 40], [5, 30])
    )


def test_psi_levels() -> None:
    assert psi_level(0.0) == psi_level(PSI_MODERATE - 1e-9) == "stable"
    assert psi_level(PSI_MODERATE) == psi_level(PSI_MAJOR - 1e-9) == "moderate"
    assert psi_level(PSI_MAJOR) == psi_level(3.0) == "major"
    with pytest.raises(ValueError, match="PSI"):
        psi_level(math.nan)


@pytest.mark.parametrize(
    ("expected", "actual", "epsilon", "match"),
    [
        ([1, 2], [1, 2, 3], 1e-4, "bins"),
        ([1, -1], [1, 1], 1e-4, ">= 0"),
        ([0, 0], [1, 1], 1e-4, "zero"),
        ([1, math.nan], [1, 1], 1e-4, "finite"),
        ([], [], 1e-4, "empty"),
        ([1, 1], [1, 1], 0.0, "epsilon"),
        ([[1, 1]], [[1, 1]], 1e-4, "one-dimensional"),
    ],
)
def test_psi_refuses_bad_input(
    expected: object, actual: object, epsilon: float, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        psi(expected, actual, epsilon)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("edges", "counts", "match"),
    [
        ((0.0,), (), "two edges"),
        ((0.0, 1.0), (1.0, 2.0), "counts"),
        ((0.0, 0.0, 1.0), (1.0, 1.0), "increasing"),
        ((0.0, math.inf), (1.0,), "finite"),
        ((0.0, 1.0), (-1.0,), ">= 0"),
        ((0.0, 1.0), (0.0,), "zero"),
    ],
)
def test_histograms_validate_themselves(
    edges: tuple[float, ...], counts: tuple[float, ...], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        Histogram(edges, counts)


counts = st.lists(st.integers(0, 10_000), min_size=1, max_size=30).filter(lambda c: sum(c) > 0)


@settings(max_examples=200, deadline=None)
@given(counts, st.data())
def test_psi_is_non_negative_and_zero_on_itself(expected: list[int], data: st.DataObject) -> None:
    actual = data.draw(
        st.lists(st.integers(0, 10_000), min_size=len(expected), max_size=len(expected)).filter(
            lambda c: sum(c) > 0
        )
    )
    assert psi(expected, actual) >= 0
    assert psi(expected, expected) == 0
    scaled = [3 * c for c in expected]
    assert psi(expected, scaled) == pytest.approx(0.0, abs=1e-12)


# --- KS -------------------------------------------------------------------------------------


def test_kolmogorov_series_matches_scipy() -> None:
    for z in np.linspace(0.0, 5.0, 501):
        assert kolmogorov_sf(float(z)) == pytest.approx(scipy.stats.kstwobign.sf(z), abs=1e-13)
    assert kolmogorov_sf(-1.0) == 1.0
    assert kolmogorov_sf(40.0) == 0.0


def test_ks_statistic_by_hand() -> None:
    # F_a jumps to 1 at 2; F_b is 1/3 there: sup |F_a - F_b| = 2/3
    assert ks_statistic([1, 2], [2, 3, 4]) == pytest.approx(2 / 3)
    assert ks_statistic([0, 0, 1], [0, 1, 1]) == pytest.approx(1 / 3)  # ties on both sides
    assert ks_statistic([1, 2, 3], [3, 2, 1]) == 0.0


@pytest.mark.parametrize(("n1", "n2"), [(20, 30), (50, 80), (100, 100), (300, 700), (2000, 1500)])
def test_ks_agrees_with_scipy(n1: int, n2: int) -> None:
    rng = np.random.default_rng(n1 + n2)
    for _ in range(40):
        a = rng.normal(size=n1)
        b = rng.normal(rng.uniform(0, 0.8), size=n2)
        if n1 < 200:  # ties too
            a, b = np.round(a, 1), np.round(b, 1)
        ours = ks_2samp(a, b)
        theirs = scipy.stats.ks_2samp(a, b, method="asymp")
        assert ours.statistic == pytest.approx(theirs.statistic, abs=1e-15)
        # scipy's "asymp" is the one-sample law at n = round(nₑ); ours is Stephens'
        # corrected Kolmogorov limit. Margin: 0.03 in p-value, 0.01 from nₑ = 200.
        margin = 0.01 if n1 * n2 / (n1 + n2) >= 200 else 0.03
        assert ours.pvalue == pytest.approx(theirs.pvalue, abs=margin)
        assert (ours.n_reference, ours.n_live) == (n1, n2)


def test_ks_tail_pvalues_are_close_to_the_exact_ones() -> None:
    rng = np.random.default_rng(5)
    checked = 0
    for _ in range(100):
        a, b = rng.normal(size=60), rng.normal(rng.uniform(0.4, 1.0), size=90)
        exact = scipy.stats.ks_2samp(a, b, method="exact").pvalue
        if 1e-8 < exact < 0.05:
            checked += 1
            # measured: within a factor e^0.22 (25 %) of the exact tail probability
            assert abs(math.log(ks_2samp(a, b).pvalue / exact)) < 0.35
    assert checked > 20


def test_ks_against_a_compressed_reference_cdf() -> None:
    rng = np.random.default_rng(8)
    sample = np.sort(rng.normal(size=100_000))
    quantiles = np.quantile(sample, (np.arange(512) + 0.5) / 512)
    live = rng.normal(size=800)
    full = ks_2samp(sample, live)
    compressed = ks_2samp(quantiles, live, reference_n=sample.size)
    assert compressed.n_reference == 100_000
    assert compressed.statistic == pytest.approx(full.statistic, abs=1 / 512)
    assert compressed.pvalue == pytest.approx(full.pvalue, abs=0.05)
    with pytest.raises(ValueError, match="reference_n"):
        ks_2samp(quantiles, live, reference_n=0)


floats = st.lists(
    st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False), min_size=1, max_size=60
)


@settings(max_examples=200, deadline=None)
@given(floats, floats)
def test_ks_is_a_symmetric_statistic_in_the_unit_interval(a: list[float], b: list[float]) -> None:
    result = ks_2samp(a, b)
    assert 0.0 <= result.statistic <= 1.0
    assert 0.0 <= result.pvalue <= 1.0
    assert ks_statistic(b, a) == result.statistic
    assert ks_statistic(a, a) == 0.0


def test_ks_refuses_bad_samples() -> None:
    with pytest.raises(ValueError, match="empty"):
        ks_2samp([], [1.0])
    with pytest.raises(ValueError, match="finite"):
        ks_2samp([1.0], [math.nan])
    with pytest.raises(ValueError, match="numbers"):
        ks_statistic(["a"], [1.0])


# --- the sliding KS detector -------------------------------------------------------------


def normal_step(seed: int, shift: float, change: int = 2000, after: int = 2000) -> list[float]:
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.normal(size=change), rng.normal(shift, 1, size=after)]).tolist()


def test_kswin_detects_a_half_sigma_shift() -> None:
    delays = []
    for seed in range(10):
        detector = KSWindowDetector()
        fired = [i for i, x in enumerate(normal_step(seed, 0.5)) if detector.update(x)]
        assert fired and fired[0] >= 2000, fired
        delays.append(fired[0] - 2000)
    # measured 169..309 (the recent part is 300 values long)
    assert max(delays) <= 350
    assert float(np.median(delays)) <= 300


def test_kswin_is_quiet_on_100k_stationary_samples() -> None:
    detector = KSWindowDetector()
    stream = np.random.default_rng(5).normal(size=100_000).tolist()
    assert sum(detector.update(x) for x in stream) == 0  # measured 0


def test_kswin_against_a_fixed_reference() -> None:
    rng = np.random.default_rng(9)
    detector = KSWindowDetector(alpha=1e-3, stat_size=100, clock=1, reference=rng.normal(size=5000))
    quiet = [detector.update(x) for x in rng.normal(size=3000).tolist()]
    assert not any(quiet)
    shifted = [detector.update(x) for x in rng.normal(1.0, 1, size=300).tolist()]
    assert shifted.index(True) < 100
    assert sum(shifted) <= 3  # after each alarm the recent part refills
    assert detector.pvalue <= 1.0


def test_kswin_reset_validation_and_values() -> None:
    detector = KSWindowDetector(alpha=1e-3, window_size=20, stat_size=5, clock=1)
    fired = [detector.update(x) for x in [0.0] * 15 + [10.0] * 5]
    assert fired[-1] and detector.drift_detected and detector.statistic == 1.0
    detector.update(10.0)  # keeps the 5 recent values only
    assert not detector.drift_detected
    detector.reset()
    assert (detector.pvalue, detector.statistic, detector.drift_detected) == (1.0, 0.0, False)
    with pytest.raises(ValueError, match="finite"):
        detector.update(math.nan)
    for kwargs in (
        {"alpha": 0.0},
        {"alpha": 1.0},
        {"stat_size": 0},
        {"window_size": 300, "stat_size": 300},
        {"clock": 0},
        {"min_statistic": 1.0},
    ):
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            KSWindowDetector(**kwargs)  # type: ignore[arg-type]
