"""Machinery of experiment 3 (bandits.experiments.success_rate), each against an independent route: the
checkpoints against a replay of the run, the sharp threshold against Phi itself, the c_G identity between the
two directions' thresholds, the bound step's outcome against a rerun, the distinct-state count and the
violation share against loops. Its claims per block are checked by the experiment contract
(tests/test_bandits_experiments.py). No claim is required to hold."""

from __future__ import annotations


import numpy as np
import pandas as pd
import pytest

import gapdyn
from bandits.experiments import success_rate as sr
from tests.conftest import experiment_test_config

CFG = experiment_test_config(sr)  # its claims and blocks: tests/test_bandits_experiments.py


@pytest.fixture(scope="module")
def test_run(experiment_runs):
    return experiment_runs["success_rate"][1]


def test_grpo_threshold_is_the_gaps_over_cG(test_run):
    """Rows of the two sharp thresholds at one checkpoint: eta_grpo c_G(J) = eta_gap (gapdyn.expected_scalar)."""
    r = test_run.results
    g = r[(r["measure"] == "sharp_grpo") & (r["status"] == "ok")]
    h = r[(r["measure"] == "sharp_gap") & (r["status"] == "ok")]
    both = g.merge(h, on=["block", "setting", "instance", "level"], suffixes=("_grpo", "_gap"))
    assert len(both) > 0
    c = gapdyn.expected_scalar("grpo", both["J_grpo"].to_numpy(), CFG.group_size)
    np.testing.assert_allclose(both["eta_local_grpo"] * c, both["eta_local_gap"], rtol=1e-5)


@pytest.mark.parametrize("setting", sr.SETTINGS)
def test_checkpoints_are_first_crossings_of_a_replay(setting):
    prob = sr._Problem(setting, 1, {"group_size": 8, "J_start": 0.05, "rho": 0.5})
    eta = 1.0
    cps = sr.checkpoints(prob, eta, (0.1, 0.3, 0.5), 200)
    assert cps
    for level, k, theta in cps:
        J, _, _ = prob.state(theta)
        assert J >= level
        before = prob.run(prob.theta0, eta, k - 1)[1] if k > 1 else prob.theta0
        assert prob.state(before)[0] < level
        # the replay in one piece reaches the same parameters
        np.testing.assert_allclose(prob.run(prob.theta0, eta, k)[1], theta, rtol=1e-10, atol=1e-12)


def test_sharp_threshold_is_where_phi_returns(test_run):
    """At a finite threshold, Phi rises just below it and does not just above it (Phi evaluated directly)."""
    r = test_run.results
    row = r[(r["setting"] == "T=8") & (r["measure"] == "sharp_gap") & (r["status"] == "ok")].iloc[0]
    prob = sr._Problem("T=8", int(row["instance"]), {"group_size": 8, "J_start": CFG.J_start, "rho": CFG.rho})
    eta_run = float(row["eta_run"])
    theta = [t for lv, _, t in sr.checkpoints(prob, eta_run, CFG.levels, CFG.max_steps) if lv == row["level"]][0]
    gap = prob.state(theta)[2]
    phi0, eta = prob.logodds(theta), float(row["eta_local"])
    assert prob.logodds(theta + 0.999 * eta * gap) > phi0
    assert prob.logodds(theta + 1.001 * eta * gap) <= phi0


def test_run_cell_is_deterministic():
    cell = sr.cells(CFG, (2,))[1]
    pd.testing.assert_frame_equal(sr.run_cell(**cell), sr.run_cell(**cell))


def test_bound_step_and_its_outcome_against_a_rerun(test_run):
    """eta_bound = C_FRAC eta*(theta0) (1 - J)/(1 - J(theta0)) at a checkpoint, and the restarted run at it has
    the recorded outcome (replayed from theta0 through gapdyn.bandit_outcome)."""
    r = test_run.results
    row = r[(r["setting"] == "T=8") & (r["measure"] == sr.BOUND_MEASURE) & (r["block"] == "discovery")].iloc[-1]
    prob = sr._Problem("T=8", int(row["instance"]), {"group_size": 8, "J_start": CFG.J_start, "rho": CFG.rho})
    _, Jb0, _ = prob.state(prob.theta0)
    assert row["eta_bound"] == pytest.approx(sr.C_FRAC * row["anchor"] * row["one_minus_J"] / Jb0, rel=1e-12)
    theta = [t for lv, _, t in sr.checkpoints(prob, float(row["eta_run"]), CFG.levels, CFG.max_steps)
             if lv == row["level"]][0]
    out = gapdyn.bandit_outcome(prob.run_stats(theta, np.array([row["eta_bound"]]), CFG.horizon))[0]
    assert out == row["outcome"]


def _levels_on_one_step() -> pd.DataFrame:
    """One trajectory whose levels 0.1-0.5 are all first reached at step 3, 0.6 at step 5, 0.7 and 0.8 at 9."""
    steps = {0.1: 3, 0.2: 3, 0.3: 3, 0.4: 3, 0.5: 3, 0.6: 5, 0.7: 9, 0.8: 9}
    return pd.DataFrame([{"instance": 0, "level": lv, "step": k, "measure": sr.BOUND_MEASURE, "status": "ok",
                          "violated": k == 5} for lv, k in steps.items()])


def test_levels_on_one_step_are_one_state():
    rows = _levels_on_one_step()
    st = sr.distinct_states(rows)
    assert list(st["step"]) == [3, 5, 9] and list(st["level"]) == [0.1, 0.6, 0.7]
    assert sr.violation_share(rows) == (1, 3)
    two = pd.concat([rows.assign(setting="T=1"), rows.assign(setting="T=8")])  # same steps, different problems
    assert sr.violation_share(two) == (2, 6)


def test_violation_share_against_a_loop(rng):
    rows = []
    for inst in range(6):
        steps = np.sort(rng.integers(1, 8, size=7))  # repeated steps: levels crossed together
        bad = {int(k): bool(rng.random() < 0.3) for k in np.unique(steps)}
        rows += [{"instance": inst, "level": 0.1 * (j + 1), "step": int(k), "measure": sr.BOUND_MEASURE,
                  "status": "ok", "violated": bad[int(k)]} for j, k in enumerate(steps)]
    rows.append({"instance": 9, "level": np.nan, "step": -1, "measure": "", "status": "no level reached",
                 "violated": False})
    df = pd.DataFrame(rows).sample(frac=1.0, random_state=0)
    seen, k = set(), 0
    for r in df.itertuples():
        if r.measure == sr.BOUND_MEASURE and r.step >= 0 and (r.instance, r.step) not in seen:
            seen.add((r.instance, r.step))
            k += int(r.violated)
    assert sr.violation_share(df) == (k, len(seen))


@pytest.mark.parametrize("status, eta_star, outcome, expected", [
    ("found", 2.0, "converged", False),  # the smallest collapsing eta lies beyond the bound step
    ("found", 0.5, "converged", True),  # a step inside the condition collapses, the bound step itself does not
    ("none_in_range", np.nan, "collapsed", True),  # the run at the bound step collapses: an island the scan missed
    ("none_in_range", np.nan, "undecided", False),
    ("collapsed_at_lo", 0.01, "converged", True),  # eta_lo <= eta_bound collapses
])
def test_is_violation(status, eta_star, outcome, expected):
    assert sr.is_violation(status, eta_star, 1.0, outcome, 0.01) is expected


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: sr.Config(mode="x"), "mode"),
        (lambda: sr.Config(levels=(0.5, 0.3, 0.9)), "levels"),
        (lambda: sr.Config(levels=(0.2, 0.5)), "levels"),
        (lambda: sr.Config(J_start=0.5, levels=(0.3, 0.6, 0.9)), "levels"),
        (lambda: sr.Config(eta_frac=1.5), "eta_frac"),
        (lambda: sr._Problem("T=3", 0, {"group_size": 8, "J_start": 0.05, "rho": 0.5}), "setting"),
    ],
)
def test_bad_input(make, match):
    with pytest.raises(ValueError, match=match):
        make()
