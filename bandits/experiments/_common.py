"""Helpers shared by the contextual-bandit experiments: the run wrapper around
:func:`bandits.sweep.run_sweep` (two blocks, frozen CRITERIA), claim builders with intervals
(docs/evidence.md), and a few outcome helpers.

A run's outcome is gapdyn's (``gapdyn.run_outcome``: collapsed when J < 1e-3 at every state of the last
quarter of the horizon, dipped, converged or undecided; docs/evidence.md); :func:`run_stats` reads what
decides it from an engine trajectory.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

import gapdyn

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


def no_data(lo: float, hi: float) -> gapdyn.Estimate:
    """The estimate of a statistic that could not be computed: its whole natural range, n = 1.

    The interval spans the statistic's range, so the verdict is "inconclusive" (or, for a range that
    already violates the criterion, "does not hold"); the claim's statistic text says why.
    """
    return gapdyn.Estimate((lo + hi) / 2, lo, hi, 1, 0.95, "no data")


def proportion(k, n, *, exact: bool = True) -> gapdyn.Estimate:
    """k/n with a Clopper-Pearson (exact) or Wilson interval; n = 0 gives :func:`no_data` on [0, 1]."""
    if int(n) == 0:
        return no_data(0.0, 1.0)
    f = gapdyn.clopper_pearson_interval if exact else gapdyn.wilson_interval
    return f(int(k), int(n))


def bootstrap(statistic, *arrays, clusters=None, seed: int, natural: tuple[float, float]) -> gapdyn.Estimate:
    """gapdyn.cluster_bootstrap over instances (2000 resamples, default_rng(seed)); :func:`no_data` on
    ``natural`` when fewer than two clusters or the statistic is undefined."""
    data = [np.asarray(a) for a in arrays]
    labels = np.arange(len(data[0])) if clusters is None else np.asarray(clusters)
    if len(data[0]) < 2 or np.unique(labels).size < 2:
        return no_data(*natural)
    try:
        est = gapdyn.cluster_bootstrap(statistic, *data, clusters=labels, rng=np.random.default_rng(seed))
    except ValueError:
        return no_data(*natural)
    if not all(math.isfinite(v) for v in (est.estimate, est.lo, est.hi)):
        return no_data(*natural)
    return est


def make_claim(module, claim_id: str, est: gapdyn.Estimate, *, block: str, setting: str, statistic: str,
               p_value: float | None = None) -> gapdyn.Claim:
    """A claim of ``module`` judged by ``module.CRITERIA[claim_id]``; source and statement from
    ``module.STATEMENTS[claim_id]`` (written with the criteria, before any run). A test's p_adjusted starts
    as its p-value; :func:`stamp_claims` replaces it by the Holm-adjusted one over the block."""
    source, statement = module.STATEMENTS[claim_id]
    crit = module.CRITERIA[claim_id]
    return gapdyn.Claim.from_estimate(
        est, id=claim_id, source=source, statement=statement, setting=setting, statistic=statistic,
        criterion_text=crit.describe(), criterion=crit, block=block, p_value=p_value, p_adjusted=p_value,
        form=module.FORMS[claim_id],
    )


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


def run_cells_serial(module, config, instances=None) -> pd.DataFrame:
    """All cells of one block (default: discovery) in-process, without the sweep machinery (tests, debugging)."""
    frames = []
    cells = module.cells(config) if instances is None and not hasattr(config, "instances") else \
        module.cells(config, tuple(config.instances if instances is None else instances))
    for cell in cells:
        df = module.run_cell(**cell)
        for k, v in cell.items():
            if k not in df.columns:
                df[k] = [v] * len(df) if not isinstance(v, (list, tuple, dict)) else [str(v)] * len(df)
        frames.append(df)
    return pd.concat(frames, ignore_index=True)
