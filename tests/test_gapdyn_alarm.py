"""Alarm scoring on constructed runs with known answers, each quantity against a loop that re-applies the detector
at every candidate cutoff (calibration, ROC, false alarms per step) or a closed form (median interval indices)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gapdyn.evidence.alarm import (AlarmRun, AlarmSpec, alarm_step, calibrate, evaluate_spec, false_alarm_curve,
                          false_alarms, lead_summary, lead_time, lead_times, median_interval, peak_score, roc_at_lead,
                          specs_hash)
from gapdyn.evidence.detectors import Cusum, Threshold


def _run(name, peak_at, peak, collapse=None, group="rl", steps=100, stat="x"):
    x = np.zeros(steps)
    if peak_at is not None:
        x[peak_at] = peak
    return AlarmRun(name, {stat: (np.arange(steps), x)}, collapse, group)


def _random_runs(rng, n_neg=20, n_pos=15, group="rl"):
    runs = []
    for i in range(n_neg):
        runs.append(AlarmRun(f"n{i}", {"x": (np.arange(100), np.round(rng.normal(size=100), 1))}, None, group))
    for i in range(n_pos):
        c = int(rng.integers(30, 90))
        x = np.round(rng.normal(size=100) + np.r_[np.zeros(c - 15), np.linspace(0, 3, 115 - c)], 1)
        runs.append(AlarmRun(f"p{i}", {"x": (np.arange(100), x)}, c, group))
    return runs


DET = Threshold(sign=1, threshold=0.0, window=1)


def _fires(run, det):
    """The detector applied to the run's raw series (not through gapdyn.evidence.alarm's cached scores)."""
    t, x = run.series["x"]
    return det.first_firing(x, t)


def test_alarm_lead_and_false_alarm_on_known_runs():
    pos = _run("p", 35, 2.0, collapse=50)
    missed = _run("m", None, 0.0, collapse=40)
    neg = [_run("a", 20, 3.0), _run("b", None, 0.0), _run("c", 60, 1.0)]
    det = DET.at_cutoff(1.5)
    assert alarm_step(pos, "x", det) == 35 and lead_time(pos, "x", det) == 15
    assert lead_time(missed, "x", det) == -math.inf and lead_time(neg[0], "x", det) is None
    fa = false_alarms([pos, missed, *neg], "x", det)
    assert (fa["k"], fa["n"]) == (1, 3)
    assert fa["per_step"] == pytest.approx(1 / (21 + 100 + 100))  # watched up to the firing step, else to the end
    assert fa["rate"].lo < 1 / 3 < fa["rate"].hi
    np.testing.assert_allclose(false_alarm_curve(neg, "x", det, [0, 19, 20, 99]), [0, 0, 1 / 3, 1 / 3])
    np.testing.assert_array_equal(lead_times([pos, missed, *neg], "x", det), [15, -np.inf])
    # a run without the statistic is left out and counted
    assert false_alarms([*neg, AlarmRun("z", {}, None)], "x", det)["n_missing"] == 1


def _brute_cutoff(peaks, far):
    allowed = math.floor(far * len(peaks) + 1e-9)
    candidates = sorted({np.nextafter(p, np.inf) for p in peaks} | {np.nextafter(-np.inf, np.inf)})
    return next(c for c in candidates if sum(p >= c for p in peaks) <= allowed)


@pytest.mark.parametrize("far", [0.0, 0.1, 0.25, 0.5])
def test_calibration_is_the_smallest_cutoff_at_the_rate(far):
    rng = np.random.default_rng(4)
    runs = _random_runs(rng)
    cal = calibrate(runs, "x", DET, far=far)
    peaks = [peak_score(r, "x", DET) for r in runs if not r.collapses]
    assert cal.cutoff == _brute_cutoff(peaks, far)
    assert cal.n == 20 and cal.allowed == math.floor(far * 20 + 1e-9)
    fired = sum(_fires(r, cal.detector) is not None for r in runs if not r.collapses)
    assert fired == cal.k <= cal.allowed
    # one step below the cutoff would exceed the rate (the cutoff is the smallest), unless ties make it exact
    looser = cal.detector.at_cutoff(np.nextafter(cal.cutoff, -np.inf))
    assert sum(_fires(r, looser) is not None for r in runs if not r.collapses) > cal.allowed


def test_calibration_on_a_cusum_and_known_peaks():
    runs = [_run(f"n{i}", 50, float(i + 1)) for i in range(10)]
    cal = calibrate(runs, "x", DET, far=0.1)
    assert cal.allowed == 1 and cal.k == 1 and 9.0 < cal.cutoff < 9.0 + 1e-12
    rng = np.random.default_rng(0)
    cr = [AlarmRun(f"c{i}", {"x": (np.arange(60), rng.normal(size=60))}, None) for i in range(10)]
    cal = calibrate(cr, "x", Cusum(direction=1, reference_steps=10), far=0.2)
    assert sum(_fires(r, cal.detector) is not None for r in cr) == cal.k <= 2


def test_roc_at_lead_against_reapplying_the_detector():
    rng = np.random.default_rng(7)
    runs = _random_runs(rng)
    for lead in (0, 5, 10):
        roc = roc_at_lead(runs, "x", DET, lead)
        for c, f, t in list(zip(roc.cutoffs, roc.fpr, roc.tpr))[::5]:  # every 5th cutoff: the loop is slow
            d = DET.at_cutoff(c)
            tp = np.mean([(a := _fires(r, d)) is not None and a <= r.collapse_step - lead
                          for r in runs if r.collapses])
            fp = np.mean([_fires(r, d) is not None for r in runs if not r.collapses])
            assert (f, t) == (pytest.approx(fp), pytest.approx(tp))
        assert roc.fpr[0] == 0 and roc.tpr[0] == 0 and np.all(np.diff(roc.tpr) >= 0) and np.all(np.diff(roc.fpr) >= 0)
        p = [peak_score(r, "x", DET, until=r.collapse_step - lead) for r in runs if r.collapses]
        q = [peak_score(r, "x", DET) for r in runs if not r.collapses]
        pairs = [1.0 if a > b else 0.5 if a == b else 0.0 for a in p for b in q]
        assert roc.auc.estimate == pytest.approx(np.mean(pairs))
        assert roc.tpr_at(1.0) == 1.0


def _binom_cdf(k, n):
    return sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n


@pytest.mark.parametrize("n", [5, 6, 10, 23, 40])
def test_median_interval_indices(n):
    x = np.arange(1.0, n + 1)
    med, lo, hi = median_interval(x)
    ls = [l for l in range(1, n // 2 + 1) if _binom_cdf(l - 1, n) <= 0.025]
    assert med == x[(n - 1) // 2]
    if not ls:
        assert (lo, hi) == (-math.inf, math.inf)
    else:
        assert (lo, hi) == (x[max(ls) - 1], x[n - max(ls)])
    if n == 10:
        assert (lo, hi) == (2.0, 9.0)


def test_lead_summary_counts_misses_below_every_lead():
    s = lead_summary([20, 10, 5, 0, -3, -math.inf], at=(0, 5, 10))
    assert s["n"] == 6
    assert [s[f"detected_{L}"].estimate for L in (0, 5, 10)] == pytest.approx([4 / 6, 3 / 6, 2 / 6])
    assert s["median"] == 0 and s["q25"] == -3


def test_spec_hash_and_evaluation_rows():
    a = AlarmSpec("x_high", "x", DET, far=0.1, lead=5, role="primary")
    b = AlarmSpec("cusum", "x", Cusum(direction=1), far=0.1, lead=5, role="baseline")
    assert specs_hash([a, b]) == specs_hash([b, a])
    assert specs_hash([a]) != specs_hash([AlarmSpec("x_high", "x", DET, far=0.2, lead=5, role="primary")])
    assert AlarmSpec.from_dict(a.to_dict()) == a
    rng = np.random.default_rng(9)
    cal_runs = _random_runs(rng) + _random_runs(rng, n_neg=0, n_pos=5, group="control")
    held = _random_runs(rng) + _random_runs(rng, n_neg=2, n_pos=6, group="control")
    rows = evaluate_spec(a, cal_runs, held, calibrate_groups=("rl",))
    assert [r["group"] for r in rows] == ["control", "rl"]
    cal = calibrate([r for r in cal_runs if r.group == "rl"], "x", DET, far=0.1)
    for row in rows:
        g = [r for r in held if r.group == row["group"]]
        fa = false_alarms(g, "x", cal.detector)
        assert row["cutoff"] == cal.cutoff and row["false_alarms"] == fa["k"] and row["n_negatives"] == fa["n"]
        leads = lead_times(g, "x", cal.detector)
        assert row["detected_5"] == pytest.approx(np.mean(leads >= 5))
    bad = AlarmSpec("y", "y", DET)
    assert "no never-collapsing run" in evaluate_spec(bad, cal_runs, held)[0]["note"]


@pytest.mark.parametrize("make", [lambda: AlarmSpec("a", "x", DET, far=1.0), lambda: AlarmSpec("a", "x", "cusum"),
                                  lambda: AlarmSpec("a", "x", DET, lead=-1), lambda: AlarmRun("r", {}, 1.5),
                                  lambda: calibrate([_run("p", 1, 1.0, collapse=5)], "x", DET)])
def test_bad_input_is_a_one_line_error(make):
    with pytest.raises(ValueError) as e:
        make()
    assert "\n" not in str(e.value)
