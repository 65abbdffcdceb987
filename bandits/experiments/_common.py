"""Helpers shared by the contextual-bandit experiments: the runner's blocks (:mod:`gapdyn.evidence.runner`) over
:func:`gapdyn.evidence.sweep.run_sweep`, claim builders with intervals
(docs/evidence.md), and a few outcome helpers.

A run's outcome is gapdyn's (``gapdyn.bandit_outcome``: collapsed when J < 1e-3 at every state of the last
quarter of the horizon, dipped, converged or undecided; docs/evidence.md); :func:`run_stats` reads what
decides it from an engine trajectory.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

import gapdyn
from gapdyn.evidence.coverage import MEAN_INTERVAL
from gapdyn.evidence.runner import (CONFIRMATION_MIN, BlockPlan, ExperimentResult, experiment_blocks,  # noqa: F401
                           plan_confirmation, stamp_claims)

CONVERGE_J = gapdyn.CONVERGED_J
"""A run whose J exceeds this over the last quarter ends converged (gapdyn.CONVERGED_J)."""


def run_stats(tr, context: int | None = None) -> gapdyn.RunStats:
    """gapdyn.RunStats of every run of a trajectory. Engine (contextual): of one context's J, or (None) of the
    mean over contexts, the success rate of a multi-context bandit. Sequence bandit: of its J (context None)."""
    if np.ndim(tr.J_min) == 1:
        if context is not None:
            raise ValueError("a sequence-bandit trajectory has one J per run: pass context=None")
        vals = (tr.J_min, tr.J_tail_min, tr.J_tail_max)
    elif context is None:
        vals = (tr.Jbar_min, tr.Jbar_tail_min, tr.Jbar_tail_max)
    else:
        vals = (tr.J_min[:, context], tr.J_tail_min[:, context], tr.J_tail_max[:, context])
    return gapdyn.RunStats(*(np.clip(v, 0.0, 1.0) for v in vals))


def steps_to(J: np.ndarray, steps: np.ndarray, level: float) -> np.ndarray:
    """First recorded step with J >= level along the step axis (J [..., n_rec]); inf if never."""
    hit = J >= level
    idx = np.argmax(hit, axis=-1)
    return np.where(hit.any(axis=-1), steps[idx], np.inf)


def first_below(J: np.ndarray, steps: np.ndarray, level: float) -> np.ndarray:
    """First recorded step with J < level (J [..., n_rec]); inf if never."""
    hit = J < level
    return np.where(hit.any(axis=-1), steps[np.argmax(hit, axis=-1)], np.inf)


# --- claims with intervals ---------------------------------------------------------------------


def no_data(lo: float, hi: float, reason: str = "") -> gapdyn.Estimate:
    """The estimate of a statistic that could not be measured: :func:`gapdyn.evidence.stats.not_measured` on [lo, hi]
    (the claim is then "not measured", with ``reason``)."""
    from gapdyn.evidence.stats import not_measured

    return not_measured(lo, hi, reason)


PROPORTION_INTERVAL = "clopper_pearson"


def too_few(method: str, n: int, lo: float, hi: float) -> gapdyn.Estimate:
    """The unmeasured estimate of a claim whose interval method is not valid at n (docs/evidence.md §9)."""
    from gapdyn.evidence.coverage import too_few_reason

    return no_data(lo, hi, too_few_reason(method, n, "instances"))


def proportion(k, n, *, exact: bool = True) -> gapdyn.Estimate:
    """k/n with the Clopper-Pearson interval (valid from n = 4 in docs/coverage.md; ``exact`` is kept for
    the callers' signature: Wilson is not valid at the n the claims use, so it is never chosen);
    n = 0 gives :func:`no_data` on [0, 1]."""
    from gapdyn.evidence.coverage import valid_at

    if int(n) == 0:
        return no_data(0.0, 1.0, "no qualifying trials")
    if not valid_at(PROPORTION_INTERVAL, int(n)):
        return too_few(PROPORTION_INTERVAL, int(n), 0.0, 1.0)
    return gapdyn.clopper_pearson_interval(int(k), int(n))


CLUSTERED_PROPORTION_INTERVAL = "cluster_bounds_proportion"


def clustered_proportion(events, clusters) -> gapdyn.Estimate:
    """P(event) of a run on a random instance, runs (seeds, etas) nested in instances: the cluster bounds
    of gapdyn.evidence.stats.cluster_bounds_proportion (valid whatever the within-instance correlation; a pooled
    Clopper-Pearson over runs covers 0.2-0.5 under such correlation, docs/coverage.md), gated by its coverage."""
    from gapdyn.evidence.coverage import valid_at

    e = np.asarray(events, dtype=bool)
    labels = np.asarray(clusters)
    G = int(np.unique(labels).size) if e.size else 0
    if G < 2:
        return no_data(0.0, 1.0, f"fewer than 2 instances with runs ({G})")
    if not valid_at(CLUSTERED_PROPORTION_INTERVAL, G):
        return too_few(CLUSTERED_PROPORTION_INTERVAL, G, 0.0, 1.0)
    return gapdyn.evidence.stats.cluster_bounds_proportion(e.astype(np.int8), labels)


def exists_on_some_instance(events, clusters, *, confidence: float = 0.95) -> gapdyn.Estimate:
    """An existence claim "P(event) > 0 on a realisable setting": the event share on the instance with the
    most events, with its Clopper-Pearson interval at confidence 1 - (1 - confidence) / G (Bonferroni over the
    G instances searched), so the family of G per-instance intervals covers at ``confidence``."""
    from gapdyn.evidence.coverage import valid_at

    e = np.asarray(events, dtype=bool)
    labels = np.asarray(clusters)
    if e.size == 0:
        return no_data(0.0, 1.0, "no runs")
    uniq, inv = np.unique(labels, return_inverse=True)
    k = np.bincount(inv, weights=e.astype(float), minlength=uniq.size)
    n = np.bincount(inv, minlength=uniq.size)
    best = int(np.argmax(k / n))
    if not valid_at(PROPORTION_INTERVAL, int(n[best])):
        return too_few(PROPORTION_INTERVAL, int(n[best]), 0.0, 1.0)
    c = 1.0 - (1.0 - confidence) / uniq.size
    est = gapdyn.clopper_pearson_interval(int(k[best]), int(n[best]), confidence=c)
    return gapdyn.Estimate(est.estimate, est.lo, est.hi, int(n[best]), confidence,
                           f"Clopper-Pearson on instance {uniq[best]} (most events; Bonferroni over {uniq.size})")


def mean_estimate(values, clusters=None, *, seed: int, natural: tuple[float, float]) -> gapdyn.Estimate:
    """Mean of per-cluster means with the studentized cluster bootstrap (default_rng(seed)), when that method
    is valid at the number of clusters (gapdyn.evidence.coverage.valid_at); otherwise not measured, with the reason."""
    from gapdyn.evidence.coverage import valid_at
    from gapdyn.evidence.stats import studentized_cluster_bootstrap_mean

    v = np.asarray(values, dtype=float)
    labels = np.arange(v.size) if clusters is None else np.asarray(clusters)
    ok = np.isfinite(v)
    v, labels = v[ok], labels[ok]
    G = int(np.unique(labels).size)
    if G < 2:
        return no_data(*natural, f"fewer than 2 instances with a finite value ({G})")
    if not valid_at(MEAN_INTERVAL, G):
        return too_few(MEAN_INTERVAL, G, *natural)
    est = studentized_cluster_bootstrap_mean(v, labels, rng=np.random.default_rng(seed))
    if not all(math.isfinite(x) for x in (est.estimate, est.lo, est.hi)):
        _, means = gapdyn.evidence.stats._values_and_clusters(v, labels)
        if np.ptp(means) == 0:
            return no_data(*natural, f"no interval: every one of the {G} instances has the same value "
                                     f"({float(means[0]):.4g})")
        return no_data(*natural, "the interval is not finite (values too sparse: bootstrap resamples without "
                                 "spread)")
    return est


def bootstrap(statistic, *arrays, clusters=None, seed: int, natural: tuple[float, float]) -> gapdyn.Estimate:
    """An interval for ``statistic`` over instances with a method whose coverage is measured.

    A mean (``np.mean``) goes to :func:`mean_estimate`. Any other statistic (a median, a rank correlation, a
    geometric mean: pass its log to np.mean instead) has no interval method with measured coverage
    (docs/coverage.md), so the claim is not measured and says so rather than printing a percentile-bootstrap
    interval whose coverage at these n is 0.8-0.9.
    """
    if statistic is np.mean and len(arrays) == 1:
        return mean_estimate(arrays[0], clusters, seed=seed, natural=natural)
    name = getattr(statistic, "__name__", "statistic").strip("_")
    return no_data(*natural, f"no interval method with measured coverage for this statistic ({name}); "
                             "docs/coverage.md")


def make_claim(specs, claim_id: str, est: gapdyn.Estimate, *, block: str, setting: str, statistic: str,
               p_value: float | None = None) -> gapdyn.Claim:
    """A claim judged by its frozen :class:`gapdyn.ClaimSpec` (``specs``: the experiment's
    ``{claim id: ClaimSpec}``, written before any run): source, statement, form and criterion come from the
    spec. A test's p_adjusted starts as its p-value; :func:`stamp_claims` replaces it by the Holm-adjusted
    one over the block."""
    if claim_id not in specs:
        raise ValueError(f"claim {claim_id!r} is not declared (declared: {sorted(specs)})")
    spec = specs[claim_id]
    return gapdyn.Claim.from_estimate(
        est, id=claim_id, source=spec.source, statement=spec.statement, setting=setting, statistic=statistic,
        criterion_text=spec.criterion_text, criterion=spec.criterion, block=block, p_value=p_value,
        p_adjusted=p_value, form=spec.form, primary=spec.primary, key=spec.key, role=spec.role,
    )


# The blocks (discovery, the planned confirmation block, stamped claims) are the runner's (gapdyn.evidence.runner,
# re-exported above); the bandit experiments run them through the resumable parquet sweep.
def run_experiment(experiment, config, *, store=None, backend="joblib", n_jobs=-1,
                   progress=True) -> ExperimentResult:
    """:func:`gapdyn.evidence.runner.run_experiment` with the sweep of :func:`gapdyn.evidence.sweep.run_sweep` (resumable)."""
    from gapdyn.evidence.runner import run_experiment as run_blocks

    from gapdyn.evidence.sweep import run_sweep

    return run_blocks(experiment, config, sweep=run_sweep, store=store, backend=backend, n_jobs=n_jobs,
                      progress=progress)


def run_cells_serial(experiment, config, instances=None) -> pd.DataFrame:
    """All cells of one block (default: discovery) in-process, without the sweep machinery (tests, debugging).
    ``experiment``: a gapdyn.evidence.experiment.Experiment (or anything with its ``cells`` and ``run_cell``)."""
    frames = []
    cells = experiment.cells(config) if instances is None and not hasattr(config, "instances") else \
        experiment.cells(config, tuple(config.instances if instances is None else instances))
    for cell in cells:
        df = experiment.run_cell(**cell)
        for k, v in cell.items():
            if k not in df.columns:
                df[k] = [v] * len(df) if not isinstance(v, (list, tuple, dict)) else [str(v)] * len(df)
        frames.append(df)
    return pd.concat(frames, ignore_index=True)
