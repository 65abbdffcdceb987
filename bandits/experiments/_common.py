"""Helpers shared by the contextual-bandit experiments (threshold, success_rate, stagnation, logistic,
methods): outcome definitions, threshold search, verdict rows, and the ``run`` wrapper around
:func:`bandits.sweep.run_sweep`.

Outcome definitions (the toolkit's own, documented in docs/bandits_contextual.md):
- collapsed: final J < COLLAPSE_J = 1e-3;   converged: final J > CONVERGE_J = 0.99.
- critical step eta*: the smallest eta of an increasing grid whose run collapses, refined by geometric
  bisection between it and the grid point below (which did not collapse).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
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


@dataclass(frozen=True)
class ExperimentResult:
    """What an experiment run returns: its rows, its claims (both blocks) and the criteria hash.

    results: every row, with a ``block`` column ("discovery" / "confirmation");
    claims: :class:`gapdyn.Claim` records of every block, Holm-adjusted within a block where they are tests,
    each stamped with ``criteria_hash`` (the hash of the module's frozen ``CRITERIA``);
    replication: :func:`gapdyn.replication_table` of the two blocks (confirmation verdict, disagreement flagged).
    """

    name: str
    mode: str
    results: pd.DataFrame
    claims: tuple
    criteria_hash: str

    def block(self, block: str) -> list:
        return [c for c in self.claims if c.block == block]

    @property
    def replication(self) -> pd.DataFrame:
        return gapdyn.replication_table(self.block("discovery"), self.block("confirmation"))

    @property
    def verdict(self) -> pd.DataFrame:
        """The claims table of the block that decides: confirmation when it ran, else discovery."""
        shown = self.block("confirmation") or self.block("discovery")
        return gapdyn.claims_table(shown)


def experiment_blocks(config) -> list[tuple[str, tuple[int, ...]]]:
    """[(block, instance seeds)]: discovery always, confirmation when the config has one (full mode)."""
    blocks = [("discovery", tuple(config.instances))]
    if tuple(getattr(config, "confirmation", ())):
        blocks.append(("confirmation", tuple(config.confirmation)))
    return blocks


def stamp_claims(module, claims) -> list:
    """Holm-adjust a block's test claims and stamp the hash of the module's frozen CRITERIA."""
    h = gapdyn.criteria_hash(module.CRITERIA)
    claims = gapdyn.holm_adjust_claims(list(claims))
    return [dataclasses.replace(c, criteria_hash=h) for c in claims]


def run_experiment(module, config, *, store=None, backend="joblib", n_jobs=-1, progress=True) -> ExperimentResult:
    """Run every block of an experiment through :func:`bandits.sweep.run_sweep` (resumable) and judge it.

    The criteria (``module.CRITERIA``) are frozen before any block runs; each block is analysed on its own
    instances only: ``module.analyse(results_of_block, config, block=block) -> list[Claim]``.
    """
    from bandits.sweep import run_sweep

    frames, claims = [], []
    for block, seeds in experiment_blocks(config):
        res = run_sweep(
            module.run_cell,
            module.cells(config, seeds),
            name=f"{module.NAME}-{config.mode}-{block}",
            store=store,
            backend=backend,
            n_jobs=n_jobs,
            progress=progress,
        )
        res = res.assign(block=block)
        frames.append(res)
        claims += stamp_claims(module, module.analyse(res, config, block=block))
    return ExperimentResult(
        name=module.NAME,
        mode=config.mode,
        results=pd.concat(frames, ignore_index=True),
        claims=tuple(claims),
        criteria_hash=gapdyn.criteria_hash(module.CRITERIA),
    )


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
