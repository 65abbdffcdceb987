"""The contextual bandit of the RLVR theory: C contexts (prompts), K arms (responses), binary rewards.

docs/equations.md §1 (setting) and Suk & Duan's bandit simulations (100 arms, log-linear policy):
- log-linear policy  pi(a | x) ~ exp(theta_{p(x)} . phi(x, a)),  phi(x, a) ~ N(0, feature_scale^2 I_d)
- tabular policy     phi(x, a) = e_a (d = K): theta_{p(x)} are the logits themselves
- r(x, a) = 1 on a set of ``n_correct`` arms per context, else 0.
- parameters are either per context (``shared=False``: C independent problems, p(x) = x) or one theta
  for all contexts (``shared=True``: p(x) = 0, so contexts interfere through theta).

Everything is generated from one explicit seed (``numpy.random.default_rng(seed)``); the dataclass is
frozen and its arrays are read-only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq

import gapdyn
from gapdyn._validate import as_float_array, as_rewards, check_int, check_open_unit, check_positive, check_seed

__all__ = ["ContextualBandit", "make_bandit", "place_theta", "KINDS"]

KINDS = ("loglinear", "tabular")


@dataclass(frozen=True)
class ContextualBandit:
    """A contextual bandit with binary rewards and a (log-)linear softmax policy class.

    Attributes:
        features: phi(x, a), shape [C, K, d] (tabular: identity rows, d = K).
        rewards: r(x, a) in {0, 1}, shape [C, K]; every context has a correct and an incorrect arm.
        shared: one parameter vector for all contexts (True) or one per context (False).
        kind: "loglinear" or "tabular".
        seed: the seed the instance was generated from (None for hand-built instances).
    """

    features: np.ndarray  # [C, K, d]
    rewards: np.ndarray  # [C, K]
    shared: bool = False
    kind: str = "loglinear"
    seed: int | None = None

    def __post_init__(self):
        phi = as_float_array(self.features, "features", min_ndim=3)
        if phi.ndim != 3:
            raise ValueError(f"features must have shape [C, K, d], got {phi.shape}")
        if phi.shape[1] < 2:
            raise ValueError(f"n_arms must be >= 2, got features with K = {phi.shape[1]}")
        r = as_rewards(self.rewards, phi.shape[:2]).astype(np.float64)
        n_pos = r.sum(axis=1)
        if np.any(n_pos == 0) or np.any(n_pos == phi.shape[1]):
            raise ValueError("rewards must give every context at least one correct and one incorrect arm")
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        phi, r = np.ascontiguousarray(phi).copy(), np.ascontiguousarray(r).copy()
        phi.flags.writeable = False
        r.flags.writeable = False
        object.__setattr__(self, "features", phi)
        object.__setattr__(self, "rewards", r)
        object.__setattr__(self, "shared", bool(self.shared))

    # --- shapes -------------------------------------------------------------------------------
    @property
    def n_contexts(self) -> int:
        return self.features.shape[0]

    @property
    def n_arms(self) -> int:
        return self.features.shape[1]

    @property
    def dim(self) -> int:
        return self.features.shape[2]

    @property
    def n_params(self) -> int:
        """Number of parameter blocks P (1 if shared, else C)."""
        return 1 if self.shared else self.n_contexts

    @property
    def param_map(self) -> np.ndarray:
        """p(x): the parameter block each context uses, shape [C] (int64)."""
        return np.zeros(self.n_contexts, np.int64) if self.shared else np.arange(self.n_contexts, dtype=np.int64)

    # --- policy quantities (gapdyn routes; used by reference.py and the experiments) ----------------
    def context_theta(self, theta) -> np.ndarray:
        """theta per context, [C, d], from parameter blocks [P, d]."""
        th = np.asarray(theta, dtype=np.float64)
        if th.shape != (self.n_params, self.dim):
            raise ValueError(f"theta must have shape {(self.n_params, self.dim)}, got {th.shape}")
        return th[self.param_map]

    def logits(self, theta) -> np.ndarray:
        """z(x, a) = theta_{p(x)} . phi(x, a), [C, K]."""
        return gapdyn.loglinear_logits(self.features, self.context_theta(theta))

    def log_odds(self, theta) -> np.ndarray:
        """Phi(x) = log J(x) - log(1 - J(x)), [C] (log-sum-exp route, finite for any theta)."""
        return gapdyn.log_odds_from_logits(self.logits(theta), self.rewards)

    def success_rate(self, theta) -> np.ndarray:
        """J(x) = sigmoid(Phi(x)), [C]."""
        from scipy.special import expit

        return expit(self.log_odds(theta))

    def gap(self, theta) -> np.ndarray:
        """Gradient Gap g+ - g- per context (= grad of Phi(x) w.r.t. theta_{p(x)}), [C, d]."""
        return gapdyn.gradient_gap_from_logits(self.logits(theta), self.rewards, self.features)

    def zeros(self) -> np.ndarray:
        """theta = 0 for every block, [P, d]."""
        return np.zeros((self.n_params, self.dim))


def make_bandit(
    *,
    n_contexts: int = 1,
    n_arms: int = 100,
    dim: int = 16,
    n_correct: int = 10,
    kind: str = "loglinear",
    shared: bool = False,
    feature_scale: float = 1.0,
    seed: int = 0,
) -> ContextualBandit:
    """Generate a bandit from ``seed``: Gaussian features (or tabular), ``n_correct`` random correct arms.

    Args:
        n_contexts: C >= 1 contexts (prompts).
        n_arms: K >= 2 arms (responses) per context (Suk & Duan: 100).
        dim: feature dimension d (ignored for ``kind="tabular"``, where d = K).
        n_correct: correct arms per context, 1 <= n_correct < K (chosen uniformly without replacement).
        kind: "loglinear" (phi ~ N(0, feature_scale^2)) or "tabular" (phi(x, a) = e_a).
        shared: one theta for all contexts (interference) instead of one per context.
        feature_scale: standard deviation of the Gaussian features.
        seed: the explicit seed of ``numpy.random.default_rng``.
    """
    C = check_int(n_contexts, "n_contexts", minimum=1)
    K = check_int(n_arms, "n_arms", minimum=2)
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    d = K if kind == "tabular" else check_int(dim, "dim", minimum=1)
    nc = check_int(n_correct, "n_correct", minimum=1)
    if nc >= K:
        raise ValueError(f"n_correct must be < n_arms = {K}, got {nc}")
    scale = check_positive(feature_scale, "feature_scale")
    seed = check_seed(seed, "seed")
    rng = np.random.default_rng(seed)
    if kind == "tabular":
        features = np.broadcast_to(np.eye(K), (C, K, K)).copy()
    else:
        features = scale * rng.normal(size=(C, K, d))
    rewards = np.zeros((C, K))
    for c in range(C):
        rewards[c, rng.choice(K, nc, replace=False)] = 1.0
    return ContextualBandit(features, rewards, shared=shared, kind=kind, seed=seed)


def place_theta(bandit: ContextualBandit, J0: float, *, direction=None, t_max: float = 100.0, seed: int = 0) -> np.ndarray:
    """theta [P, d] with J = J0 in every per-context block (a shared block: mean Phi = logit J0).

    Searches along rays theta = t v: first v = the block's Gap at theta = 0 (or ``direction``), then up to
    50 random Gaussian directions (``default_rng(seed)``) until Phi(t v) - logit(J0) changes sign on a grid
    t in [-t_max, t_max]; the crossing nearest t = 0 is refined by Brent's method. ValueError if no ray
    reaches J0.
    """
    J0 = float(check_open_unit(J0, "J0"))
    t_max = check_positive(t_max, "t_max")
    target = np.log(J0) - np.log1p(-J0)
    theta0 = bandit.zeros()
    rng = np.random.default_rng(check_seed(seed, "seed"))
    if direction is None:
        g = bandit.gap(theta0)  # [C, d]
        v0 = np.stack([g[bandit.param_map == p].mean(0) for p in range(bandit.n_params)])
    else:
        v0 = np.broadcast_to(np.asarray(direction, dtype=np.float64), theta0.shape).copy()
    pos = np.geomspace(1e-3, t_max, 48)
    grid = np.concatenate([-pos[::-1], [0.0], pos])
    out = np.zeros_like(theta0)
    for p in range(bandit.n_params):
        ctx = np.flatnonzero(bandit.param_map == p)
        fns = [gapdyn.loglinear_logodds_fn(bandit.features[c], bandit.rewards[c]) for c in ctx]
        for attempt in range(51):
            v = v0[p] if attempt == 0 else rng.normal(size=bandit.dim)
            v = v / max(float(np.linalg.norm(v)), 1e-300)

            def f(t, v=v, fns=fns):
                return float(np.mean([fn(t * v) for fn in fns])) - target

            vals = np.array([f(t) for t in grid])
            cross = np.flatnonzero(np.sign(vals[:-1]) != np.sign(vals[1:]))
            if cross.size:
                i = cross[np.argmin(np.minimum(np.abs(grid[cross]), np.abs(grid[cross + 1])))]
                out[p] = brentq(f, grid[i], grid[i + 1], xtol=1e-14) * v
                break
        else:
            raise ValueError(f"J0 = {J0} is not reachable along any tried direction for block {p}")
    return out
