"""The time-matched early-warning benchmark (llm_probe.experiments.early_warning) on constructed step frames: each
number against an independent route (a loop over matched pairs, a closed form, a known construction)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import kstest

import gapdyn
from gapdyn.evidence.claims import criteria_hash
from llm_probe.experiments import early_warning as ew

FAST = dict(n_permutations=199, n_boot=199)
SIM0, SIM1 = ew.Statistic("sim0", 1, +1, "synthetic"), ew.Statistic("sim1", 1, +1, "synthetic")


def _frame(runs, steps=60, every=1):
    """runs: (lr, onset or None, f(step) -> value of column 'x') per run; logged every ``every`` steps."""
    rows = []
    for i, (lr, c, f) in enumerate(runs):
        for k in range(0, steps, every):
            rows.append({"run": i, "lr": lr, "step": k, "collapsed": c is not None, "collapse_step": -1 if c is None
                         else c, "outcome": "healthy" if c is None else "collapsed", "x": f(k)})
    return pd.DataFrame(rows)


X = ew.Statistic("x", 1, +1, "constructed")


def _loop_auc(df, stat, lead):
    """The matched AUC by a plain loop: positive i at c_i - lead against each negative of its lr at that step."""
    num = den = 0.0
    for _, g in df.groupby("lr"):
        runs = {}
        for r, d in g.groupby("run"):
            d = d.sort_values("step")
            v = d[stat.column].to_numpy(dtype=float)
            runs[r] = (bool(d.collapsed.iloc[0]), int(d.collapse_step.iloc[0]), d.step.to_numpy()[np.isfinite(v)],
                       v[np.isfinite(v)])

        def at(r, t):
            vals = runs[r][3][runs[r][2] <= t]
            return stat.direction * vals[-stat.window:].mean() if t >= 0 and vals.size else math.nan

        for i, (collapsed, c, _, _) in runs.items():
            if not collapsed:
                continue
            for j in runs:
                if runs[j][0]:
                    continue
                a, b = at(i, c - lead), at(j, c - lead)
                if np.isfinite(a) and np.isfinite(b):
                    num, den = num + (a > b) + 0.5 * (a == b), den + 1
    return num / den if den else math.nan


def test_a_drop_k_steps_before_the_onset_is_seen_at_leads_below_k_only():
    """x = 1 + noise, and in positives 0 + noise from step c - k + 1 on (low warns): AUC = 1 exactly at leads < k;
    at leads >= k both sides are the same noise (AUC near 1/2, interval containing it, p not small); every value
    equals the loop over matched pairs."""
    rng = np.random.default_rng(3)
    k = 8
    noise = {i: rng.uniform(-0.1, 0.1, 80) for i in range(60)}
    runs = [(1e-3, 40 + i % 10, lambda t, i=i: (0.0 if t > 40 + i % 10 - k else 1.0) + noise[i][t]) for i in range(30)]
    runs += [(1e-3, None, lambda t, i=i: 1.0 + noise[i][t]) for i in range(30, 60)]
    df = _frame(runs, steps=80)
    low = ew.Statistic("x", 1, -1, "constructed")
    for lead in (0, 3, k - 1):
        e = ew.matched_auc(df, low, lead, **FAST)
        assert e.estimate == 1.0 and e.p == pytest.approx(1 / 200) and e.n_pos == 30 and e.n_neg == 30
    for lead in (k, k + 5, 20):
        e = ew.matched_auc(df, low, lead, **FAST)
        assert e.estimate == pytest.approx(_loop_auc(df, low, lead))
        assert abs(e.estimate - 0.5) < 0.1 and e.lo < 0.5 < e.hi and e.p > 0.05


def test_time_matching_uses_the_same_step_and_differs_from_pooled_median_scoring():
    """Positives constant 0.5 (onsets 20, 80, 81); negatives 1 before step 50, 0 after. Matched: the onset-20
    positive loses to every negative, the others win: AUC = 2/3. Scoring the negatives at the median positive
    time (80, the older rule) gives 1."""
    runs = [(1e-3, c, lambda t: 0.5) for c in (20, 80, 81)] + [(1e-3, None, lambda t: 1.0 if t < 50 else 0.0)] * 4
    df = _frame(runs, steps=100)
    e = ew.matched_auc(df, X, 0, **FAST)
    assert e.estimate == pytest.approx(2 / 3) == pytest.approx(_loop_auc(df, X, 0))
    pooled = gapdyn.roc_auc([0.5] * 3, [0.0] * 4)  # negatives at t* = median(20, 80, 81) = 80
    assert pooled.estimate == 1.0


def test_the_last_logged_value_at_or_before_the_step_and_no_look_ahead():
    """Logged every 5 steps with a window-2 mean: score_at equals a loop over the logged values at steps <= t; a
    value logged after t never enters (the score at t is unchanged when later values change)."""
    st, sc = ew.statistic_series(pd.DataFrame({"step": np.arange(30), "x": [float(k) if k % 5 == 0 else np.nan
                                                                             for k in range(30)]}),
                                 ew.Statistic("x", 2, -1, "constructed"))
    assert list(st) == [0, 5, 10, 15, 20, 25]
    for t in range(-2, 32):
        logged = [k for k in range(0, 30, 5) if k <= t]
        want = -np.mean(logged[-2:]) if t >= 0 and logged else np.nan
        np.testing.assert_equal(ew.score_at(st, sc, t), want)
    runs = [(1e-3, 30, lambda t: float(t > 35)), (1e-3, None, lambda t: 0.0)] * 3
    a = ew.matched_auc(_frame(runs), X, 0, **FAST).estimate
    assert a == 0.5 and ew.matched_auc(_frame(runs), X, 0, **FAST).estimate == _loop_auc(_frame(runs), X, 0)


def test_negatives_never_come_from_another_lr():
    """x = 1 in every run at lr 1e-3 (4 positives, 4 negatives), 0 at lr 3e-4 (6 negatives, no positive): pooling
    negatives over lrs would give (6 + 4/2) / 10 = 0.8; within lr all ties: AUC = 1/2, from the 4 x 4 pairs."""
    runs = [(1e-3, 20 if i < 4 else None, lambda t: 1.0) for i in range(8)] + [(3e-4, None, lambda t: 0.0)] * 6
    df = _frame(runs, steps=30)
    e = ew.matched_auc(df, X, 5, **FAST)
    assert e.estimate == 0.5 and e.n_pairs == 16 and e.n_neg == 4
    assert ew.matched_auc(df, X, 5, lr=3e-4, **FAST) is None
    tab = ew.warning_table(df.assign(reward=0.5), **FAST)
    assert set(tab.lr) == {"all", 1e-3, 3e-4}


def test_permutation_p_is_uniform_under_the_null_and_small_under_a_strong_effect():
    """Null DGP (no effect, two lrs of 10 runs): the label-permutation p of AUC > 1/2 and the paired swap p of
    AUC_0 > AUC_1 (equal effects) are uniform (KS); a strong effect gives the smallest p."""
    p_auc, p_diff = [], []
    for s in range(30):
        df = ew.simulate_steps(np.random.default_rng(s), ((4, 6), (5, 5)), deltas=(0.0, 0.0), steps=40)
        p_auc.append(ew.matched_auc(df, SIM0, 5, n_permutations=99, n_boot=1).p)
        df1 = ew.simulate_steps(np.random.default_rng(100 + s), ((4, 6), (5, 5)), deltas=(1.0, 1.0), steps=40)
        p_diff.append(ew.matched_auc(df1, SIM0, 5, versus=SIM1, n_permutations=99, n_boot=1).p)
    assert kstest(p_auc, "uniform").pvalue > 0.01 and kstest(p_diff, "uniform").pvalue > 0.01
    strong = ew.simulate_steps(np.random.default_rng(7), ((10, 10), (10, 10)), deltas=(4.0, 0.0), steps=40)
    assert ew.matched_auc(strong, SIM0, 5, **FAST).p == pytest.approx(1 / 200)
    d = ew.matched_auc(strong, SIM0, 5, versus=SIM1, **FAST)
    assert d.estimate > 0.3 and d.p == pytest.approx(1 / 200) and d.p_perm_labels == pytest.approx(1 / 200)


def test_the_vectorised_permutations_and_bootstrap_match_a_loop():
    """The permuted sums of one permutation and the bootstrap sums of one resample, by a loop over runs."""
    rng = np.random.default_rng(0)
    S = rng.normal(size=(9, 4))
    S[2, 1] = np.nan
    W, V = ew._kernel(S)
    perms = ew.label_permutations(9, 30, rng)
    num, den = ew._perm_sums(W, V, 4, perms)
    for b, p in enumerate(perms):
        pairs = [(S[p[u], u], S[j, u]) for u in range(4) for j in p[4:] if np.isfinite(S[p[u], u] + S[j, u])]
        assert num[b] == pytest.approx(sum((a > c) + 0.5 * (a == c) for a, c in pairs)) and den[b] == len(pairs)
    u = np.arange(4)
    P, Q = W[u, u, 4:].astype(float), V[u, u, 4:].astype(float)
    bn, bd = ew._boot_sums(P, Q, 4, 5, np.random.default_rng(1), 3)
    r = np.random.default_rng(1)  # the same draws in the same order: positives' counts, then negatives'
    a0, b0 = r.multinomial(4, np.full(4, 0.25), size=3), r.multinomial(5, np.full(5, 0.2), size=3)
    for b in range(3):
        want = sum(a0[b, i] * b0[b, j] * P[i, j] for i in range(4) for j in range(5))
        assert bn[b] == pytest.approx(want) and bd[b] == pytest.approx(a0[b] @ Q @ b0[b])


def test_lead_times_are_time_matched_zero_false_alarm_warnings():
    """Positives jump to 1 at c - 6 (c = 30 + i) and are 0.5 at steps 2-4 (above the negatives then, a false
    start); negatives stay at 0 except one that is 2 at steps < 10 and one at 1.5 from step 29: the warning that
    lasts to the onset starts at c - 6 (lead 6) for c = 30, and none lasts for the two whose onset is after 29."""
    runs = [(1e-3, 28 + i, lambda t, i=i: 1.0 if t >= 22 + i else 0.5 if 2 <= t <= 4 else 0.0) for i in range(3)]
    runs += [(1e-3, None, lambda t: 0.0), (1e-3, None, lambda t: 2.0 if t < 10 else 0.0),
             (1e-3, None, lambda t: 1.5 if t >= 29 else 0.0)]
    leads = ew.lead_times(_frame(runs), X)["leads"]
    assert leads[0] == 6.0 and np.isnan(leads[1]) and np.isnan(leads[2])


def test_the_table_on_a_window_5_statistic_that_rises_12_steps_ahead():
    """curv_gap (window 5, high warns) jumps -0.1 -> 1 at c - 12 in positives; negatives stay in +-0.05: on the
    jump step the window mean is >= (0.95 - 4 * 0.15) / 5 = 0.07 > 0.05, above every negative, and never before,
    so AUC = 1 at leads 0, 5, 10, every positive is warned 12 steps ahead (time-matched zero false alarms), and an
    absent column has no score."""
    assert ew.STATISTICS["curv_gap"][1:3] == (5, 1)
    rng = np.random.default_rng(0)
    noise = rng.uniform(-0.05, 0.05, (12, 40))
    runs = [(1e-3, 20 + i, lambda t, i=i: (1.0 if t >= 8 + i else -0.1) + noise[i, t]) for i in range(6)]
    runs += [(1e-3, None, lambda t, i=i: noise[i, t]) for i in range(6, 12)]
    df = _frame(runs, steps=40).rename(columns={"x": "warn/curv_gap"}).assign(reward=0.5)
    tab = ew.warning_table(df, **FAST)
    row = tab[tab.lr == "all"].set_index("statistic").loc["curv_gap"]
    assert (row.auc_L0, row.auc_L5, row.auc_L10) == (1.0, 1.0, 1.0) and row.warned_ge5 == 6 and row.median_lead == 12
    assert ew.lead_times(df, "curv_gap")["leads"] == [12.0] * 6
    assert np.isnan(tab.set_index(["lr", "statistic"]).loc[("all", "cov_logp_adv"), "auc_L5"])
    assert row.vs_reward_L5 == 0.5  # the reward ties everywhere: AUC 1/2


def test_true_matched_auc_and_the_bootstrap_coverage_machinery():
    """The closed form Phi(delta / sqrt(2 (tau^2 + sigma^2))) against a large simulated study's matched AUC; the
    coverage of 30 small simulated studies is a share, near nominal (a broken truth or interval gives ~0)."""
    df = ew.simulate_steps(np.random.default_rng(5), ((100, 100),), deltas=(0.8,), steps=100)
    e = ew.matched_auc(df, SIM0, 10, n_permutations=1, n_boot=1)
    assert e.estimate == pytest.approx(ew.true_matched_auc(0.8), abs=0.03)
    cov = ew.bootstrap_coverage(((10, 10),), n_sets=25, n_boot=200, seed=1)
    assert 0.75 <= cov["coverage_auc"] <= 1 and 0.75 <= cov["coverage_diff"] <= 1
    assert cov["true_diff"] == pytest.approx(ew.true_matched_auc(1.0) - ew.true_matched_auc(0.5))


@pytest.mark.slow
def test_bootstrap_coverage_at_the_study_size():
    """The coverage docs/llm_probe.md reports: 95 % percentile interval at ~100 runs per lr (500 studies)."""
    cov = ew.bootstrap_coverage(((20, 80), (50, 50), (80, 20)), n_sets=500, n_boot=1000)
    assert cov["coverage_auc"] > 0.9 and cov["coverage_diff"] > 0.9


def test_claims_are_frozen_primaries_holm_adjusted_exploratory_unadjusted():
    """SPECS hashed at import; the primaries are PRIMARY vs the reward at lead 10, Holm over them only; the
    exploratory AUC-vs-1/2 rows per statistic, lead and lr keep p_adjusted = p_value."""
    assert ew.CRITERIA_HASH == criteria_hash({k: s.criterion for k, s in ew.SPECS.items()})
    assert {k for k, s in ew.SPECS.items() if s.primary} == {f"llm.warning.{n}_beats_reward" for n in ew.PRIMARY}
    rng = np.random.default_rng(2)
    rows = []
    for i in range(16):
        c = 40 + i if i < 8 else None
        for k in range(60):
            warn = c is not None and k > c - 15
            rows.append({"run": i, "lr": 4e-4, "step": k, "collapsed": c is not None, "collapse_step": c or -1,
                         "outcome": "collapsed" if c else "healthy", "reward": rng.normal(),
                         "frac_reward_zero_std": rng.normal() + 3 * warn, "warn/cov_logp_adv": rng.normal(),
                         "M_pos": rng.normal(), "gap/headroom_lr": rng.normal() - 3 * warn if k % 5 == 0 else np.nan})
    claims = ew.warning_claims(pd.DataFrame(rows), **FAST)
    prim = [c for c in claims if c.primary]
    assert [c.id for c in prim] == [f"llm.warning.{n}_beats_reward" for n in ew.PRIMARY]
    assert [c.p_adjusted for c in prim] == pytest.approx(list(gapdyn.holm_adjust([c.p_value for c in prim])))
    by = {c.id: c for c in claims}
    assert by["llm.warning.frac_reward_zero_std_beats_reward"].verdict == "holds"
    assert by["llm.warning.M_pos_beats_reward"].verdict != "holds"
    expl = [c for c in claims if not c.primary]
    assert len(expl) == len(ew.STATISTICS) * len(ew.LEADS)
    assert all(c.p_adjusted == c.p_value for c in expl if c.measured)
    assert not by["llm.warning.auc_above_chance/curv_gap@L5_lr0.0004"].measured  # column absent
    assert all(c.criteria_hash == ew.CRITERIA_HASH for c in claims)


def test_public_boundaries_reject_bad_arguments():
    df = _frame([(1e-3, 20, lambda t: 1.0), (1e-3, None, lambda t: 0.0)])
    with pytest.raises(ValueError, match="lead"):
        ew.matched_auc(df, X, -1)
    with pytest.raises(ValueError, match="n_permutations"):
        ew.matched_auc(df, X, 0, n_permutations=0)
    with pytest.raises(ValueError, match="name"):
        ew.matched_auc(df, "no such statistic", 0)
