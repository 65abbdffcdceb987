"""Experiment: WAPO's token taxonomy (arXiv 2606.16154) on random softmax positions.

One instance = one seed drawing ``n_tokens`` positions: logits z = sigma N(0, I_V) with log sigma uniform
over [sigma_lo, sigma_hi] (flat to peaked distributions) and a token s sampled from p = softmax(z), as in
training. :func:`gapdyn.token_step_effects` gives the exact first-order Delta H and Delta p_s of one update
eta A (e_s - p) and the bin (peak: p_s >= C = sum_k p_k^2; valley: p_s < C; crossed with the sign of A).

Claims:
- ``taxonomy.bin_predicts_sign``: the share of sampled tokens whose bin predicts the exact sign of Delta H
  (Wilson interval over tokens; A = -1 flips every sign alike, so the A = +1 rows decide).
- ``taxonomy.valley_never_disagrees``: identity. A valley token always has sign(Delta H) = sign(A) (derived;
  proof in the ``gapdyn/theory/taxonomy.py`` docstring, docs/theory.md §9.1): the count of disagreeing valley
  tokens is 0 by construction; a nonzero count would reveal a defect.
- ``taxonomy.misses_near_boundary``: the share of mispredicted tokens with 0 <= p_s - C < ``miss_margin``
  (Wilson interval over misses).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

import gapdyn
from gapdyn.evidence.claims import keyed_specs
from gapdyn.evidence.experiment import Experiment, claim_specs

from ._common import make_claim, run_experiment

NAME = "taxonomy"

BIN_DH_SIGN: dict[str, int] = {"pos_peak": -1, "pos_valley": +1, "neg_peak": +1, "neg_valley": -1}
"""The sign of Delta H that each WAPO bin predicts (sharpening, rising, rising, falling)."""

_SOURCE = "WAPO (arXiv 2606.16154), token taxonomy"
CRITERIA: dict[str, gapdyn.Criterion] = {
    "taxonomy.bin_predicts_sign": gapdyn.Criterion.above(0.9),
    "taxonomy.valley_never_disagrees": gapdyn.Criterion.identity(0.0, tol=0.0),
    "taxonomy.misses_near_boundary": gapdyn.Criterion.above(0.9),
}
FORMS: dict[str, str] = {
    "taxonomy.bin_predicts_sign": "derived",  # first-order softmax algebra on a chosen logit distribution
    "taxonomy.valley_never_disagrees": "identity",
    "taxonomy.misses_near_boundary": "derived",
}
"""The form of each claim's statement (gapdyn.FORMS)."""
STATEMENTS: dict[str, tuple[str, str]] = {
    "taxonomy.bin_predicts_sign": (_SOURCE, "the WAPO bin (peak/valley x sign of A) predicts the exact sign of the "
                                            "first-order dH for the large majority of sampled tokens"),
    "taxonomy.valley_never_disagrees": (_SOURCE + "; derived (docs/theory.md §9.1)",
                                        "valley tokens (p_s < C) never disagree with the exact sign of dH"),
    "taxonomy.misses_near_boundary": (_SOURCE, "the tokens whose bin mispredicts sit just above the boundary "
                                               "p_s = C"),
}
KEYS = {cid: (("WAPO", "token taxonomy"), "test") for cid in STATEMENTS}
"""Claim id -> (statement key, role) (gapdyn.evidence.claims.STATEMENTS, ROLES)."""
SPECS = keyed_specs(claim_specs(STATEMENTS, CRITERIA, FORMS), KEYS)
"""Every claim's frozen gapdyn.ClaimSpec, by claim id."""


@dataclass(frozen=True)
class Config:
    """Taxonomy settings: ``n_tokens`` positions per instance, vocabulary ``vocab``, logit scales."""

    mode: str = "quick"
    instances: tuple[int, ...] = gapdyn.DISCOVERY_SEEDS
    confirmation: tuple[int, ...] = ()
    n_tokens: int = 2000
    vocab: int = 32
    sigma_lo: float = 0.05
    sigma_hi: float = 8.0
    miss_margin: float = 0.05

    @classmethod
    def test(cls) -> Config:
        return cls(mode="test", instances=(0, 1, 2), n_tokens=300)

    @classmethod
    def quick(cls) -> Config:
        return cls(mode="quick")

    @classmethod
    def full(cls) -> Config:
        return cls(mode="full", n_tokens=10000, confirmation=gapdyn.CONFIRMATION_SEEDS)


def taxonomy_table(n_tokens: int = 20000, *, vocab: int = 32, seed: int = 0,
                   sigma_range: tuple[float, float] = (0.05, 8.0)) -> pd.DataFrame:
    """First-order effects of one token update for random positions, one row per (position, sign of A).

    For A = +1 and A = -1 (eta = 1, weight 1) :func:`gapdyn.token_step_effects` gives Delta H, Delta p_s,
    the bin and the exact first-order sign of Delta H; ``bin_sign`` is the sign the bin predicts
    (:data:`BIN_DH_SIGN`), ``mispredicted`` marks tokens where the two differ.
    Columns: p_s, C, H, A, dH, dp_s, bin, sign_dH, bin_sign, mispredicted.
    """
    if isinstance(n_tokens, bool) or int(n_tokens) != n_tokens or n_tokens < 1:
        raise ValueError(f"n_tokens must be an integer >= 1, got {n_tokens!r}")
    if isinstance(vocab, bool) or int(vocab) != vocab or vocab < 2:
        raise ValueError(f"vocab must be an integer >= 2, got {vocab!r}")
    lo, hi = sigma_range
    if not (0 < lo < hi):
        raise ValueError(f"sigma_range must satisfy 0 < low < high, got {sigma_range}")
    rng = np.random.default_rng(seed)
    n, V = int(n_tokens), int(vocab)
    sigma = np.exp(rng.uniform(np.log(lo), np.log(hi), n))
    z = sigma[:, None] * rng.standard_normal((n, V))
    p = gapdyn.softmax(z)
    token = gapdyn.sample_group(p, 2, rng)[:, 0]
    H = gapdyn.token_entropy(gapdyn.log_softmax(z))
    frames = []
    for A in (1.0, -1.0):
        e = gapdyn.token_step_effects(z, token, A, 1.0)
        names = np.asarray(gapdyn.BIN_NAMES)[e.bin]
        bin_sign = np.array([BIN_DH_SIGN[b] for b in names])
        dp_s = np.take_along_axis(e.dp, token[:, None], axis=-1)[:, 0]
        frames.append(pd.DataFrame({
            "p_s": e.p_token, "C": e.collision, "H": H, "A": A, "dH": e.dH, "dp_s": dp_s, "bin": names,
            "sign_dH": e.entropy_sign.astype(int), "bin_sign": bin_sign, "mispredicted": e.entropy_sign != bin_sign,
        }))
    return pd.concat(frames, ignore_index=True)


def cells(config: Config, instances=None) -> list[dict]:
    seeds = config.instances if instances is None else instances
    return [{"instance": int(i), "n_tokens": config.n_tokens, "vocab": config.vocab, "sigma_lo": config.sigma_lo,
             "sigma_hi": config.sigma_hi} for i in seeds]


def run_cell(*, instance, n_tokens, vocab, sigma_lo, sigma_hi) -> pd.DataFrame:
    """The taxonomy table of one instance (seed = instance)."""
    return taxonomy_table(n_tokens, vocab=vocab, seed=instance, sigma_range=(sigma_lo, sigma_hi))


def summary(results: pd.DataFrame, *, margin: float = 0.05) -> dict[str, float]:
    """Descriptive numbers of a taxonomy table (A = +1 rows): counts, share of peak tokens, miss margins."""
    pos = results[results["A"] > 0]
    miss = pos[pos["mispredicted"].astype(bool)]
    valley = pos["bin"].str.endswith("valley")
    gap = miss["p_s"] - miss["C"]
    return {
        "n_tokens": int(len(pos)),
        "n_misses": int(len(miss)),
        "share_peak": float((~valley).mean()) if len(pos) else float("nan"),
        "valley_mispredicted": int((pos["mispredicted"].astype(bool) & valley).sum()),
        "misses_near_boundary": int(((gap >= 0) & (gap < margin)).sum()),
        "max_gap_of_misses": float(gap.max()) if len(miss) else 0.0,
    }


def analyse(results: pd.DataFrame, config: Config, *, block: str = "discovery") -> list[gapdyn.Claim]:
    s = summary(results, margin=config.miss_margin)
    n = s["n_tokens"]
    setting = (f"random softmax positions, V={config.vocab}, logit scale log-uniform in "
               f"[{config.sigma_lo:g}, {config.sigma_hi:g}], {results['instance'].nunique()} instances x "
               f"{config.n_tokens} tokens ({block})")
    claims = [make_claim(SPECS, "taxonomy.bin_predicts_sign", gapdyn.wilson_interval(n - s["n_misses"], n),
                         block=block, setting=setting,
                         statistic="share of sampled tokens whose bin predicts sign(dH) (Wilson)")]
    valley = SPECS["taxonomy.valley_never_disagrees"]
    claims.append(gapdyn.Claim(
        id="taxonomy.valley_never_disagrees", source=valley.source, statement=valley.statement, setting=setting,
        statistic="count of valley tokens whose bin mispredicts sign(dH)",
        estimate=float(s["valley_mispredicted"]), interval=(float(s["valley_mispredicted"]),) * 2, n=n,
        criterion_text=valley.criterion_text, criterion=valley.criterion, block=block, form=valley.form,
        key=valley.key, role=valley.role))
    if s["n_misses"]:
        claims.append(make_claim(SPECS, "taxonomy.misses_near_boundary",
                                 gapdyn.wilson_interval(s["misses_near_boundary"], s["n_misses"]), block=block,
                                 setting=setting,
                                 statistic=f"share of misses with 0 <= p_s - C < {config.miss_margin:g} (Wilson)"))
    return claims


def run(config: Config, *, store=None, backend="joblib", n_jobs=-1, progress=True):
    """ExperimentResult of both blocks (discovery, and confirmation in full mode)."""
    return run_experiment(EXPERIMENT, config, store=store, backend=backend, n_jobs=n_jobs,
                          progress=progress)


EXPERIMENT = Experiment(name=NAME, claims=SPECS, config=Config, cells=cells, run_cell=run_cell, analyse=analyse)
"""This experiment in the one protocol (gapdyn.evidence.experiment.Experiment)."""
