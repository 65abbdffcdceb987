"""Machinery of the threshold experiment and of bandits.experiments.mechanisms, each against an independent route:
the eta* identity of exact Dr. GRPO vs REINFORCE reproduced by the estimator, stored rows rebuilding the
EtaStar of a direct search, the trap limit against the engine's huge step, the two-step lookahead against a
loop over gapdyn's closed forms, matched step lengths against the engine's first step."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest

import gapdyn
from bandits.engine import Dynamics, simulate
from bandits.experiments import mechanisms as mech
from bandits.experiments import threshold as thr

CFG = thr.Config.test()


@pytest.fixture(scope="module")
def exact_rows():
    """Exact cells at theta0 = 0 of REINFORCE and Dr. GRPO for the test-mode instances."""
    frames = []
    for cell in thr.cells(CFG, CFG.instances):
        if cell["kind"] == "exact" and cell["start"] == 0 and cell["method"] in ("reinforce", "dr_grpo"):
            df = thr.run_cell(**cell)
            frames.append(df.assign(**{k: v for k, v in cell.items() if k != "kind"}, kind="exact"))
    return pd.concat(frames, ignore_index=True)


@pytest.mark.parametrize("instance", CFG.instances)
def test_eta_star_estimator_reproduces_the_dr_grpo_identity(exact_rows, instance):
    """Exact Dr. GRPO at eta is REINFORCE at (1 - 1/G) eta: the ratio of the two eta* is (1 - 1/G)^-1."""
    dr, rf = (thr.eta_star_of(exact_rows, instance, m) for m in ("dr_grpo", "reinforce"))
    assert dr.status == rf.status
    if rf.status == "found":
        chk = gapdyn.check_eta_star_ratio(dr, rf, (1 - 1 / CFG.group_size) ** -1)
        assert chk.holds, chk.message
        assert abs(chk.ratio / chk.expected - 1.0) <= thr.CRITERIA["identity_dr_reinforce"].tol


def test_stored_rows_rebuild_the_direct_search(exact_rows):
    b = mech.instance_bandit(CFG.instances[0])
    dyn = Dynamics(method="reinforce", gradient="exact", group_size=CFG.group_size, steps=CFG.steps,
                   record_every=CFG.steps)
    direct, _, _ = mech.search_eta_star(b, dyn, b.zeros(), eta_lo=CFG.eta_lo, eta_hi=CFG.eta_hi,
                                        max_ratio=CFG.max_ratio, rtol=CFG.rtol)
    rebuilt = thr.eta_star_of(exact_rows, CFG.instances[0], "reinforce")
    for key in ("status", "bracket", "dip_status", "bracket_dip", "islands", "collapse_per_decade", "n_evaluations"):
        assert getattr(rebuilt, key) == getattr(direct, key), key  # floats round-trip JSON exactly
    assert rebuilt.eta_star_loose == pytest.approx(direct.eta_star_loose, nan_ok=True)
    assert rebuilt.dip_recover_share == pytest.approx(direct.dip_recover_share, nan_ok=True)
    for key in ("eta_star", "eta_safe", "safe_resolution", "eta_50", "reconverge_share"):
        assert getattr(rebuilt, key) == pytest.approx(getattr(direct, key), nan_ok=True), key
    assert rebuilt.eta_50_status == direct.eta_50_status
    np.testing.assert_array_equal(rebuilt.base, direct.base)
    np.testing.assert_array_equal(rebuilt.grid, direct.grid)
    np.testing.assert_array_equal(rebuilt.J_min, direct.J_min)
    np.testing.assert_array_equal(rebuilt.J_tail_max, direct.J_tail_max)
    np.testing.assert_array_equal(rebuilt.outcomes, direct.outcomes)


def test_search_labels_every_run_by_its_outcome_over_the_last_quarter():
    """Every grid eta's outcome agrees with the full trajectory of the same run (record_every = 1, a loop)."""
    b = mech.instance_bandit(CFG.instances[0])
    dyn = Dynamics(method="grpo", gradient="exact", group_size=CFG.group_size, steps=CFG.steps, record_every=CFG.steps)
    res, _, _ = mech.search_eta_star(b, dyn, b.zeros(), eta_lo=CFG.eta_lo, eta_hi=CFG.eta_hi, max_ratio=1.05,
                                     rtol=1e-2)
    full = simulate(b, Dynamics(method="grpo", gradient="exact", group_size=CFG.group_size, steps=CFG.steps,
                                record_every=1), eta=res.grid)
    J = np.concatenate([full.J[:, :, 0], full.J_final[:, :1]], axis=1)  # states 0..K
    K = CFG.steps
    for i in range(res.grid.size):
        tail = J[i, K - K // 4:]
        want = ("collapsed" if np.all(tail < 1e-3) else "dipped" if np.any(J[i] < 1e-3)
                else "converged" if np.all(tail > 0.99) else "undecided")
        assert res.outcomes[i] == want, (i, res.grid[i])
    collapsed = res.grid[res.outcomes == "collapsed"]
    if collapsed.size:
        assert res.bracket[1] <= collapsed[0] and res.bracket_dip[1] <= res.bracket[1]


@pytest.mark.parametrize("instance, start", [(i, s) for i in range(6) for s in (0, 1)])
def test_trap_margin_is_the_huge_step_limit(instance, start):
    """One exact step of a huge eta puts the mass on argmax_a phi_a . Gap(theta0): J -> 0 in a trap, else -> 1."""
    b = mech.instance_bandit(instance)
    th = mech.start_theta(b, start, scale=0.2)
    margin = mech.trap_margin(b, th)
    tr = simulate(b, Dynamics(method="reinforce", gradient="exact", steps=1), eta=[1e7], theta0=th)
    assert tr.J_final[0, 0] == pytest.approx(0.0 if margin > 0 else 1.0, abs=1e-6)


def _two_steps_by_hand(b, method, G, theta0, eta):
    """J at theta2 (the last quarter of a two-step horizon) from gapdyn's closed-form E[w] (python loop)."""
    phi, r = b.features[0], b.rewards[0]
    th, Js = theta0.reshape(-1).copy(), []
    for _ in range(2):
        p = gapdyn.loglinear_probs(phi, th)
        Js.append(float(gapdyn.success_rate(p, r)))
        th = th + eta * gapdyn.expected_direction(method, p, r, gapdyn.loglinear_scores(phi, th), group_size=G)
    Js.append(float(gapdyn.success_rate(gapdyn.loglinear_probs(phi, th), r)))
    return Js[-1]


@pytest.mark.parametrize("instance, method", [(0, "grpo"), (2, "grpo"), (5, "reinforce")])
def test_lookahead_matches_a_loop_over_gapdyn(instance, method):
    b = mech.instance_bandit(instance)
    grid = gapdyn.eta_grid(1.0, 300.0, max_ratio=1.05)
    got = mech.lookahead_eta(b, method, 8, b.zeros(), grid)["pred_2col"]
    col = np.array([_two_steps_by_hand(b, method, 8, b.zeros(), e) < gapdyn.COLLAPSE_J for e in grid])
    want = float(grid[np.argmax(col)]) if col.any() else math.nan
    assert got == pytest.approx(want, nan_ok=True)


def test_transition_width_and_reconvergence_on_a_known_collapse_set():
    """Runs end at J = 0 on [10, 20] and on [50, 60], at J = 1 elsewhere, and at J = 0.5 (undecided) on
    [70, 80]: eta* = 10, two islands, known shares above eta* that end converged."""
    def J_end(etas):
        e = np.asarray(etas)
        out = np.where(((e >= 10) & (e <= 20)) | ((e >= 50) & (e <= 60)), 0.0, 1.0)
        return np.where((e >= 70) & (e <= 80), 0.5, out)

    res = gapdyn.find_eta_star(lambda e: gapdyn.RunStats.constant(J_end(e)), 1.0, 100.0)
    assert res.n_islands == 2 and res.eta_star == pytest.approx(10.0, rel=2e-3)
    etas = res.grid
    width = mech.transition_width(res, etas, J_end(etas))
    assert width == pytest.approx(res.eta_star / etas[etas <= res.bracket[0]].max())
    base = gapdyn.eta_grid(1.0, 100.0)  # the share is over the base grid only, not the denser fine scans
    want = float(np.mean(J_end(base[base > res.bracket[1]]) == 1.0))
    merged = float(np.mean(J_end(etas[etas > res.bracket[1]]) == 1.0))
    assert abs(merged - want) > 0.1  # the fine scans near eta* weight its neighbourhood: the two shares differ
    assert res.reconverge_share == pytest.approx(want)
    assert mech.reconverge_share(res) == pytest.approx(want)
    # an EtaStar rebuilt from rows stored without the base-grid mark: the base grid is rebuilt from the scan
    assert mech.reconverge_share(dataclasses.replace(res, base=None)) == pytest.approx(want)


def test_restricted_speed_against_a_loop_over_pairs():
    """Restricted mean steps to 0.9 (never reached: the horizon) per instance, controller over constant, against a
    plain loop; with differing_only, pairs whose two runs agree on every summary column are left out."""
    H = 50
    rng = np.random.default_rng(4)
    rows = []
    for inst in (3, 8):
        for eta in (1.0, 10.0):
            for seed in range(3):
                rows.append({"instance": inst, "eta": eta, "seed": seed, "J_final": rng.random(),
                             "J_min": rng.random(), "steps_to_09": float(rng.choice([5, 12, 40, np.inf])),
                             "collapse_step": np.inf})
    const = pd.DataFrame(rows)
    ctl = const.copy()
    change = np.arange(len(ctl)) % 3 != 0  # every third pair: the controller's run equals the constant step's
    ctl.loc[change, "steps_to_09"] = np.where(np.arange(change.sum()) % 2, 7.0, np.inf)
    ctl.loc[change, "J_final"] += 0.01
    for differing in (False, True):
        got, n = thr.restricted_speed(const, ctl, H, differing_only=differing)
        want, used = {}, 0
        inst_of, t_c, t_x = (const["instance"].tolist(), const["steps_to_09"].tolist(),
                             ctl["steps_to_09"].tolist())
        for inst in (3, 8):
            c, x = [], []
            for i in range(len(inst_of)):
                if inst_of[i] != inst or (differing and not change[i]):
                    continue
                c.append(min(t_c[i], H))
                x.append(min(t_x[i], H))
            used += len(c)
            want[inst] = math.log10(sum(x) / sum(c))
        assert n == used and set(got.index) == set(want)
        for inst, v in want.items():
            assert got[inst] == pytest.approx(v)


def test_start_theta_is_seeded_and_validated():
    b = mech.instance_bandit(3)
    np.testing.assert_array_equal(mech.start_theta(b, 0, scale=0.2), b.zeros())
    np.testing.assert_array_equal(mech.start_theta(b, 2, scale=0.2), mech.start_theta(b, 2, scale=0.2))
    assert not np.array_equal(mech.start_theta(b, 1, scale=0.2), mech.start_theta(b, 2, scale=0.2))
    with pytest.raises(ValueError, match="start"):
        mech.start_theta(b, -1, scale=0.2)


def test_collapse_curve_counts_runs():
    rows = pd.DataFrame({"phase": "sampled", "schedule": "constant", "eta": [1.0, 1.0, 2.0, 2.0, 2.0],
                         "collapsed": [True, False, True, True, False]})
    cur = thr.collapse_curve(rows)
    ref = gapdyn.wilson_interval(2, 3)
    assert list(cur["n"]) == [2, 3] and cur["hi"].iloc[1] == pytest.approx(ref.hi)


def test_config_validation():
    with pytest.raises(ValueError, match="mode"):
        thr.Config(mode="fast")
    with pytest.raises(ValueError, match="disjoint"):
        thr.Config(instances=(0, 1000), confirmation=(1000,))
