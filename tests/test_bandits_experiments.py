"""The contextual-bandit experiments (bandits.experiments.{threshold, success_rate, stagnation, logistic,
methods}) in quick mode: the contract, determinism, and the claims whose expected values come from an
independent route (gapdyn's expected scalars, exact optima, the line-search oracle)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from bandits.experiments import load
from bandits.experiments._common import run_cells_serial

MINE = ("threshold", "stagnation", "logistic", "methods")  # success_rate: tests/test_experiment_success_rate.py
HOLDS_OK = ("holds", "does not hold", "n/a", "plateau found", "no plateau", "inconclusive")


@pytest.fixture(scope="module")
def quick_results():
    out = {}
    for name in MINE:
        mod = load(name)
        cfg = mod.Config.quick()
        res = run_cells_serial(mod, cfg)
        out[name] = (mod, cfg, res, mod.analyse(res, cfg))
    return out


@pytest.mark.parametrize("name", MINE)
def test_contract(name, quick_results):
    mod, cfg, res, verdict = quick_results[name]
    assert cfg.mode == "quick" and mod.Config.full().mode == "full"
    cells = mod.cells(cfg)
    assert cells and all(isinstance(c, dict) for c in cells)
    json.dumps(cells)  # plain data
    assert isinstance(res, pd.DataFrame) and len(res) > 0
    assert list(verdict.columns) == ["claim", "setting", "measured", "expected", "holds"]
    assert len(verdict) >= 3
    assert all(isinstance(h, (bool, np.bool_)) or str(h).startswith(HOLDS_OK) for h in verdict["holds"])


@pytest.mark.parametrize("name", MINE)
def test_run_cell_is_deterministic(name):
    mod = load(name)
    cell = mod.cells(mod.Config.quick())[0]
    a, b = mod.run_cell(**cell), mod.run_cell(**cell)
    pd.testing.assert_frame_equal(a, b)


def test_run_goes_through_the_sweep(tmp_path):
    mod = load("methods")
    cfg = mod.Config.quick()
    results, verdict = mod.run(cfg, store=tmp_path, backend="serial", progress=False)
    direct = run_cells_serial(mod, cfg)
    np.testing.assert_array_equal(results["J_final"].to_numpy(), direct["J_final"].to_numpy())
    again, _ = mod.run(cfg, store=tmp_path, backend="serial", progress=False)  # loaded from the store
    np.testing.assert_array_equal(again["J_final"].to_numpy(), results["J_final"].to_numpy())


def _row(verdict, text):
    rows = verdict[verdict["claim"].str.contains(text, regex=False)]
    assert len(rows) >= 1, text
    return rows.iloc[0]


def test_threshold_quick_claims(quick_results):
    _, _, res, v = quick_results["threshold"]
    # the method ratios are predicted by gapdyn.expected_scalar (closed form, independent of the engine)
    assert _row(v, "eta*_reinforce / eta*_grpo")["holds"] == "holds"
    assert _row(v, "eta*_dr_grpo / eta*_reinforce")["holds"] == "holds"
    assert _row(v, "only in some instances")["holds"] == "holds"
    assert _row(v, "it is sharp")["holds"] == "holds"
    # the line-search oracle and the adaptive controller remove every exact collapse of the grid
    assert _row(v, "exact GRPO: adaptive and line-search")["holds"] == "holds"
    sp = res[(res["kind"] == "sampled")]
    for s in ("adaptive", "linesearch"):
        assert (sp.loc[sp["schedule"] == s, "J_final"] >= 1e-3).all(), s
    assert (sp.loc[sp["schedule"] == "constant", "J_final"] < 1e-3).any()


def test_stagnation_quick_claims(quick_results):
    _, _, res, v = quick_results["stagnation"]
    # exact optimum J* computed independently (max over the simplex / multi-start BFGS)
    assert _row(v, "shared tabular softmax")["holds"] == "holds"
    assert _row(v, "inside the feature hull")["holds"] == "holds"
    assert _row(v, "single context, exact reinforce")["holds"] == "holds"


def test_logistic_quick_claims(quick_results):
    _, _, res, v = quick_results["logistic"]
    assert _row(v, "meeting Theorem 1's step condition")["holds"] == "holds"
    exact = v[v["claim"].str.contains("(exact)", regex=False)]
    assert (exact["holds"] == "holds").all()


@pytest.mark.slow
@pytest.mark.parametrize("name", MINE)
def test_full_mode_runs(name, tmp_path):
    mod = load(name)
    _, verdict = mod.run(mod.Config.full(), store=tmp_path, backend="joblib", n_jobs=2, progress=False)
    assert len(verdict) >= 3
