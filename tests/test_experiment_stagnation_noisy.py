"""The noisy stagnation search: the realisable instance (J* = 1 checked by a linear programme and by J along
phi_0), the run labels on constructed cases (a run that cannot move plateaus; a run started at the optimum does
not), the kernel's J_max against the recorded trajectory, and the analysis and the setting rule on constructed
rows (estimates against a loop written here; a collapsed run makes the comparison unmeasured)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.optimize import linprog

import gapdyn
from bandits.experiments import stagnation_noisy as sn
from bandits.sequence import SequenceDynamics, place_for_success_rate, simulate


def _in_hull(point, others) -> bool:
    n = others.shape[0]
    res = linprog(np.zeros(n), A_eq=np.vstack([others.T, np.ones((1, n))]), b_eq=np.append(point, 1.0),
                  bounds=(0, None), method="highs")
    return res.status == 0


@pytest.mark.parametrize("instance", [0, 3, 1001])
def test_the_correct_token_is_a_hull_vertex_so_J_reaches_one(instance):
    env = sn.realisable_bandit(instance, 4)
    phi = env.features
    assert env.correct == (0,) and not _in_hull(phi[0], phi[1:])
    u = phi[0] / np.linalg.norm(phi[0])
    Phi = env.log_odds(np.outer([1.0, 10.0, 60.0], u))  # logit J: J itself rounds to 1
    assert np.all(np.diff(Phi) > 0) and Phi[-1] > 20


def _cell(**kw):
    base = dict(instance=0, method="grpo", T=2, etas=[1e-9], streams=2, steps=40, group_size=8, J0=0.5, V=10, d=4)
    return sn.run_cell(**{**base, **kw})


def test_a_run_that_cannot_move_is_a_stall_and_one_at_the_optimum_is_not():
    frozen = _cell()  # eta = 1e-9: J stays at J0 = 0.5, a plateau 0.5 below J* = 1 by construction
    assert (frozen["outcome"] == "stalled").all()
    np.testing.assert_allclose(frozen["stall_gap"], 0.5, atol=1e-6)
    top = _cell(J0=1 - 1e-6, etas=[0.1])
    assert (top["outcome"] == "at_optimum").all() and (top["stall_gap"] == 0).all()


def test_J_max_is_the_recorded_last_quarter_maximum():
    steps, etas = 60, [0.3, 3.0]
    rows = _cell(method="reinforce", etas=etas, steps=steps)
    env = sn.realisable_bandit(0, 2)
    th0 = place_for_success_rate(env, env.features[0] / np.linalg.norm(env.features[0]), 0.5)
    for _, r in rows.iterrows():
        tr = simulate(env, SequenceDynamics(method="reinforce", gradient="sampled", steps=steps),
                      eta=r["eta"], seed=int(r["seed"]), theta0=th0, backend="numpy")
        J = np.append(tr.J[0], tr.J_final[0])  # states 0..steps
        assert r["J_max"] == pytest.approx(J[gapdyn.tail_start(steps):].max(), rel=1e-10)
        assert r["J_pre_max"] == pytest.approx(J[:gapdyn.tail_start(steps)].max(), rel=1e-10)


CMP = ("grpo", 2) if sn.CHOSEN[:2] != ("grpo", 2) else ("reinforce", 4)
"""The (method, T) of the constructed comparison rows: not the chosen setting's."""


def _rows(n=40, seed=0, *, collapse_one=False):
    """Constructed rows: CMP at ETA_LO and ETA_HI (1 - J_max 0.01-0.03 larger at the larger eta), two streams per instance;
    the chosen setting, one stream stalled per instance."""
    rng = np.random.default_rng(seed)
    m, T, eta = sn.CHOSEN
    out = []
    for i in range(n):
        for e, shift in ((sn.ETA_LO, 0.0), (sn.ETA_HI, 0.02)):
            for s in range(2):
                g = 0.05 + shift + 0.01 * rng.random()
                out.append(dict(instance=i, method=CMP[0], T=CMP[1], eta=e, stream=s, gap=g, stall_gap=0.0,
                                outcome="improving", collapsed=False, dipped=False))
        for s in range(2):
            g = 0.01 + 0.02 * rng.random()
            out.append(dict(instance=i, method=m, T=T, eta=eta, stream=s, gap=g, stall_gap=g if s == 0 else 0.0,
                            outcome="stalled" if s == 0 else "improving", collapsed=False, dipped=False))
    d = pd.DataFrame(out)
    if collapse_one:
        d.loc[d.index[0], "collapsed"] = True
    return d


def test_analysis_reads_the_stall_gap_and_the_paired_difference(mean_interval_valid_from_40):
    d = _rows()
    claims = {c.id: c for c in sn.analyse(d, sn.Config(), block="confirmation")}
    m, T, eta = sn.CHOSEN
    sel = d[(d["method"] == m) & (d["T"] == T) & np.isclose(d["eta"], eta)]
    want = np.mean([np.mean(sel.loc[sel["instance"] == i, "stall_gap"]) for i in range(40)])
    c = claims[sn.stall_id(m, T, eta)]
    assert c.measured and c.estimate == pytest.approx(want, rel=1e-12) and c.interval[0] <= want <= c.interval[1]
    pair = d[(d["method"] == CMP[0]) & (d["T"] == CMP[1])]
    diffs = [pair.loc[(pair["instance"] == i) & np.isclose(pair["eta"], sn.ETA_HI), "gap"].mean()
             - pair.loc[(pair["instance"] == i) & np.isclose(pair["eta"], sn.ETA_LO), "gap"].mean()
             for i in range(40)]
    cmp_ = claims[sn.compare_id(*CMP)]
    assert cmp_.measured and cmp_.estimate == pytest.approx(np.mean(diffs), rel=1e-12)
    assert cmp_.p_value is not None and cmp_.verdict == "holds"  # every planted difference is +0.01..0.03
    assert not claims[sn.compare_id("grpo", 8)].measured  # T = 8 is not in these rows


def test_a_collapsed_run_leaves_the_comparison_unmeasured():
    d = _rows(collapse_one=True)
    c = {c.id: c for c in sn.analyse(d, sn.Config())}[sn.compare_id(*CMP)]
    assert not c.measured and "premise not met: 1 runs" in c.reason


def test_the_setting_rule_picks_the_planted_stall_and_breaks_ties_as_stated():
    d = _rows()
    planted = d.assign(method="grpo", T=8, eta=3.0, stall_gap=0.4, outcome="stalled", stream=d["stream"] + 10)
    assert sn.choose_setting(pd.concat([d, planted])) == ("grpo", 8, 3.0)
    flat = planted.assign(stall_gap=0.0, outcome="improving")
    a, b = flat.assign(gap=0.2, eta=1.0), flat.assign(gap=0.3, eta=0.3)
    assert sn.choose_setting(pd.concat([a, b])) == ("grpo", 8, 0.3)  # no stall: the largest 1 - J_max
    with pytest.raises(ValueError, match="no runs"):
        sn.choose_setting(d.iloc[:0])


def test_the_chosen_setting_is_in_the_frozen_ids_and_the_full_grid():
    m, T, eta = sn.CHOSEN
    assert sn.stall_id(m, T, eta) in sn.SPECS and sn.SPECS[sn.stall_id(m, T, eta)].form == "existence"
    full = sn.Config.full()
    assert m in full.methods and T in full.lengths and eta in full.etas
    assert sn.ETA_LO in full.etas and sn.ETA_HI in full.etas
    assert not set(full.instances) & set(full.confirmation)
    assert sn.EXPERIMENT.criteria_hash == gapdyn.criteria_hash(sn.CRITERIA)
