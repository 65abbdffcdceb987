"""Do per-step statistics warn of collapse before the reward does? Time-matched AUC within each lr.

    gapdyn train early-warning --from DIR      # DIR: a finished study of gapdyn train ablation --study warning
    python -m llm_probe.experiments.early_warning --coverage   # the bootstrap's coverage on a synthetic DGP

Labels come from the outcome (llm_probe.collapse.reward_outcome, via llm_probe.experiments._study.outcome_from_rows):
a run that ends collapsed is a positive with onset c = the first step of its final collapse
(llm_probe.collapse.collapse_onset), not its first alert, which lags it; runs that do not end collapsed, healthy
and recovered (alerted, then recovered) alike, are the negatives; failed runs (stopped on numerical faults) are
left out. The lead L is counted back from the onset.

A statistic (:data:`STATISTICS`: column, rolling window, the direction that warns, fixed before the data) is
scored on the steps where it is logged (probe steps for the gap/* and warn/* columns): score(t) = direction x
the mean of its last ``window`` logged values at steps <= t (no look-ahead; the same rule for every run).

- matched AUC(L): positive i at lr is scored at t_i = c_i - L and compared with every negative run of the SAME lr
  at the same step t_i: AUC(L) = mean over those (positive, negative) pairs of 1[s_i(t_i) > s_j(t_i)] +
  1/2 1[=] (pairs pooled over lrs; a negative is never taken from another lr, so a statistic that only tracks
  the lr cannot separate anything).
- p for AUC(L) > 1/2: the outcome labels permuted among the runs of each lr, the positives' onsets travelling
  with the positive label (:func:`label_permutations`, one-sided, add-one).
- p for candidate AUC(L) > reward AUC(L), on the pairs where both are logged: the paired permutation test of
  Venkatraman & Begg (1996, Biometrika 83, 835): within each run the two statistics' ranks (among the lr's runs
  at the same step) are exchanged at random; the label permutation is also reported (``p_perm_labels``): it
  tests only "neither statistic is informative", not "the candidate beats an informative reward".
- interval: run-cluster percentile bootstrap (positive and negative runs resampled with replacement within each
  lr; a positive keeps its onset); its coverage on a synthetic DGP with a known matched AUC is
  :func:`bootstrap_coverage` (docs/llm_probe.md gives it at the study's n).
- lead time: per positive, lead = c - t for the first step t from which its score stays above every negative
  of its lr at the same step through the onset (a time-matched zero-false-alarm rule).

Claims (:data:`SPECS`, frozen at import, :data:`CRITERIA_HASH`): the primaries are "candidate X warns: matched
AUC at lead 10 above the reward baseline's" for :data:`PRIMARY` (one-sided, Holm over these only); exploratory
rows: AUC vs 1/2 for every statistic at leads 0, 5, 10 within each lr.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import numpy as np

from gapdyn.evidence.claims import (Claim, ClaimSpec, Criterion, claims_markdown, claims_to_json, criteria_hash,
                           holm_adjust_claims, keyed_specs)
from gapdyn.io import atomic_write_text, write_with
from gapdyn.theory.taxonomy import BIN_NAMES

from ..warning import signed_cumulative_alignment

__all__ = ["Statistic", "STATISTICS", "PRIMARY", "BASELINE", "LEADS", "PRIMARY_LEAD", "SPECS", "CRITERIA", "CRITERIA_HASH",
           "N_PERMUTATIONS", "N_BOOT", "SEED", "MatchedAUC", "load_study_steps", "statistic_series", "score_at",
           "matched_auc", "lead_auc", "label_permutations", "lead_times", "warning_table", "warning_claims",
           "simulate_steps", "true_matched_auc", "bootstrap_coverage", "study_runs", "report"]


class Statistic(NamedTuple):
    """column: the metrics column; window: logged values averaged; direction: +1 high warns, -1 low warns;
    rationale: why it should warn; role: "candidate" (fixed before the data), "baseline" or "exploratory"."""

    column: str
    window: int
    direction: int
    rationale: str
    role: str = "exploratory"


STATISTICS = {
    "M_pos": Statistic("M_pos", 1, -1, "arXiv 2510.08539 Thm 1: J >= sigmoid(logit J0 + M/2); little alignment, no "
                       "lift", "candidate"),
    "M_neg": Statistic("M_neg", 1, -1, "steps against the gap accumulate: a more negative sum warns", "candidate"),
    "cov_logp_adv": Statistic("warn/cov_logp_adv", 5, +1, "large Cov(log pi, A): fast entropy fall (arXiv 2505.22617)",
                              "candidate"),
    "headroom_lr": Statistic("gap/headroom_lr", 1, -1, "the lr at which the safe-step bound binds (docs/theory.md "
                             "section 11): little headroom above the lr used warns", "candidate"),
    "frac_reward_zero_std": Statistic("frac_reward_zero_std", 5, +1, "share of groups with no reward variance (TRL's "
                                      "metric): no learning signal", "candidate"),
    "reward": Statistic("reward", 5, -1, "the falling reward itself: the baseline to beat", "baseline"),
    "curv_gap": Statistic("warn/curv_gap", 5, +1, "wrong completions spread more along the update than correct ones"),
    "wrong_max_frac": Statistic("warn/wrong_max_frac", 5, +1, "a wrong completion gains the most log-prob"),
    "x_wrong_mean": Statistic("warn/x_wrong_mean", 5, +1, "wrong completions gain log-prob along the update"),
    "dH_same": Statistic("warn/dH_same", 5, +1, "entropy rising on the sampled completions"),
    "neg_mass_share": Statistic("neg_mass_share", 5, +1, "WAPO taxonomy: share of the gradient mass on negative-"
                                "advantage tokens (0 for WAPO by construction)"),
    "headroom": Statistic("gap/headroom", 1, -1, "the safe-step rule's headroom h (lr-free form of headroom_lr)"),
}
"""name -> Statistic, fixed before the data; candidates and the baseline are the pre-declared rows."""
PRIMARY = ("M_pos", "headroom_lr", "frac_reward_zero_std", "cov_logp_adv")
"""The pre-declared primaries: each against :data:`BASELINE` at :data:`PRIMARY_LEAD` (Holm over these four)."""
BASELINE = "reward"
LEADS = (0, 5, 10)
PRIMARY_LEAD = 10
N_PERMUTATIONS = 2000
N_BOOT = 2000
SEED = 20261201
"""The one rng seed of the permutations and the bootstrap (numpy.random.default_rng)."""

_SRC = "beyond the papers"
SPECS = {
    **{f"llm.warning.{name}_beats_reward": ClaimSpec(
        f"{_SRC} ({STATISTICS[name].rationale})",
        f"{name} ({'high' if STATISTICS[name].direction > 0 else 'low'} warns) warns of the final collapse: its "
        f"time-matched AUC at lead {PRIMARY_LEAD} exceeds the rolling reward's", "comparison",
        Criterion.above(0.0, alpha=0.05), primary=True) for name in PRIMARY},
    "llm.warning.auc_above_chance": ClaimSpec(
        _SRC, "the statistic separates runs that end collapsed from the others of its lr at lead L (time-matched)",
        "comparison", Criterion.above(0.5, alpha=0.05)),
}
SPECS = keyed_specs(SPECS, {k: (("beyond the papers", "early warning"), "exploratory" if k.endswith("auc_above_chance")
                                else "test") for k in SPECS})  # (statement key, role) per claim
"""claim id -> ClaimSpec, frozen at import; auc_above_chance is instantiated per statistic, lead and lr
(exploratory, unadjusted)."""
CRITERIA = {cid: spec.criterion for cid, spec in SPECS.items()}
"""claim id -> Criterion (the specs' criteria)."""
CRITERIA_HASH = criteria_hash(CRITERIA)


def load_study_steps(study) -> "object":
    """All runs' step rows with run, method, lr, seed, outcome (llm_probe.collapse.REWARD_OUTCOMES), collapsed (the run
    ends collapsed), collapse_step (the onset of its final collapse, -1 if none), M_pos, M_neg, neg_mass_share
    (negative-advantage cells' share of the step's gradient mass) columns. Failed runs are kept (outcome
    "failed", collapsed False); the warning tables leave them out. study: a study folder (its runs/*/), or the
    run folders themselves."""
    import pandas as pd

    from ._study import RESULT, finished_runs, outcome_from_rows, read_evals, read_metrics

    frames = []
    folders = finished_runs(study) if isinstance(study, (str, Path)) else [Path(d) for d in study]
    for i, f in enumerate(d / RESULT for d in folders):
        done = json.loads(f.read_text())
        rows = read_metrics(f.parent)
        df = pd.DataFrame([{k: v for k, v in r.items() if k != "alerts"} for r in rows])
        if df.empty:
            continue
        for key in ("method", "lr", "seed"):  # the trainer logs them on every row; older rows: from done.json
            if key not in df and key in done:
                df[key] = done[key]
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


def _spec(name) -> Statistic:
    if isinstance(name, Statistic):
        return name
    if name not in STATISTICS:
        raise ValueError(f"name must be one of {sorted(STATISTICS)} or a Statistic, got {name!r}")
    return STATISTICS[name]


def statistic_series(df_run, name) -> tuple[np.ndarray, np.ndarray]:
    """(steps, scores) of one run on the steps where the statistic is logged (finite), in step order: score =
    direction x the mean of the last ``window`` logged values (higher = more alarming)."""
    s = _spec(name)
    if s.column not in df_run:
        return np.zeros(0, dtype=int), np.zeros(0)
    step = df_run["step"].to_numpy(dtype=float)
    v = df_run[s.column].to_numpy(dtype=float)
    order = np.argsort(step, kind="stable")
    step, v = step[order], v[order]
    ok = np.isfinite(v)
    step, v = step[ok], v[ok]
    c = np.concatenate([[0.0], np.cumsum(v)])
    i = np.arange(1, v.size + 1)
    lo = np.maximum(i - s.window, 0)
    return step.astype(int), s.direction * (c[i] - c[lo]) / (i - lo)


def score_at(steps: np.ndarray, scores: np.ndarray, t) -> np.ndarray:
    """The last logged score at a step <= t (NaN before the first logged step or for t < 0); t: scalar or array."""
    t = np.asarray(t)
    i = np.searchsorted(steps, t, side="right") - 1
    ok = (i >= 0) & (t >= 0)
    return np.where(ok, scores[np.clip(i, 0, max(len(scores) - 1, 0))] if len(scores) else np.nan, np.nan)


def _labelled(steps):
    """The step rows of the runs with a label: failed runs (an ``outcome`` column) left out."""
    return steps[steps["outcome"] != "failed"] if "outcome" in steps else steps


class _Group(NamedTuple):
    """One lr's runs: k positives first (their onsets ``onset``), then the negatives; S[name]: (n, k) scores of
    every run at each positive's time c_u - L (NaN: not logged by then)."""

    lr: float
    runs: np.ndarray
    onset: np.ndarray
    S: dict


class _Runs:
    """The labelled runs of a step frame per lr (positives first), their score series computed once per statistic."""

    def __init__(self, steps):
        self.lrs = []
        for lr, g in _labelled(steps).groupby("lr", sort=True):
            first = g.groupby("run")[["collapsed", "collapse_step"]].first()
            pos = first.index[first.collapsed.astype(bool)].to_numpy()
            neg = first.index[~first.collapsed.astype(bool)].to_numpy()
            per_run = {r: d for r, d in g.groupby("run")}
            runs = np.concatenate([pos, neg])
            self.lrs.append((float(lr), runs, first.loc[pos, "collapse_step"].to_numpy().astype(int),
                             [per_run[r] for r in runs]))
        self._series, self.sums = {}, {}

    def series(self, name, i: int) -> list:
        key = (_spec(name), i)
        if key not in self._series:
            self._series[key] = [statistic_series(d, name) for d in self.lrs[i][3]]
        return self._series[key]

    def groups(self, names, lead: int, lr=None) -> list[_Group]:
        out = []
        for i, (g_lr, runs, onset, _) in enumerate(self.lrs):
            if lr is not None and not math.isclose(g_lr, float(lr)):
                continue
            S = {name: np.array([score_at(st, sc, onset - lead) for st, sc in self.series(name, i)]
                                ).reshape(len(runs), len(onset)) for name in names}
            out.append(_Group(g_lr, runs, onset, S))
        return out


def _kernel(S: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """W[u, r, j] = 1[S[r,u] > S[j,u]] + 1/2 1[=], V[u, r, j] = both finite (the (n, n) comparisons at slot u)."""
    a, b = S.T[:, :, None], S.T[:, None, :]
    V = np.isfinite(a) & np.isfinite(b)
    with np.errstate(invalid="ignore"):
        W = np.where(V, (a > b) + 0.5 * (a == b), 0.0)
    return W.astype(np.float32), V.astype(np.float32)


class MatchedAUC(NamedTuple):
    """estimate: pooled matched AUC (or difference); lo, hi: bootstrap percentile interval; p: one-sided
    permutation p; n_pos, n_neg: runs in at least one pair; n_pairs; p_perm_labels: the label-permutation p
    (differences only: the null of no information in either statistic)."""

    estimate: float
    lo: float
    hi: float
    p: float
    n_pos: int
    n_neg: int
    n_pairs: int
    p_perm_labels: float = math.nan


def label_permutations(n: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """(size, n) permutations of range(n): in each, slot u < k goes to run perm[u] (a positive with onset u),
    the rest are the negatives: labels permuted among an lr's runs, onsets travelling with the positive label."""
    return np.argsort(rng.random((size, n)), axis=1)


def _perm_sums(W, V, k, perms, chunk=500):
    """Numerator and denominator of the matched AUC under each permutation: slot u's positive perm[u] against
    the negatives perm[k:], gathered directly, or as (row sum over all runs) - (the positives' block) when the
    positives are fewer; vectorised over chunks of permutations."""
    n = W.shape[1]
    full = bool(V.all())
    u = np.arange(k)[None, :, None]
    rows = (W.sum(2, dtype=float), V.sum(2, dtype=float))  # (k, n): slot u, run r against every run

    def total(X, X_rows, p):
        if k <= n - k:  # every run minus the permuted positives
            return X_rows[u[..., 0], p[:, :k]].sum(1) - X[(u, p[:, :k, None], p[:, None, :k])].sum((1, 2), dtype=float)
        return X[(u, p[:, :k, None], p[:, None, k:])].sum((1, 2), dtype=float)

    num, den = np.empty(len(perms)), np.empty(len(perms))
    for s in range(0, len(perms), chunk):
        p = perms[s:s + chunk]
        num[s:s + chunk] = total(W, rows[0], p)
        den[s:s + chunk] = k * (n - k) if full else total(V, rows[1], p)
    return num, den


def _boot_sums(P, Q, k, m, rng, B):
    """Numerator and denominator under a run-cluster bootstrap (positives and negatives resampled)."""
    a = rng.multinomial(k, np.full(k, 1 / k), size=B).astype(float)
    b = rng.multinomial(m, np.full(m, 1 / m), size=B).astype(float)
    return ((a @ P) * b).sum(1), ((a @ Q) * b).sum(1)


def _ranks(S, ok):
    """Per slot (column) the average ranks of S among the runs with ok, scaled to (0, 1]; NaN elsewhere."""
    from scipy.stats import rankdata

    R = rankdata(np.where(ok, S, np.nan), axis=0, nan_policy="omit")
    return R / np.maximum(ok.sum(0), 1)


def _swap_diffs(Rc, Rr, k, rng, size):
    """Venkatraman-Begg paired permutation: per run, the two statistics' ranks swapped with probability 1/2;
    returns the numerator of sum over pairs [H(c_i - c_j) - H(r_i - r_j)] under each swap pattern (size,)."""
    n = Rc.shape[0]
    u = np.arange(k)

    def h(x, y):  # (k, m) pair comparisons, positive u at its slot against the negatives at that slot
        with np.errstate(invalid="ignore"):
            return (x > y) + 0.5 * (x == y)

    xc, xr = Rc[u, u][:, None], Rr[u, u][:, None]
    yc, yr = Rc[k:, :].T, Rr[k:, :].T
    d_same = h(xc, yc) - h(xr, yr)  # neither or both swapped: +/- d_same
    d_cross = h(xc, yr) - h(xr, yc)  # only one swapped
    F = (rng.random((size, n)) < 0.5).astype(float)
    fi, fj = F[:, :k], F[:, k:]
    e = d_same - d_cross  # pair (i, j) adds sign_i (d_cross + 1[F_i = F_j] e), sign_i = -1 if i is swapped
    return ((1 - 2 * fi) @ d_cross.sum(1) - (fi * (fj @ e.T)).sum(1) + ((1 - fi) * ((1 - fj) @ e.T)).sum(1))


def _group_sums(g: _Group, name, versus, n_permutations, n_boot, rng) -> dict | None:
    """One lr's observed, permuted, bootstrapped (and swapped) numerators and denominators; None: no pair."""
    k, n = len(g.onset), len(g.runs)
    if k == 0 or n == k:
        return None
    W, V = _kernel(g.S[name])
    if versus is not None:
        W2, V2 = _kernel(g.S[versus])
        V = V * V2
        W = (W - W2) * V
    u = np.arange(k)
    P, Q = W[u, u, k:].astype(float), V[u, u, k:].astype(float)  # (k, m): positive u against each negative
    if Q.sum() == 0:
        return None
    out = {"num": P.sum(), "den": Q.sum(), "n_pos": int((Q.sum(1) > 0).sum()), "n_neg": int((Q.sum(0) > 0).sum())}
    out["perm_num"], out["perm_den"] = _perm_sums(W, V, k, label_permutations(n, n_permutations, rng))
    out["boot_num"], out["boot_den"] = _boot_sums(P, Q, k, n - k, rng, n_boot)
    if versus is not None:
        ok = np.isfinite(g.S[name]) & np.isfinite(g.S[versus])
        out["swap_num"] = _swap_diffs(_ranks(g.S[name], ok), _ranks(g.S[versus], ok), k, rng, n_permutations)
    return out


def matched_auc(steps, name, lead: int, *, versus=None, lr=None, n_permutations: int = N_PERMUTATIONS,
                n_boot: int = N_BOOT, seed: int = SEED) -> MatchedAUC | None:
    """The time-matched AUC(lead) of statistic ``name`` (module doc), or with ``versus`` the paired difference
    AUC_name - AUC_versus on the pairs where both are logged; lr: one lr only (default: pairs pooled over lrs,
    within lr). Permutations and resamples are drawn per lr from default_rng((seed, lr index)). None when there
    is no matched pair."""
    if isinstance(lead, bool) or not isinstance(lead, (int, np.integer)) or lead < 0:
        raise ValueError(f"lead must be an integer >= 0, got {lead!r}")
    for v, nm in ((n_permutations, "n_permutations"), (n_boot, "n_boot")):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{nm} must be a positive integer, got {v!r}")
    runs = steps if isinstance(steps, _Runs) else _Runs(steps)
    names = [name] + ([] if versus is None else [versus])
    parts = []
    for i, (g_lr, *_) in enumerate(runs.lrs):
        if lr is not None and not math.isclose(g_lr, float(lr)):
            continue
        key = (i, _spec(name), None if versus is None else _spec(versus), lead, n_permutations, n_boot, seed)
        if key not in runs.sums:
            g = runs.groups(names, lead, lr=g_lr)[0]
            runs.sums[key] = _group_sums(g, name, versus, n_permutations, n_boot, np.random.default_rng((seed, i)))
        if runs.sums[key] is not None:
            parts.append(runs.sums[key])
    if not parts:
        return None
    tot = {k: sum(p[k] for p in parts) for k in parts[0]}
    est = tot["num"] / tot["den"]
    null = 0.0 if versus is not None else 0.5
    with np.errstate(invalid="ignore", divide="ignore"):
        perm = np.where(tot["perm_den"] > 0, tot["perm_num"] / tot["perm_den"], null)
        boot = tot["boot_num"] / tot["boot_den"]
    lo, hi = np.quantile(boot[np.isfinite(boot)], [0.025, 0.975])
    tol = 1e-9  # ties of the permuted statistic with the observed one count as at least as extreme
    p_lab = float((1 + np.sum(perm >= est - tol)) / (1 + n_permutations))
    common = (float(est), float(lo), float(hi))
    counts = (tot["n_pos"], tot["n_neg"], int(tot["den"]))
    if versus is None:
        return MatchedAUC(*common, p_lab, *counts)
    p_swap = float((1 + np.sum(tot["swap_num"] / tot["den"] >= est - tol)) / (1 + n_permutations))
    return MatchedAUC(*common, p_swap, *counts, p_lab)


def lead_auc(steps, name, lead: int, **kw) -> MatchedAUC | None:
    """:func:`matched_auc` of one statistic (the older name)."""
    return matched_auc(steps, name, lead, **kw)


def lead_times(steps, name, *, lr=None) -> dict:
    """Per positive (in run order within lr): lead = c - t for the first logged step t from which, at every logged
    step up to the onset c, its score exceeds the score of every negative run of its lr at that step (last logged
    values: time-matched, no false alarm on those runs); NaN: not warned at the onset.
    lr: one lr only (default: every lr)."""
    runs = steps if isinstance(steps, _Runs) else _Runs(steps)
    leads = []
    for i, (g_lr, _, onset, _) in enumerate(runs.lrs):
        if lr is not None and not math.isclose(g_lr, float(lr)):
            continue
        series = runs.series(name, i)
        k = len(onset)
        for (st, sc), c in zip(series[:k], onset):
            t = st[st <= c]
            if k == len(series) or t.size == 0:
                leads.append(math.nan)
                continue
            thr = np.vstack([score_at(*nj, t) for nj in series[k:]])
            with np.errstate(invalid="ignore"):
                above = np.all(np.isfinite(thr), 0) & (score_at(st, sc, t) > np.max(thr, 0))
            off = np.flatnonzero(~above)  # warned from the step after the last miss through the onset
            first = 0 if off.size == 0 else off[-1] + 1
            leads.append(float(c - t[first]) if first < t.size else math.nan)
    return {"leads": leads}


def warning_table(steps, leads=LEADS, *, n_permutations: int = N_PERMUTATIONS, n_boot: int = N_BOOT,
                  seed: int = SEED):
    """One row per (lr or "all", statistic): role, direction, matched AUC with interval and label-permutation p at
    each lead, the paired difference to the reward at each lead (interval, Venkatraman-Begg p, label p), runs
    warned >= 5 steps ahead (time-matched zero false alarms) and the median lead."""
    import pandas as pd

    runs = steps if isinstance(steps, _Runs) else _Runs(steps)
    kw = dict(n_permutations=n_permutations, n_boot=n_boot, seed=seed)
    rows = []
    for lr in ["all"] + [g[0] for g in runs.lrs]:
        sel = None if lr == "all" else lr
        parts = [g for g in runs.lrs if sel is None or g[0] == sel]
        n_pos = sum(len(g[2]) for g in parts)
        for name, s in STATISTICS.items():
            r = {"lr": lr, "statistic": name, "role": s.role, "direction": "high" if s.direction > 0 else "low",
                 "n_collapsed": n_pos, "n_negative": sum(len(g[1]) for g in parts) - n_pos}
            for L in leads:
                e = matched_auc(runs, name, L, lr=sel, **kw)
                r.update({f"auc_L{L}": e.estimate if e else math.nan, f"lo_L{L}": e.lo if e else math.nan,
                          f"hi_L{L}": e.hi if e else math.nan, f"p_L{L}": e.p if e else math.nan,
                          f"pairs_L{L}": e.n_pairs if e else 0})
                d = None if name == BASELINE else matched_auc(runs, name, L, versus=BASELINE, lr=sel, **kw)
                r.update({f"vs_reward_L{L}": d.estimate if d else math.nan, f"vs_lo_L{L}": d.lo if d else math.nan,
                          f"vs_hi_L{L}": d.hi if d else math.nan, f"vs_p_L{L}": d.p if d else math.nan,
                          f"vs_p_labels_L{L}": d.p_perm_labels if d else math.nan})
            ls = np.array(lead_times(runs, name, lr=sel)["leads"], dtype=float)
            r["warned_ge5"] = int(np.sum(ls >= 5))
            r["median_lead"] = float(np.nanmedian(ls)) if np.isfinite(ls).any() else math.nan
            rows.append(r)
    return pd.DataFrame(rows)


def _claim(cid, spec, setting, statistic, e: MatchedAUC | None, *, empty_estimate: float) -> Claim:
    common = dict(id=cid, source=spec.source, statement=spec.statement, setting=setting, statistic=statistic,
                  criterion_text=f"{statistic}; run-cluster bootstrap percentile interval, permutation p: "
                                 f"{spec.criterion_text}", criterion=spec.criterion, form=spec.form,
                  primary=spec.primary, key=spec.key, role=spec.role, criteria_hash=CRITERIA_HASH)
    if e is None:
        return Claim(estimate=empty_estimate, interval=(empty_estimate, empty_estimate), n=1, measured=False,
                     reason="no matched (positive, negative) pair within an lr", **common)
    return Claim(estimate=e.estimate, interval=(e.lo, e.hi), n=e.n_pos + e.n_neg, p_value=e.p, p_adjusted=e.p,
                 **common)


def warning_claims(steps, *, n_permutations: int = N_PERMUTATIONS, n_boot: int = N_BOOT, seed: int = SEED,
                   block: str = "discovery") -> list[Claim]:
    """The :data:`SPECS` claims: the primaries (pooled over lrs, pairs within lr; Holm over them) and the
    exploratory AUC-vs-1/2 rows per statistic, lead and lr."""
    kw = dict(n_permutations=n_permutations, n_boot=n_boot, seed=seed)
    lab = steps if isinstance(steps, _Runs) else _Runs(steps)
    claims = []
    for name in PRIMARY:
        cid = f"llm.warning.{name}_beats_reward"
        e = matched_auc(lab, name, PRIMARY_LEAD, versus=BASELINE, **kw)
        stat = f"matched AUC({name}) - matched AUC(reward) at lead {PRIMARY_LEAD}"
        claims.append(_claim(cid, SPECS[cid], f"all lrs, pairs within lr, lead {PRIMARY_LEAD}", stat, e,
                             empty_estimate=0.0))
    spec = SPECS["llm.warning.auc_above_chance"]
    for lr in [g[0] for g in lab.lrs]:
        for name in STATISTICS:
            for L in LEADS:
                e = matched_auc(lab, name, L, lr=lr, **kw)
                claims.append(_claim(f"llm.warning.auc_above_chance/{name}@L{L}_lr{lr:g}", spec,
                                     f"lr={lr:g}, lead {L}", f"matched AUC({name}) at lead {L}", e,
                                     empty_estimate=0.5))
    return holm_adjust_claims([replace(c, block=block) for c in claims])


# ---- a synthetic DGP with a known matched AUC: the interval's coverage ------------------------------------------
def simulate_steps(rng: np.random.Generator, groups=((20, 80),), *, deltas=(1.0,), tau: float = 0.5,
                   sigma: float = 1.0, steps: int = 100, probe_every: int = 5, onsets=(30, 90)):
    """A step frame with columns run, lr, step, collapsed, collapse_step, outcome and sim0, sim1, ... (one per
    delta): groups = (n_pos, n_neg) per lr; sim_d(run, t) = b_run + e_(run, t) + delta_d 1[positive], b ~ N(0,
    tau^2) per run (the cluster effect), e ~ N(0, sigma^2) per probed step (logged every probe_every steps);
    onsets uniform on [onsets[0], onsets[1]]."""
    import pandas as pd

    t = np.arange(0, steps, probe_every)
    pos = np.concatenate([np.arange(n_pos + n_neg) < n_pos for n_pos, n_neg in groups])
    lr = np.concatenate([np.full(n_pos + n_neg, 1e-4 * (g + 1)) for g, (n_pos, n_neg) in enumerate(groups)])
    n = pos.size
    onset = np.where(pos, rng.integers(onsets[0], onsets[1] + 1, n), -1)
    cols = {"run": np.repeat(np.arange(n), t.size), "lr": np.repeat(lr, t.size), "step": np.tile(t, n),
            "collapsed": np.repeat(pos, t.size), "collapse_step": np.repeat(onset, t.size),
            "outcome": np.repeat(np.where(pos, "collapsed", "healthy"), t.size)}
    for j, delta in enumerate(deltas):
        sim = rng.normal(0, tau, (n, 1)) + rng.normal(0, sigma, (n, t.size)) + delta * pos[:, None]
        cols[f"sim{j}"] = sim.ravel()
    return pd.DataFrame(cols)


def true_matched_auc(delta: float, *, tau: float = 0.5, sigma: float = 1.0) -> float:
    """P(s_i(t) > s_j(t)) for a positive i and a negative j of :func:`simulate_steps`: the difference is
    N(delta, 2 tau^2 + 2 sigma^2), so AUC = Phi(delta / sqrt(2 (tau^2 + sigma^2)))."""
    from scipy.stats import norm

    return float(norm.cdf(delta / math.sqrt(2 * (tau * tau + sigma * sigma))))


def bootstrap_coverage(groups=((20, 80), (50, 50), (80, 20)), *, deltas=(1.0, 0.5), n_sets: int = 500,
                       n_boot: int = 1000, lead: int = 10, seed: int = 0, tau: float = 0.5, sigma: float = 1.0) -> dict:
    """Share of simulated studies (:func:`simulate_steps`) whose 95 % run-cluster bootstrap interval contains the
    true matched AUC of sim0 and the true difference AUC(sim0) - AUC(sim1), with their Monte Carlo standard errors."""
    if isinstance(n_sets, bool) or not isinstance(n_sets, int) or n_sets < 1:
        raise ValueError(f"n_sets must be a positive integer, got {n_sets!r}")
    rng = np.random.default_rng(seed)
    a0 = true_matched_auc(deltas[0], tau=tau, sigma=sigma)
    d01 = a0 - true_matched_auc(deltas[1], tau=tau, sigma=sigma)
    sims = {f"sim{j}": Statistic(f"sim{j}", 1, +1, "synthetic") for j in range(len(deltas))}
    hit_auc = hit_diff = 0
    for _ in range(n_sets):
        df = _Runs(simulate_steps(rng, groups, deltas=deltas, tau=tau, sigma=sigma))
        s = int(rng.integers(2**31))
        e = matched_auc(df, sims["sim0"], lead, n_permutations=1, n_boot=n_boot, seed=s)
        d = matched_auc(df, sims["sim0"], lead, versus=sims["sim1"], n_permutations=1, n_boot=n_boot, seed=s)
        hit_auc += e.lo <= a0 <= e.hi
        hit_diff += d.lo <= d01 <= d.hi
    se = lambda h: math.sqrt(max(h / n_sets * (1 - h / n_sets), 1e-12) / n_sets)  # noqa: E731
    return {"groups": [list(g) for g in groups], "true_auc": a0, "true_diff": d01, "n_sets": n_sets,
            "coverage_auc": hit_auc / n_sets, "se_auc": se(hit_auc), "coverage_diff": hit_diff / n_sets,
            "se_diff": se(hit_diff)}


def study_runs(study, methods=("grpo", "wapo"), seeds=None) -> tuple[list[Path], str]:
    """The run folders the benchmark reads: the study's runs of ``methods`` (the pre-declared design: GRPO and WAPO;
    with ``seeds``, of those seeds only), and of those only the confirmation block's (seeds >=
    llm_probe.experiments._study.CONFIRMATION_START) when the study has one; returns (folders, block)."""
    from ._study import RESULT, block_of, finished_runs

    done = {d: json.loads((d / RESULT).read_text()) for d in finished_runs(study, seeds)}
    keep = [d for d, r in done.items() if r["method"] in methods]
    conf = [d for d in keep if block_of([done[d]["seed"]]) == "confirmation"]
    return (conf, "confirmation") if conf else (keep, "discovery")


def report(study, seeds=None) -> None:
    """``gapdyn train early-warning --from DIR [--seeds ...]``: write DIR/early_warning.csv (:func:`warning_table`)
    and DIR/early_warning_claims.json / .md (:func:`warning_claims`) on the runs :func:`study_runs` selects (of
    ``seeds`` only when given), print both (the command line is llm_probe.cli's)."""
    import pandas as pd

    study = Path(study)
    runs, block = study_runs(study, seeds=seeds)
    if not runs:
        raise ValueError(f"no finished GRPO or WAPO run under {study}/runs" + ("" if seeds is None else
                                                                               f" of seeds {list(seeds)}"))
    steps = load_study_steps(runs)
    steps = _Runs(steps)
    tab = warning_table(steps)
    write_with(study / "early_warning.csv", lambda tmp: tab.to_csv(tmp, index=False))
    claims = [replace(c, block=block) for c in warning_claims(steps)]
    atomic_write_text(study / "early_warning_claims.json", claims_to_json(claims))
    atomic_write_text(study / "early_warning_claims.md", claims_markdown(claims) + "\n")
    cols = ["lr", "statistic", "role", "auc_L0", "auc_L5", "auc_L10", "lo_L10", "hi_L10", "p_L10", "vs_reward_L10",
            "vs_p_L10", "warned_ge5", "n_collapsed", "n_negative"]
    with pd.option_context("display.width", 250, "display.max_columns", 30, "display.precision", 3):
        print(tab[cols].to_string(index=False))
    for c in (c for c in claims if c.primary):
        print(f"{c.id}: {c.estimate:+.3f} [{c.interval[0]:+.3f}, {c.interval[1]:+.3f}] p_adj={c.p_adjusted:.3g} "
              f"-> {c.verdict}" if c.measured else f"{c.id}: {c.why}")
    print(f"{len(runs)} runs ({block} block, GRPO and WAPO); wrote {study / 'early_warning.csv'}, "
          f"{study / 'early_warning_claims.json'}, "
          f"{study / 'early_warning_claims.md'}")


if __name__ == "__main__" and "--coverage" in sys.argv:
    for groups in (((20, 80), (50, 50), (80, 20)), ((3, 7), (5, 5), (7, 3))):
        print(json.dumps(bootstrap_coverage(groups)), flush=True)
