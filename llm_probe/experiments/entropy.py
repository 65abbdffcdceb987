"""Entropy mechanics of recorded runs: does dH follow -eta Cov(log pi, A), and which taxonomy cell drives it?

    gapdyn train entropy --from DIR      # a finished study folder of gapdyn train ablation

Cui et al. (arXiv 2505.22617): for softmax logits under vanilla policy gradient, the entropy change of one step is
dH ~ -eta Cov_{a~pi}(log pi(a), pi(a) A(a)) (per state, averaged over states). Per probe step the trainer logs the
sampled covariance ``warn/cov_logp_adv`` at theta_k and the entropy change on the same completions
``warn/dH_same`` (llm_probe.warning). :func:`mechanism_fit` regresses dH on x = -lr * Cov over steps with a
bootstrap over runs (the slope's sign is the prediction; with Adam eta is not the lr, so its size is not).
:func:`cell_mass_table` relates each WAPO taxonomy cell's share of the gradient mass (``warn/mass_<cell>``) to
dH (slope of dH on the share) and compares the shares of collapsed and healthy runs before the collapse.
"""

from __future__ import annotations

import math

import numpy as np

from gapdyn.evidence.stats import bootstrap_slope
from gapdyn.theory.taxonomy import BIN_NAMES

__all__ = ["mechanism_rows", "mechanism_fit", "cell_mass_table", "report"]

MASS_COLS = tuple(f"warn/mass_{n}" for n in BIN_NAMES)


def mechanism_rows(steps):
    """Rows (run, method, lr, x = -lr * Cov(log pi, A), dH = warn/dH_same) of the steps where both are finite."""
    need = {"warn/cov_logp_adv", "warn/dH_same"}
    if not need <= set(steps.columns):
        return steps.iloc[0:0].assign(x=[], dH=[])
    d = steps[np.isfinite(steps["warn/cov_logp_adv"].astype(float)) & np.isfinite(steps["warn/dH_same"].astype(float))]
    return d.assign(x=-d["lr"].astype(float) * d["warn/cov_logp_adv"].astype(float), dH=d["warn/dH_same"].astype(float))


def mechanism_fit(steps, *, rng: np.random.Generator, n_resamples: int = 2000, by=None):
    """Slope of dH on -lr * Cov with a run-cluster bootstrap interval: {group: Estimate} (``by``: a column, or
    None for all rows). A group needs 2 runs with a non-constant x."""
    rows = mechanism_rows(steps)
    groups = [("all", rows)] if by is None else list(rows.groupby(by))
    out = {}
    for key, g in groups:
        if g.run.nunique() < 2 or float(np.var(g.x)) == 0:
            continue
        out[key] = bootstrap_slope(g.x.to_numpy(), g.dH.to_numpy(), clusters=g.run.to_numpy(), rng=rng,
                                   n_resamples=n_resamples)
    return out


def cell_mass_table(steps, *, rng: np.random.Generator, n_resamples: int = 1000, before: int = 10):
    """Per taxonomy cell: slope of dH_same on the cell's share of the step's gradient mass (run bootstrap), and its
    mean share over the first ``before`` steps in collapsed vs healthy runs."""
    import pandas as pd

    if not set(MASS_COLS) <= set(steps.columns):
        return pd.DataFrame()
    d = steps.dropna(subset=list(MASS_COLS))
    tot = d[list(MASS_COLS)].sum(axis=1)
    d = d[tot > 0]
    rows = []
    for col, name in zip(MASS_COLS, BIN_NAMES):
        share = d[col] / d[list(MASS_COLS)].sum(axis=1)
        r = {"cell": name, "share_mean": float(share.mean())}
        ok = np.isfinite(d.get("warn/dH_same", pd.Series(np.nan, index=d.index)).astype(float))
        if ok.sum() > 2 and d[ok].run.nunique() >= 2 and float(np.var(share[ok])) > 0:
            e = bootstrap_slope(share[ok].to_numpy(), d.loc[ok, "warn/dH_same"].to_numpy(float),
                                clusters=d[ok].run.to_numpy(), rng=rng, n_resamples=n_resamples)
            r.update(dH_slope=e.estimate, dH_lo=e.lo, dH_hi=e.hi)
        early = d.step < before
        for lab, sel in (("collapsed", d.collapsed), ("healthy", ~d.collapsed)):
            s = share[early & sel]
            r[f"share_{lab}_first{before}"] = float(s.mean()) if len(s) else math.nan
        rows.append(r)
    return pd.DataFrame(rows)


def report(study, seeds=None) -> None:
    """``gapdyn train entropy --from DIR [--seeds ...]``: print the mechanism fits and the cell-mass table of a
    finished study (of its runs of ``seeds`` only when given; the command line is llm_probe.cli's)."""
    from ._study import finished_runs
    from .early_warning import load_study_steps

    runs = finished_runs(study, seeds)
    if not runs:
        raise ValueError(f"no finished run of seeds {list(seeds)} under {study}/runs")
    steps = load_study_steps(runs)
    rng = np.random.default_rng(0)
    for key, e in {**mechanism_fit(steps, rng=rng), **mechanism_fit(steps, rng=rng, by="method")}.items():
        print(f"dH on -lr*Cov [{key}]: slope {e.estimate:.4g} (95% {e.lo:.4g}, {e.hi:.4g}), runs {e.n}")
    import pandas as pd

    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.precision", 4):
        print(cell_mass_table(steps, rng=rng).to_string(index=False))
