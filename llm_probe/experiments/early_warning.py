"""Do per-step statistics warn of collapse? Lead time and ROC AUC across seeds and learning rates.

    gapdyn train early-warning --from DIR      # DIR: a finished study of gapdyn train ablation --study warning

Each run (``DIR/runs/*``: metrics.jsonl + done.json + eval.jsonl) is labelled by what it ends as
(llm_probe.collapse.run_outcome, via llm_probe.experiments.ablation.outcome_from_rows): a run that ends collapsed is a
positive with onset c = the first step of its final collapse (llm_probe.collapse.collapse_onset: from c on the
running mean of the reward never reaches 0.25 R0 again), not the first alert, which lags it; runs that do not end
collapsed (healthy, and recovered: alerted but recovered) are the negatives ("healthy" below); failed runs (stopped
on numerical faults) are left out. For a statistic s (:data:`STATISTICS`: its column, a rolling window and
the direction, higher or lower, that is supposed to warn, fixed before looking at the data) and a lead L:

- AUC(L): positives are the collapsed runs' scores at t_i = c_i - L (runs with t_i >= 0); negatives are the
  healthy runs' scores at t* = the median of the t_i (gapdyn.roc_auc, Hanley-McNeil interval). AUC >= 0.8 at
  L >= 5 is the bar for a useful warning.
- lead time: the threshold is the most alarming value any healthy run reaches (zero false alarms on these runs);
  a collapsed run is warned at the first step its score passes it; lead = c - that step.
The reward itself (rolling mean) is a reference row: a statistic that does no better than the falling reward
adds nothing. Pooled over learning rates, a statistic that merely tracks the lr (collapses happen at the large
ones) separates runs without warning of anything; :func:`warning_table_by_lr` repeats the table within each lr
that has at least 2 collapsed and 2 healthy runs (a stratification added after the quick study).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from gapdyn.io import write_with
from gapdyn.stats import roc_auc
from gapdyn.taxonomy import BIN_NAMES

from ..warning import signed_cumulative_alignment

__all__ = ["STATISTICS", "load_study_steps", "statistic_series", "lead_auc", "lead_times", "warning_table",
           "warning_table_by_lr", "report"]

# name -> (column, rolling window, direction that warns: +1 high values, -1 low values, rationale)
STATISTICS = {
    "M_pos": ("M_pos", 1, -1, "arXiv 2510.08539 Thm 1: J >= sigmoid(logit J0 + M/2); little alignment, no lift"),
    "M_neg": ("M_neg", 1, -1, "steps against the gap accumulate: a more negative sum warns"),
    "curv_gap": ("warn/curv_gap", 5, +1, "wrong completions spread more along the update than correct ones"),
    "wrong_max_frac": ("warn/wrong_max_frac", 5, +1, "a wrong completion gains the most log-prob"),
    "x_wrong_mean": ("warn/x_wrong_mean", 5, +1, "wrong completions gain log-prob along the update"),
    "cov_logp_adv": ("warn/cov_logp_adv", 5, +1, "large Cov(log pi, A): fast entropy fall (arXiv 2505.22617)"),
    "dH_same": ("warn/dH_same", 5, +1, "entropy rising on the sampled completions"),
    "neg_mass_share": ("neg_mass_share", 5, +1, "WAPO taxonomy: share of the gradient mass on negative-advantage "
                       "tokens (added after the quick study: exploratory; 0 for WAPO by construction)"),
    "reward (reference)": ("reward", 5, -1, "the falling reward itself"),
}


def load_study_steps(study) -> "object":
    """All runs' step rows with run, method, lr, seed, outcome (llm_probe.collapse.RUN_OUTCOMES), collapsed (the run
    ends collapsed), collapse_step (the onset of its final collapse, -1 if none), M_pos, M_neg, neg_mass_share
    (negative-advantage cells' share of the step's gradient mass) columns. Failed runs are kept (outcome
    "failed", collapsed False); the warning tables leave them out. study: a study folder (its runs/*/), or the
    run folders themselves."""
    import pandas as pd

    from .ablation import outcome_from_rows, read_evals

    frames = []
    done_files = (sorted(Path(study, "runs").glob("*/done.json")) if isinstance(study, (str, Path)) else
                  [Path(d) / "done.json" for d in study])
    for i, f in enumerate(done_files):
        done = json.loads(f.read_text())
        rows = [json.loads(ln) for ln in (f.parent / "metrics.jsonl").read_text().splitlines() if ln.strip()]
        df = pd.DataFrame([{k: v for k, v in r.items() if k != "alerts"} for r in rows])
        if df.empty:
            continue
        df["M_pos"], df["M_neg"] = signed_cumulative_alignment(df)
        mass = [c for c in (f"warn/mass_{n}" for n in BIN_NAMES) if c in df]
        if len(mass) == len(BIN_NAMES):
            tot = df[mass].sum(axis=1, min_count=len(mass))
            df["neg_mass_share"] = ((df["warn/mass_neg_peak"] + df["warn/mass_neg_valley"]) / tot).where(tot > 0)
        out = outcome_from_rows(rows, done, read_evals(f.parent))
        df["run"], df["outcome"], df["collapsed"] = i, out.label, out.collapsed
        df["collapse_step"] = -1 if out.onset is None else out.onset
        frames.append(df)
    if not frames:
        raise ValueError(f"no finished run under {study}/runs")
    return pd.concat(frames, ignore_index=True)


def statistic_series(df_run, name: str) -> np.ndarray:
    """The oriented score of statistic ``name`` per step of one run (higher = more alarming; NaN where missing).

    The column's rolling mean over the statistic's window (NaN steps skipped), times its direction."""
    col, window, direction, _ = STATISTICS[name]
    if col not in df_run:
        return np.full(len(df_run), np.nan)
    s = df_run[col].astype(float).rolling(window, min_periods=1).mean()
    return direction * s.to_numpy()


def _labelled(steps):
    """The step rows of the runs with a label: failed runs (an ``outcome`` column) left out."""
    return steps[steps["outcome"] != "failed"] if "outcome" in steps else steps


def _scores(steps, name):
    out = {}
    for run, g in _labelled(steps).groupby("run"):
        g = g.sort_values("step")
        out[run] = (bool(g.collapsed.iloc[0]), int(g.collapse_step.iloc[0]), g.step.to_numpy(),
                    statistic_series(g, name))
    return out


def _at(step_arr, vals, t):
    i = np.searchsorted(step_arr, t, side="right") - 1
    return vals[i] if 0 <= i < len(vals) else np.nan


def lead_auc(steps, name: str, lead: int):
    """gapdyn Estimate of AUC(lead) (module doc), or None when a side has fewer than 2 finite scores."""
    if lead < 0:
        raise ValueError(f"lead must be >= 0, got {lead}")
    sc = _scores(steps, name)
    pos, ts = [], []
    for collapsed, c, st, v in sc.values():
        if collapsed and c - lead >= 0:
            x = _at(st, v, c - lead)
            if np.isfinite(x):
                pos.append(x)
                ts.append(c - lead)
    if len(pos) < 2:
        return None
    t_star = float(np.median(ts))
    neg = [x for collapsed, _, st, v in sc.values() if not collapsed and np.isfinite(x := _at(st, v, t_star))]
    if len(neg) < 2:
        return None
    return roc_auc(pos, neg)


def lead_times(steps, name: str) -> dict:
    """Threshold = max healthy score; per collapsed run the lead c - (first step above it) (NaN: never warned)."""
    sc = _scores(steps, name)
    healthy = [v[np.isfinite(v)] for collapsed, _, _, v in sc.values() if not collapsed]
    healthy = [h for h in healthy if h.size]
    if not healthy:
        return {"threshold": math.nan, "leads": []}
    thr = float(max(h.max() for h in healthy))
    leads = []
    for collapsed, c, st, v in sc.values():
        if collapsed:
            hit = np.flatnonzero(np.isfinite(v) & (v > thr) & (st <= c))
            leads.append(float(c - st[hit[0]]) if hit.size else math.nan)
    return {"threshold": thr, "leads": leads}


def warning_table(steps, leads=(0, 5, 10)):
    """One row per statistic: AUC (and interval) at each lead, share of collapsed runs warned >= 5 steps ahead
    with zero false alarms on the healthy runs, median lead, and whether AUC(5) >= 0.8."""
    import pandas as pd

    rows = []
    steps = _labelled(steps)
    n_pos = int(steps.groupby("run").collapsed.first().sum())
    n_neg = int((~steps.groupby("run").collapsed.first()).sum())
    for name in STATISTICS:
        r = {"statistic": name, "direction": "high" if STATISTICS[name][2] > 0 else "low"}
        for L in leads:
            e = lead_auc(steps, name, L)
            r[f"auc_L{L}"], r[f"lo_L{L}"], r[f"hi_L{L}"] = (e.estimate, e.lo, e.hi) if e else (math.nan,) * 3
        lt = lead_times(steps, name)
        ls = np.array(lt["leads"], dtype=float)
        r["warned_ge5"] = int(np.sum(ls >= 5)) if ls.size else 0
        r["median_lead"] = float(np.nanmedian(ls)) if ls.size and np.isfinite(ls).any() else math.nan
        r["n_collapsed"], r["n_healthy"] = n_pos, n_neg
        r["useful"] = bool(r.get("auc_L5", math.nan) >= 0.8 and r["warned_ge5"] > 0)
        rows.append(r)
    return pd.DataFrame(rows)


def warning_table_by_lr(steps, leads=(0, 5, 10), min_runs: int = 2):
    """:func:`warning_table` within each lr that has >= ``min_runs`` collapsed and healthy runs (an ``lr``
    column first); an empty frame when no lr has both."""
    import pandas as pd

    if isinstance(min_runs, bool) or not isinstance(min_runs, int) or min_runs < 1:
        raise ValueError(f"min_runs must be an integer >= 1, got {min_runs!r}")
    parts = []
    for lr, g in _labelled(steps).groupby("lr", sort=True):
        runs = g.groupby("run").collapsed.first()
        if int(runs.sum()) >= min_runs and int((~runs).sum()) >= min_runs:
            t = warning_table(g, leads)
            t.insert(0, "lr", lr)
            parts.append(t)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def report(study) -> None:
    """``gapdyn train early-warning --from DIR``: write DIR/early_warning.csv and DIR/early_warning_by_lr.csv, print
    both tables (the command line is llm_probe.cli's)."""
    steps = load_study_steps(study)
    tab = warning_table(steps)
    write_with(Path(study) / "early_warning.csv", lambda tmp: tab.to_csv(tmp, index=False))
    import pandas as pd

    with pd.option_context("display.width", 250, "display.max_columns", 30, "display.precision", 3):
        print(tab.to_string(index=False))
    useful = tab[tab.useful & (tab.statistic != "reward (reference)")].statistic.tolist()
    print("AUC >= 0.8 at lead 5 with a zero-false-alarm warning >= 5 steps ahead:", useful or "none")
    by_lr = warning_table_by_lr(steps)
    write_with(Path(study) / "early_warning_by_lr.csv", lambda tmp: by_lr.to_csv(tmp, index=False))
    if len(by_lr):
        cols = ["lr", "statistic", "auc_L0", "auc_L5", "lo_L5", "hi_L5", "auc_L10", "warned_ge5", "n_collapsed",
                "n_healthy", "useful"]
        with pd.option_context("display.width", 250, "display.max_columns", 30, "display.precision", 3):
            print("\nwithin each lr with >= 2 collapsed and >= 2 healthy runs:")
            print(by_lr[cols].to_string(index=False))
    else:
        print("\nno lr has >= 2 collapsed and >= 2 healthy runs: no within-lr table")
    print(f"wrote {Path(study) / 'early_warning.csv'}, {Path(study) / 'early_warning_by_lr.csv'}")
