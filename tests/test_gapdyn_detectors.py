"""The online detectors against independent routes: CUSUM against Page's recursion written as a loop and a
hand-computed firing step; Mann-Kendall against scipy.stats.kendalltau and a double loop; thresholds and levels
against loops; NaN entries skipped and steps carried through."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import kendalltau, norm

from gapdyn.evidence.detectors import (Cusum, Level, MannKendall, Threshold, detector_from_dict, mann_kendall,
                              zero_std_share)


def _cusum_loop(x, direction, w, drift):
    mu, sd = np.mean(x[:w]), np.std(x[:w], ddof=1)
    out, S = [-math.inf] * w, 0.0
    for v in x[w:]:
        S = max(0.0, S + direction * (v - mu) / sd - drift)
        out.append(S)
    return np.array(out)


@pytest.mark.parametrize("direction", [1, -1])
def test_cusum_equals_pages_recursion(direction):
    rng = np.random.default_rng(5 + direction)
    for _ in range(5):
        x = rng.normal(size=60) + np.r_[np.zeros(30), direction * np.linspace(0, 2, 30)]
        d = Cusum(direction=direction, reference_steps=8, drift=0.3)
        _, s = d.scores(x)
        np.testing.assert_allclose(s, _cusum_loop(x, direction, 8, 0.3), rtol=1e-12, atol=1e-12)
        ref = _cusum_loop(x, direction, 8, 0.3)
        hit = np.flatnonzero(ref >= d.threshold)
        assert d.first_firing(x) == (int(hit[0]) if hit.size else None)


def test_cusum_fires_at_the_hand_computed_step():
    # reference mean 0, sd sqrt(4/3); every later value -2 sd: increments 2 - 0.5 = 1.5 -> 1.5, 3, 4.5, 6 >= 5
    sd = math.sqrt(4 / 3)
    x = [-1, 1, -1, 1] + [-2 * sd] * 6
    assert Cusum(direction=-1, reference_steps=4, drift=0.5, threshold=5.0).first_firing(x) == 7
    assert Cusum(direction=+1, reference_steps=4, drift=0.5, threshold=5.0).first_firing(x) is None
    # steps are carried: the 8th logged value sits at step 70
    assert Cusum(direction=-1, reference_steps=4).first_firing(x, steps=np.arange(0, 100, 10)) == 70


def test_nan_entries_are_not_logged_steps():
    x = np.array([1.0, np.nan, 2.0, np.nan, 3.0, 9.0])
    t, s = Threshold(sign=1, threshold=2.5, window=2).scores(x, steps=np.arange(6) * 5)
    np.testing.assert_array_equal(t, [0, 10, 20, 25])
    np.testing.assert_allclose(s, [-np.inf, 1.5, 2.5, 6.0])
    assert Threshold(sign=1, threshold=2.5, window=2).first_firing(x, steps=np.arange(6) * 5) == 20


def _mk_loop(x):
    S = 0
    for i in range(len(x)):
        for j in range(i + 1, len(x)):
            S += int(x[j] > x[i]) - int(x[j] < x[i])
    return S


def test_mann_kendall_against_kendalltau_and_a_double_loop():
    rng = np.random.default_rng(11)
    for n in (5, 12, 25):
        for rounding in (None, 1):  # with ties, without
            x = rng.normal(size=n) + 0.05 * np.arange(n)
            x = np.round(x, rounding) if rounding is not None else x
            r = mann_kendall(x, continuity=False)
            k = kendalltau(np.arange(n), x, method="asymptotic")
            assert r.S == _mk_loop(x)
            assert r.tau == pytest.approx(k.statistic, rel=1e-12)
            assert r.p == pytest.approx(k.pvalue, rel=1e-9)
            rc = mann_kendall(x)
            assert abs(rc.z) <= abs(r.z) and rc.z * r.z >= 0
            assert rc.z == pytest.approx((r.S - np.sign(r.S)) / math.sqrt(r.var))


def test_mann_kendall_known_answers():
    r = mann_kendall(np.arange(10.0)[::-1], continuity=False)
    assert r.S == -45 and r.var == pytest.approx(10 * 9 * 25 / 18) and r.tau == -1
    assert mann_kendall(np.ones(6)).p == 1.0


@pytest.mark.parametrize("continuity", [True, False])
def test_sliding_mann_kendall_is_the_test_on_each_window(continuity):
    rng = np.random.default_rng(2)
    x = np.round(rng.normal(size=40) - 0.04 * np.arange(40), 1)
    d = MannKendall(direction=-1, window=12, continuity=continuity)
    _, s = d.scores(x)
    assert np.all(np.isneginf(s[:11]))
    expected = [-mann_kendall(x[t - 11:t + 1], continuity=continuity).z for t in range(11, 40)]
    np.testing.assert_allclose(s[11:], expected, rtol=1e-12, atol=1e-12)
    # a one-sided 5 % level is the cutoff 1.645; the first window whose p (one-sided, falling) < 5 %
    p_one = [norm.sf(v) for v in expected]
    first = next((t for t, p in zip(range(11, 40), p_one) if p <= norm.sf(1.645)), None)
    assert d.first_firing(x) == first


def test_threshold_and_level_against_loops():
    rng = np.random.default_rng(3)
    x = np.abs(rng.normal(1, 0.3, size=50)) * np.r_[np.ones(25), np.linspace(1, 4, 25)]
    for sign, thr in ((1, 2.0), (-1, 0.7)):
        d = Threshold(sign=sign, threshold=thr, window=3)
        m = [np.mean(x[t - 2:t + 1]) for t in range(2, 50)]
        first = next((t for t, v in zip(range(2, 50), m) if sign * (v - thr) >= 0), None)
        assert d.first_firing(x) == first
        assert d.at_cutoff(d.cutoff) == d
    lv = Level(sign=1, threshold=2.5, window=4, reference_steps=10)
    mu = np.mean(x[:10])
    r = [np.mean(x[t - 3:t + 1]) / mu for t in range(13, 50)]
    assert lv.first_firing(x) == next((t for t, v in zip(range(13, 50), r) if v >= 2.5), None)
    assert Level(reference_steps=3).first_firing([0.0, 0.0, 0.0, 5.0, 5.0, 5.0, 5.0, 5.0]) is None  # mu_ref = 0


def test_zero_std_share_and_round_trip():
    d = zero_std_share(0.5, window=2)
    assert d.first_firing([0.0, 0.25, 0.5, 0.75, 1.0]) == 3
    for det in (Cusum(), MannKendall(window=5), Threshold(sign=-1, threshold=0.1), Level()):
        assert detector_from_dict(det.to_dict()) == det


@pytest.mark.parametrize("make", [lambda: Cusum(direction=0), lambda: Cusum(reference_steps=1),
                                  lambda: MannKendall(window=2), lambda: Threshold(window=0),
                                  lambda: Level(sign=2), lambda: detector_from_dict({"kind": "Nope"})])
def test_bad_settings_are_one_line_errors(make):
    with pytest.raises(ValueError) as e:
        make()
    assert "\n" not in str(e.value)


def test_bad_series_is_an_error():
    with pytest.raises(ValueError, match="strictly increasing"):
        Threshold().first_firing([1.0, 2.0], steps=[3, 3])
    with pytest.raises(ValueError, match="1-D"):
        Threshold().first_firing(np.ones((2, 2)))


def test_an_infinite_value_stays_in_its_own_windows():
    """gap/headroom is +inf on a step where no cap binds: the windows after it are ordinary numbers."""
    x = np.array([1.0, np.inf, 2.0, 3.0, 0.5])
    _, s = Threshold(sign=-1, threshold=1.0, window=1).scores(x)
    np.testing.assert_array_equal(s, [-1.0, -np.inf, -2.0, -3.0, -0.5])
    assert Threshold(sign=-1, threshold=1.0, window=1).first_firing(x) == 0
    assert Threshold(sign=-1, threshold=1.0, window=1).first_firing(x[1:], steps=np.arange(1, 5)) == 4
    # Mann-Kendall ranks +inf above every number: the S of 1, inf, 2, 3 is the S of 1, 9, 2, 3
    assert mann_kendall([1.0, np.inf, 2.0, 3.0]).S == mann_kendall([1.0, 9.0, 2.0, 3.0]).S
    np.testing.assert_allclose(MannKendall(window=4).scores([1.0, np.inf, 2.0, 3.0, 4.0])[1][3:],
                               MannKendall(window=4).scores([1.0, 9.0, 2.0, 3.0, 4.0])[1][3:])
