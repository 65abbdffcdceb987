"""How many instances (or seeds) a claim needs for a decided verdict: power from a discovery block.

A verdict is *decided* when it is "holds" or "does not hold" (docs/evidence.md). The planner takes what
the discovery block measured (an effect and its spread, or a proportion), assumes it is the truth, and
finds the smallest n at which the confirmation block decides with probability >= ``power`` (default
0.8) under the interval rule the claim uses:

* mean / paired difference vs a criterion value c, decided on a two-sided t interval at ``confidence``:
  P(decided) = P(lo > c) + P(hi < c) = P(T > t*) + P(T < -t*) with the noncentral t
  T = (xbar - c) / (s / sqrt n) ~ nct(n - 1, delta), delta = (mu - c) sqrt(n) / sd,
  t* = t_{(1 + confidence)/2, n - 1};
* equivalence (a law's band [a, b], 90 % interval): P(holds) + P(does not hold) with the interval
  approximated at known sd (z for t);
* a proportion vs c (a bound's violation share, or a rate), decided on the exact Clopper-Pearson
  interval: an exact sum over k ~ Binomial(n, p);
* two proportions, one-sided Fisher at ``alpha`` (a comparison of collapse rates with n per arm):
  exact sum over both binomials of 1[p_Fisher < alpha].

A claim whose planned n exceeds ``n_max`` (the budget) is reported as not decidable at the budget, with
its planned n. scipy.stats supplies the distributions (imported inside the functions).

:func:`confirmation_size` is the one rule that turns the claims' planned n into the confirmation block's size
(every study's: gapdyn.evidence.runner.plan_confirmation for the bandit experiments, the tiny-Qwen ablation's
plan_seeds and the safe step study's make_plan call it).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

__all__ = ["Plan", "power_mean", "power_equivalence", "power_proportion", "power_two_proportions", "plan_n",
           "confirmation_size", "allocate"]


@dataclass(frozen=True)
class Plan:
    """Planned n for one claim.

    n: the smallest n in [n_min, n_max] with power >= target (n_max when none is); power: the power at
    n; decidable: power >= target within the budget; reason: one line for reports.
    """

    n: int
    power: float
    target: float
    decidable: bool
    reason: str


def _check_prob(v, name, *, open_=True) -> float:
    x = float(v)
    ok = (0 < x < 1) if open_ else (0 <= x <= 1)
    if not math.isfinite(x) or not ok:
        raise ValueError(f"{name} must lie in {'(0, 1)' if open_ else '[0, 1]'}, got {v!r}")
    return x


MAX_N_PROPORTION = 10**6
"""Largest n of :func:`power_proportion` (its exact sum holds n + 1 terms; ~10 s at the limit)."""
MAX_N_TWO_PROPORTIONS = 2000
"""Largest n of :func:`power_two_proportions` (its exact sum holds (n + 1)^2 tables; ~100 s at the limit)."""


def _check_n(n, name="n", low=2, high=None, high_text="") -> int:
    if isinstance(n, bool) or int(n) != n or n < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {n!r}")
    if high is not None and n > high:
        raise ValueError(f"{name} must be <= {high_text} (the exact sum is held in memory), got {n!r}")
    return int(n)


def power_mean(effect: float, sd: float, n: int, *, value: float = 0.0, confidence: float = 0.95) -> float:
    """P(the two-sided t interval of a mean of n units excludes ``value``) when the mean is ``effect``.

    The interval decides "holds" or "does not hold" for an above/below criterion at ``value`` exactly
    when it excludes it. Noncentral t: T ~ nct(n - 1, (effect - value) sqrt(n) / sd).
    """
    from scipy.stats import nct, t

    n = _check_n(n)
    c = _check_prob(confidence, "confidence")
    if not (math.isfinite(sd) and sd > 0):
        raise ValueError(f"sd must be a finite positive number, got {sd!r}")
    if not math.isfinite(effect - value):
        raise ValueError(f"effect and value must be finite, got {effect!r}, {value!r}")
    df = n - 1
    crit = float(t.ppf(0.5 + c / 2, df))
    delta = (effect - value) * math.sqrt(n) / sd
    p = float(nct.sf(crit, df, delta) + nct.cdf(-crit, df, delta))
    if not math.isfinite(p):  # scipy's nct fails far in the tail (|delta| >> crit): P(|T| > crit) -> 1 there
        p = float(nct.sf(crit, df, min(abs(delta), 37.0)))
    return p


def power_equivalence(effect: float, sd: float, n: int, *, lo: float, hi: float, confidence: float = 0.90) -> float:
    """P(the 90 % interval of a mean lies inside [lo, hi] or entirely outside it) at true mean ``effect``.

    Known-sd approximation: xbar ~ N(effect, sd^2 / n), half-width h = z se with the t quantile at n - 1.
    """
    from scipy.stats import norm, t

    n = _check_n(n)
    c = _check_prob(confidence, "confidence")
    if not (math.isfinite(sd) and sd > 0):
        raise ValueError(f"sd must be a finite positive number, got {sd!r}")
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ValueError(f"the band must satisfy lo < hi (finite), got [{lo!r}, {hi!r}]")
    se = sd / math.sqrt(n)
    h = float(t.ppf(0.5 + c / 2, n - 1)) * se
    inside = max(0.0, norm.cdf((hi - h - effect) / se) - norm.cdf((lo + h - effect) / se))
    outside = norm.cdf((lo - h - effect) / se) + norm.sf((hi + h - effect) / se)
    return float(min(1.0, inside + outside))


def _cp_bounds(k: np.ndarray, n: int, confidence: float, one_sided: bool) -> tuple[np.ndarray, np.ndarray]:
    from scipy.stats import beta

    a = 1 - confidence if one_sided else (1 - confidence) / 2
    with np.errstate(invalid="ignore"):
        lo = np.where(k == 0, 0.0, beta.ppf(a, k, n - k + 1))
        hi = np.where(k == n, 1.0, beta.ppf(1 - a, k + 1, n - k))
    return lo, hi


def power_proportion(p: float, n: int, *, value: float, confidence: float = 0.95, one_sided: bool = False) -> float:
    """P(the Clopper-Pearson interval of k ~ Binomial(n, p) excludes ``value``) (exact sum over k).

    one_sided: each bound at level 1 - confidence (a bound's upper limit on its violation share).
    """
    from scipy.stats import binom

    n = _check_n(n, low=1, high=MAX_N_PROPORTION, high_text="10**6")
    p = _check_prob(p, "p", open_=False)
    v = _check_prob(value, "value")
    c = _check_prob(confidence, "confidence")
    k = np.arange(n + 1)
    lo, hi = _cp_bounds(k, n, c, bool(one_sided))
    decided = (lo > v) | (hi < v)
    return float(binom.pmf(k, n, p)[decided].sum())


def power_two_proportions(p_hi: float, p_lo: float, n: int, *, alpha: float = 0.05) -> float:
    """Power of the one-sided Fisher exact test that arm A's rate exceeds arm B's, n runs per arm.

    True rates p_hi (arm A) and p_lo (arm B); exact sum over k_A, k_B of Binomial probabilities of the
    tables whose one-sided p = P(X >= k_A | margins) (hypergeometric) is below alpha.
    """
    from scipy.stats import binom, hypergeom

    n = _check_n(n, low=1, high=MAX_N_TWO_PROPORTIONS, high_text="2000")
    pa, pb = _check_prob(p_hi, "p_hi", open_=False), _check_prob(p_lo, "p_lo", open_=False)
    a = _check_prob(alpha, "alpha")
    ka, kb = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
    pval = hypergeom.sf(ka - 1, 2 * n, ka + kb, n)
    prob = binom.pmf(ka, n, pa) * binom.pmf(kb, n, pb)
    return float(prob[pval < a].sum())


def plan_n(power_at, *, target: float = 0.8, n_min: int = 20, n_max: int = 200) -> Plan:
    """Smallest n in [n_min, n_max] with power_at(n) >= target (a scan; power need not be monotone).

    power_at: n -> power, e.g. ``lambda n: power_mean(0.3, 1.0, n)``. n_min: the floor every decided
    verdict keeps (at least 20 instances, or the smallest n at which the claim's interval method is
    valid, whichever is larger).
    """
    if not callable(power_at):
        raise ValueError("power_at must be callable: n -> power")
    tgt = _check_prob(target, "target")
    lo = _check_n(n_min, "n_min", low=1)
    hi = _check_n(n_max, "n_max", low=1)
    if hi < lo:
        raise ValueError(f"n_max must be >= n_min={lo}, got {hi}")
    best = 0.0
    for n in range(lo, hi + 1):
        pw = float(power_at(n))
        if not (0.0 <= pw <= 1.0 + 1e-12):
            raise ValueError(f"power_at({n}) must be a probability, got {pw!r}")
        best = max(best, pw)
        if pw >= tgt:
            return Plan(n, pw, tgt, True, f"power {pw:.2f} at n = {n}")
    pw = float(power_at(hi))
    return Plan(hi, pw, tgt, False, f"not decidable within the budget: power {pw:.2f} at n = {hi} "
                                    f"(target {tgt:.2f}; best {best:.2f})")


def confirmation_size(planned, *, n_min: int, n_max: int | None = None, cost=None, budget: float | None = None):
    """The confirmation block's size from the planned n of its claims: the one sizing rule (docs/evidence.md, §8).

    Each claim k asks want_k = max(planned_k, floor), floor = min(n_min, n_max) (n_min without n_max);
    planned_k None (no plan: the claim asks only the floor) or ``math.inf`` (no n decides it: it asks the budget).
    The budget then caps the wants, in one of two forms, the studies' genuine difference:

    - a seed budget ``n_max`` (one block serves every claim: the bandit experiments, whose budget is the config's
      confirmation seeds, and the tiny-Qwen ablation, N_MAX seeds per arm): returns the int
      n = min(max_k want_k, n_max) (the floor when ``planned`` is empty);
    - a cost budget (each claim has its own seeds: the safe step study's lrs): ``cost`` {k: cost of one seed}
      and ``budget`` (what is left to spend) return {k: n_k} = :func:`allocate` (want, cost, budget).

    >>> confirmation_size({"a": 12, "b": None}, n_min=40, n_max=100)  # the floor
    40
    >>> confirmation_size({"a": 60, "b": math.inf}, n_min=40, n_max=100)  # b is not decidable: the budget
    100
    """
    if (n_max is None) == (cost is None and budget is None) or (cost is None) != (budget is None):
        raise ValueError("give either a seed budget n_max or a cost budget (cost and budget), not both")
    lo = _check_n(n_min, "n_min", low=1)
    if n_max is not None:
        hi = _check_n(n_max, "n_max", low=1)
        lo = min(lo, hi)
    want = {}
    for k, p in dict(planned).items():
        if p is not None and not (isinstance(p, numbers.Real) and not isinstance(p, bool) and p >= 0
                                  and (p == math.inf or int(p) == p)):
            raise ValueError(f"planned n of {k!r} must be a whole number >= 0, math.inf or None, got {p!r}")
        want[k] = lo if p is None else max(p if p == math.inf else int(p), lo)
    if n_max is not None:
        return int(min(max(want.values(), default=lo), hi))
    return allocate(want, cost, budget)


def allocate(want: dict, cost: dict, budget: float) -> dict:
    """Seeds per key within ``budget``: all of ``want`` when it fits; otherwise, cheapest total want first, each key
    gets at most an equal share of what is left, n_k = min(want_k, share // cost_k) (at least 0)."""
    if set(want) != set(cost) or any(cost[k] <= 0 for k in cost):
        raise ValueError("want and cost must have the same keys and cost must be > 0")
    budget = max(float(budget), 0.0)
    if sum(want[k] * cost[k] for k in want) <= budget:
        return {k: int(v) for k, v in want.items()}
    out, left = {}, budget
    keys = sorted(want, key=lambda k: want[k] * cost[k])
    for i, k in enumerate(keys):
        share = left / (len(keys) - i)
        out[k] = int(min(want[k], share // cost[k]))
        left -= out[k] * cost[k]
    return out
