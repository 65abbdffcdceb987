"""Helpers shared by the contextual-bandit experiments (threshold, success_rate, stagnation, logistic,
methods): outcome definitions, threshold search, verdict rows, and the ``run`` wrapper around
:func:`bandits.sweep.run_sweep`.

Outcome definitions (the toolkit's own, documented in docs/bandits_contextual.md):
- collapsed: final J < COLLAPSE_J = 1e-3;   converged: final J > CONVERGE_J = 0.99.
- critical step eta*: the smallest eta of an increasing grid whose run collapses, refined by geometric
  bisection between it and the grid point below (which did not collapse).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

import gapdyn
from bandits.engine import Dynamics, simulate
from bandits.envs import ContextualBandit

COLLAPSE_J = 1e-3
CONVERGE_J = 0.99


def verdict(claim: str, setting: str, measured: Any, expected: Any, holds) -> dict:
    """One row of a verdict table."""
    if isinstance(holds, (bool, np.bool_)):
        holds = "holds" if holds else "does not hold"
    return {"claim": claim, "setting": setting, "measured": str(measured), "expected": str(expected), "holds": holds}


def verdict_table(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["claim", "setting", "measured", "expected", "holds"])


def fmt_range(x, digits: int = 3) -> str:
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return "n/a"
    return f"[{x.min():.{digits}g}, {x.max():.{digits}g}] (median {np.median(x):.{digits}g}, n={x.size})"


def first_collapse(J_final: np.ndarray) -> int:
    """Index of the first collapsed run in a grid (J_final [E]); -1 if none."""
    col = np.asarray(J_final) < COLLAPSE_J
    return int(np.argmax(col)) if col.any() else -1


def refine_threshold(
    bandit: ContextualBandit, dyn: Dynamics, lo: float, hi: float, *, theta0=None, rounds: int = 2, n: int = 16
) -> tuple[float, float, float, float]:
    """Geometric bisection of the collapse transition in (lo, hi] for a 1-context bandit.

    Each round simulates n etas in [lo, hi] and keeps the first adjacent pair (converging side,
    collapsing side). Returns (lo, hi, J_final(lo), J_final(hi)).
    """
    J_lo = J_hi = np.nan
    for _ in range(rounds):
        etas = np.geomspace(lo, hi, n)
        Jf = simulate(bandit, dyn, eta=etas, theta0=theta0).J_final[:, 0]
        i = first_collapse(Jf)
        if i <= 0:  # transition not reproduced inside the bracket (non-monotone); keep the bracket
            break
        lo, hi, J_lo, J_hi = etas[i - 1], etas[i], Jf[i - 1], Jf[i]
    return float(lo), float(hi), float(J_lo), float(J_hi)


def steps_to(J: np.ndarray, steps: np.ndarray, level: float) -> np.ndarray:
    """First recorded step with J >= level along the step axis (J [..., n_rec]); inf if never."""
    hit = J >= level
    idx = np.argmax(hit, axis=-1)
    return np.where(hit.any(axis=-1), steps[idx], np.inf)


def first_below(J: np.ndarray, steps: np.ndarray, level: float) -> np.ndarray:
    """First recorded step with J < level (J [..., n_rec]); inf if never."""
    hit = J < level
    return np.where(hit.any(axis=-1), steps[np.argmax(hit, axis=-1)], np.inf)


def predictors_at(bandit: ContextualBandit, method: str, G: int, theta0=None) -> dict:
    """eta*-predictors at theta0 for context 0 of a 1-context bandit and the method's exact direction w0.

    sharp: gapdyn.sharp_step_threshold (the one-step line-search threshold); local: 2 dmu / (w^T -H w)_+;
    thm1: Theorem 1's step condition for the unit direction (loglinear_bound_constants), divided by ||w0||
    so that it is a bound on eta for w0 itself.
    """
    th = bandit.zeros()[0] if theta0 is None else np.asarray(theta0, dtype=float).reshape(-1)
    phi, r = bandit.features[0], bandit.rewards[0]
    probs = gapdyn.loglinear_probs(phi, th)
    scores = gapdyn.loglinear_scores(phi, th)
    gap = gapdyn.gradient_gap(probs, r, scores)
    J = float(gapdyn.success_rate(probs, r))
    w = gap if method == "gap" else gapdyn.expected_scalar(method, J, G) * gap
    dmu = float(gapdyn.gap_alignment(w, gap))
    hess = gapdyn.logodds_hessian(probs, r, scores)
    G_o, L_o = gapdyn.loglinear_bound_constants(phi)
    wn = float(np.linalg.norm(w))
    return {
        "J0": J,
        "pred_sharp": gapdyn.sharp_step_threshold(gapdyn.loglinear_logodds_fn(phi, r), th, w),
        "pred_local": float(gapdyn.local_step_threshold(dmu, w, hess)),
        "pred_thm1": float(gapdyn.theorem1_step_bound(dmu / wn, L_o=L_o, G_o=G_o)) / wn,
    }


def run_experiment(module, config, *, store=None, backend="joblib", n_jobs=-1, progress=True):
    """(results, verdict) of an experiment module via bandits.sweep.run_sweep."""
    from bandits.sweep import run_sweep

    results = run_sweep(
        module.run_cell,
        module.cells(config),
        name=f"{module.NAME}-{config.mode}",
        store=store,
        backend=backend,
        n_jobs=n_jobs,
        progress=progress,
    )
    return results, module.analyse(results, config)


def run_cells_serial(module, config) -> pd.DataFrame:
    """All cells in-process, without the sweep machinery (tests, debugging)."""
    frames = []
    for cell in module.cells(config):
        df = module.run_cell(**cell)
        for k, v in cell.items():
            if k not in df.columns:
                df[k] = [v] * len(df) if not isinstance(v, (list, tuple, dict)) else [str(v)] * len(df)
        frames.append(df)
    return pd.concat(frames, ignore_index=True)
