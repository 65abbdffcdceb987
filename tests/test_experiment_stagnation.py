"""The stagnation experiment: contract, blocks, the bracket on J* (exact optimum, Monte Carlo, the lower
estimate) and the controlled-misalignment dynamics against a step written out here."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest

import gapdyn
from bandits.envs import ContextualBandit, make_bandit
from bandits.experiments import load

st = load("stagnation")


@pytest.fixture(scope="module")
def test_run():
    return st.run(st.Config.test(), backend="serial", progress=False)


def test_claims_follow_the_contract(test_run):
    claims = test_run.claims
    assert {c.id for c in claims} == set(st.CRITERIA)
    for c in claims:
        assert math.isfinite(c.estimate) and c.interval[0] <= c.interval[1] and c.n >= 2
        assert c.criteria_hash == gapdyn.criteria_hash(st.CRITERIA) and c.criterion == st.CRITERIA[c.id]
    tested = [c for c in claims if c.criterion.alpha is not None]
    assert tested and all(c.p_adjusted is not None and c.p_adjusted >= c.p_value for c in tested)


def test_plateau_interval_spans_the_bracket(test_run):
    plat = st.plateau_table(test_run.results)
    assert (plat["J_star_lo"] <= plat["J_star_hi"] + 1e-9).all()
    assert (plat["J_final"] <= plat["J_star_hi"] + 1e-9).all()  # no run beats the upper bound
    for s in st.SETTINGS:
        c = next(c for c in test_run.claims if c.id == f"stagnation.plateau.{s}")
        per = plat[plat["setting"] == s].groupby("instance")[["plateau_lo", "plateau_hi"]].mean()
        assert c.estimate == pytest.approx(per["plateau_lo"].mean())
        assert c.interval[0] <= per["plateau_lo"].mean() and c.interval[1] >= per["plateau_hi"].mean()


def test_confirmation_uses_only_its_seeds():
    cfg = dataclasses.replace(st.Config.test(), instances=(0, 1), confirmation=(1000, 1001), single_steps=40,
                              steps=20, starts=0, misalign_steps=10, controller_steps=10)
    res = st.run(cfg, backend="serial", progress=False)
    by_block = res.results.groupby("block")["instance"].unique()
    assert sorted(by_block["discovery"]) == [0, 1] and sorted(by_block["confirmation"]) == [1000, 1001]


def test_run_cell_is_deterministic():
    cfg = dataclasses.replace(st.Config.test(), single_steps=40, steps=20, misalign_steps=10, controller_steps=10)
    for cell in st.cells(cfg, (0,)):
        pd.testing.assert_frame_equal(st.run_cell(**cell), st.run_cell(**cell))


@pytest.mark.parametrize("C", [2, 3, 5])
def test_upper_bound_is_exact_for_a_shared_tabular_softmax(C):
    """One softmax for all contexts: J = sum_a p_a n_a / C, so J* = max_a n_a / C (closed form)."""
    b = st.shared_bandit("tabular_shared", 7, C)
    exact = b.rewards.sum(axis=0).max() / C
    assert st.reachable_upper(b) == pytest.approx(exact, abs=1e-9)
    assert st.reachable_lower(b, starts=2) <= exact + 1e-12


@pytest.mark.parametrize("make", [lambda: st.shared_bandit("unreachable", 3, 1),
                                  lambda: make_bandit(n_contexts=3, shared=True, dim=3, n_arms=12, seed=4),
                                  lambda: make_bandit(n_contexts=1, dim=2, n_arms=30, seed=9)])
def test_upper_bound_dominates_sampled_policies(make):
    """Monte Carlo: J at random theta (several scales) never exceeds the bound, nor does the multi-start."""
    b = make()
    hi = st.reachable_upper(b)
    rng = np.random.default_rng(0)
    Js = [b.success_rate(rng.normal(size=b.zeros().shape) * s).mean() for s in (0.3, 1, 3, 10, 30) for _ in range(200)]
    assert max(Js) <= hi + 1e-9
    assert st.reachable_lower(b, starts=3) <= hi + 1e-9


def test_2d_branch_and_bound_brackets_the_optimum():
    """d = 2, correct arms interior: the bound dominates J on a dense grid and random far points, sits above
    the multi-start estimate and below the LP relaxation; a correct hull vertex gives 1."""
    b = st.shared_bandit("unreachable", 1, 1)
    hi = st.reachable_upper_2d(b)
    g = np.linspace(-6, 6, 301)
    th = np.concatenate([np.stack(np.meshgrid(g, g), axis=-1).reshape(-1, 2),
                         np.random.default_rng(1).normal(size=(2000, 2)) * 30])
    z = th @ b.features[0].T
    e = np.exp(z - z.max(1, keepdims=True))
    Js = (e * b.rewards[0]).sum(1) / e.sum(1)
    assert Js.max() <= hi and st.reachable_lower(b, starts=3) <= hi <= st.reachable_upper(b) + 1e-12
    phi = np.array([[[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0], [0.1, 0.1]]])
    vertex = ContextualBandit(phi, np.array([[1.0, 0.0, 0.0, 0.0, 0.0]]))
    assert st.reachable_upper_2d(vertex) == 1.0


def test_upper_bound_below_one_when_correct_arms_are_interior():
    """A correct arm at the midpoint of two wrong arms: p_c <= (p_1 + p_2) / 2, so J <= 1/3 (and J = 1/3
    at theta = 0)."""
    phi = np.array([[[-1.0], [0.0], [1.0]]])
    b = ContextualBandit(phi, np.array([[0.0, 1.0, 0.0]]))
    assert st.reachable_upper(b) == pytest.approx(1 / 3, abs=1e-9)
    assert st.reachable_lower(b, starts=3) == pytest.approx(1 / 3, abs=1e-6)


def test_misaligned_steps_against_a_hand_written_step():
    b = make_bandit(n_contexts=1, seed=3)
    angles = np.array([0.0, 0.7, np.pi / 2])
    out = st.misaligned_run(b, angles, eta=0.3, steps=3, seed=5)
    z = np.random.default_rng(5).normal(size=b.dim)
    for i, a in enumerate(angles):
        th = np.zeros((1, b.dim))
        M = 0.0
        for k in range(3):
            g = b.gap(th)[0]
            gh = g / np.linalg.norm(g)
            xi = z - (z @ gh) * gh
            xi /= np.linalg.norm(xi)
            w = np.cos(a) * gh + np.sin(a) * xi
            assert np.linalg.norm(w) == pytest.approx(1.0)
            M += 0.3 * max(float(w @ g), 0.0)
            th = th + 0.3 * w
            assert out["M"][i, k + 1] == pytest.approx(M, abs=1e-12)
            assert out["Phi"][i, k + 1] == pytest.approx(b.log_odds(th)[0], rel=1e-12)
    assert np.abs(out["M"][2]).max() < 1e-12  # orthogonal steps: M stays 0
