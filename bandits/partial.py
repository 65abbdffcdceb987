"""A token-level sequence bandit with partially shared features across positions.

Setting of Suk & Duan (arXiv 2510.08539), Thm 3 (token level): one parameter vector theta [d] is
used at every position t = 0..T-1 of a fixed-length response, with position features

    phi_t(v) = sqrt(rho) phi(v) + sqrt(1 - rho) psi_t(v),      p_t(v) ~ exp(phi_t(v) . theta),

phi, psi_t i.i.d. N(0, 1) [V, d]. rho = 1 is the fully shared policy of
:class:`bandits.sequence.SharedSequenceBandit` (one token distribution at every position); rho = 0
gives independent feature maps per position (still one theta). Token 0 is correct at every
position; x_t = 1[o_t = 0] are independent Bernoulli(q_t); with N = sum_t x_t the rule is
"AC" (r = 1[N = T]) or "MAJ" (r = 1[2N >= T]), i.e. r = 1[N >= k] with k = T or ceil(T/2).

Exact quantities [derived here; tested against enumeration with gapdyn.gradient_gap and against
finite differences of Phi]:

    J = P(N >= k),   dq_t/dtheta = q_t (phi_t(0) - mu_t),   mu_t = E_{p_t}[phi_t],
    grad J = sum_t dq_t/dtheta P(N_{-t} = k - 1)   (N_{-t}: the count over the other positions),
    Gap = g+ - g- = grad Phi = grad J / (J (1 - J))   (docs/equations.md §1)
        = sum_t q_t (1 - q_t) P(N_{-t} = k - 1) (phi_t(0) - mu_w,t) / (J (1 - J)),

mu_w,t the mean feature of the wrong tokens under p_t (no cancellation as q_t -> 1).

The Poisson-binomial pmfs are prefix / suffix DPs in log space (O(T^2) per evaluation), so Phi
and the Gap stay finite for J near 0 or 1. Sampling draws each token by inverse CDF from one
uniform, so runs fed the same uniforms share their randomness (common random numbers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
from scipy.special import log_softmax, logsumexp

from gapdyn._validate import check_int, check_seed
from gapdyn.theory.sampling import inverse_cdf_draw

from . import _sequence_kernels as _kern
from .sequence import RULES, SequenceEnv, SequenceSample, _prob_from_log, rule_reward

__all__ = ["PartialSharingBandit", "position_features"]


@lru_cache(maxsize=64)
def _raw_features(seed: int, V: int, d: int, T: int) -> tuple[np.ndarray, np.ndarray]:
    """phi [V, d] from default_rng([seed]) and psi [T, V, d], psi_t from default_rng([seed, t + 1])."""
    phi = np.random.default_rng([seed]).standard_normal((V, d))
    psi = np.stack([np.random.default_rng([seed, t + 1]).standard_normal((V, d)) for t in range(T)])
    for a in (phi, psi):
        a.setflags(write=False)
    return phi, psi


def position_features(seed: int, *, V: int, d: int, T: int, rho: float) -> np.ndarray:
    """phi_t(v) = sqrt(rho) phi(v) + sqrt(1 - rho) psi_t(v) [T, V, d]; psi_t does not depend on T (nested in T)."""
    check_seed(seed)
    for name, v in (("V", V), ("d", d), ("T", T)):
        check_int(v, name, minimum=2 if name == "V" else 1)
    if isinstance(rho, bool) or not isinstance(rho, (int, float, np.integer, np.floating)) or not 0 <= rho <= 1:
        raise ValueError(f"rho must be a number in [0, 1], got {rho!r}")
    phi, psi = _raw_features(int(seed), int(V), int(d), int(T))
    return np.sqrt(rho) * phi[None] + np.sqrt(1.0 - rho) * psi


@dataclass(frozen=True, eq=False)
class PartialSharingBandit(SequenceEnv):
    """Fixed-length responses, position features [T, V, d], one theta [d], token ``correct`` right.

    Build with :meth:`random` (Gaussian features, sharing rho) or from explicit features.
    """

    features: np.ndarray = field(repr=False)
    rule: str = "MAJ"
    correct: int = 0
    rho: float | None = None
    """Sharing of the features (recorded for reports; None for explicit features)."""

    def __post_init__(self):
        f = np.array(self.features, dtype=np.float64)
        if f.ndim != 3 or f.shape[0] < 1 or f.shape[1] < 2 or f.shape[2] < 1 or not np.all(np.isfinite(f)):
            raise ValueError(f"features must be a finite [T, V, d] array with V >= 2, got shape {f.shape}")
        f.setflags(write=False)
        object.__setattr__(self, "features", f)
        if self.rule not in RULES:
            raise ValueError(f"rule must be one of {RULES}, got {self.rule!r}")
        if not 0 <= check_int(self.correct, "correct", minimum=0) < f.shape[1]:
            raise ValueError(f"correct must be a token index in [0, {f.shape[1]}), got {self.correct}")

    @classmethod
    def random(cls, *, T: int, rho: float, V: int = 10, d: int = 4, rule: str = "MAJ", seed: int = 0
               ) -> "PartialSharingBandit":
        """Gaussian features of :func:`position_features`; token 0 correct."""
        return cls(position_features(seed, V=V, d=d, T=T, rho=rho), rule, 0, float(rho))

    @property
    def T(self) -> int:
        return self.features.shape[0]

    @property
    def V(self) -> int:
        return self.features.shape[1]

    @property
    def d(self) -> int:
        return self.features.shape[2]

    @property
    def param_shape(self) -> tuple[int, ...]:
        return (self.d,)

    def _k(self) -> int:
        return self.T if self.rule == "AC" else (self.T + 1) // 2

    def check_params(self, theta) -> np.ndarray:
        th = np.asarray(theta, dtype=np.float64)
        if th.ndim < 1 or th.shape[-1] != self.d or not np.all(np.isfinite(th)):
            raise ValueError(f"theta must be a finite array [..., {self.d}], got shape {th.shape}")
        return th

    def token_logprobs(self, theta) -> np.ndarray:
        """log p_t(v) [..., T, V]."""
        th = self.check_params(theta)
        return log_softmax(np.einsum("tvd,...d->...tv", self.features, th), axis=-1)

    def _log_pmfs(self, lq, lw, *, suffix: bool = True):
        """Prefix / suffix log pmfs of the correct count: pre[..., t, j] over positions < t, suf[..., t, j] over > t."""
        T = self.T
        shape = lq.shape[:-1]
        pre = np.full(shape + (T + 1, T + 1), -np.inf)
        pre[..., 0, 0] = 0.0
        for t in range(T):
            nxt = pre[..., t, :] + lw[..., t, None]
            nxt[..., 1:] = np.logaddexp(nxt[..., 1:], pre[..., t, :-1] + lq[..., t, None])
            pre[..., t + 1, :] = nxt
        if not suffix:
            return pre, None
        suf = np.full(shape + (T, T + 1), -np.inf)
        suf[..., T - 1, 0] = 0.0
        for t in range(T - 1, 0, -1):
            nxt = suf[..., t, :] + lw[..., t, None]
            nxt[..., 1:] = np.logaddexp(nxt[..., 1:], suf[..., t, :-1] + lq[..., t, None])
            suf[..., t - 1, :] = nxt
        return pre, suf

    def _log_terms(self, theta, *, suffix: bool = True):
        logp = self.token_logprobs(theta)
        wrong = np.arange(self.V) != self.correct
        lq, lw = logp[..., self.correct], logsumexp(logp[..., wrong], axis=-1)
        pre, suf = self._log_pmfs(lq, lw, suffix=suffix)
        k = self._k()
        full = pre[..., self.T, :]  # pmf of N
        logJ = logsumexp(full[..., k:], axis=-1)
        logJbar = logsumexp(full[..., :k], axis=-1)
        return logp, lq, pre, suf, logJ, logJbar

    def success_rate(self, theta) -> np.ndarray:
        """J = P(N >= k) (log-space Poisson-binomial DP)."""
        return _prob_from_log(self._log_terms(theta, suffix=False)[4])

    def exact(self, theta) -> dict[str, np.ndarray]:
        """J, 1 - J, Phi, the Gap (= grad Phi) and E|o| = T (module doc)."""
        logp, lq, pre, suf, logJ, logJbar = self._log_terms(theta)
        k, T = self._k(), self.T
        # log P(N_{-t} = k - 1) = logsumexp_i pre[t, i] + suf[t, k - 1 - i]
        i = np.arange(k)
        loo = logsumexp(pre[..., :T, i] + suf[..., :, k - 1 - i], axis=-1)  # [..., T]
        # phi_t(c) - mu_t = (1 - q_t) (phi_t(c) - mu_w,t), mu_w,t the mean feature of the wrong tokens
        # (from their own log-softmax: no cancellation as q_t -> 1); weights formed in log space
        wrong = np.arange(self.V) != self.correct
        pw = np.exp(logp[..., wrong] - logsumexp(logp[..., wrong], axis=-1, keepdims=True))
        mu_w = np.einsum("...tv,tvd->...td", pw, self.features[:, wrong, :])
        lw = logsumexp(logp[..., wrong], axis=-1)
        wts = np.exp(lq + lw + loo - logJ[..., None] - logJbar[..., None])
        gap = np.einsum("...t,...td->...d", wts, self.features[:, self.correct, :] - mu_w)
        return {"J": _prob_from_log(logJ), "Jbar": _prob_from_log(logJbar),
                "Phi": logJ - logJbar, "gap": gap,
                "mean_length": np.full(logJ.shape, float(T))}

    def gap(self, theta) -> np.ndarray:
        return self.exact(theta)["gap"]

    def log_odds(self, theta) -> np.ndarray:
        """Phi = log J - log(1 - J)."""
        t = self._log_terms(theta, suffix=False)
        return t[4] - t[5]

    def draw(self, theta, u) -> SequenceSample:
        """Responses from uniforms u [..., G, T] (token t = inverse CDF of p_t at u[..., t])."""
        logp = self.token_logprobs(theta)
        u = np.asarray(u, dtype=np.float64)
        batch = logp.shape[:-2]
        if u.ndim < 2 or u.shape[-1] != self.T or u.shape[:-2] != batch:
            raise ValueError(f"u must have shape {batch} + (G, {self.T}), got {u.shape}")
        p = np.exp(logp)
        G, T, V = u.shape[-2], self.T, self.V
        # gapdyn's inverse-CDF draw, one row per (run, position): a p = 0 token is never drawn
        tok = np.swapaxes(inverse_cdf_draw(p, np.swapaxes(u, -1, -2)), -1, -2)  # [..., G, T]
        n = (tok == self.correct).sum(-1)
        m = np.full(n.shape, T)
        mu = np.einsum("...tv,tvd->...d", p, self.features)  # sum_t mu_t
        score = self.features[np.arange(T), tok].sum(-2) - mu[..., None, :]
        rg = np.arange(n.size).reshape(n.shape)[..., None]
        counts = np.bincount((rg * V + tok).ravel(), minlength=n.size * V).reshape(n.shape + (V,))
        return SequenceSample(counts, n, m, m.copy(), np.zeros_like(m), rule_reward(n, m, self.rule), score)

    # -- kernels of bandits.sequence.simulate (bandits._sequence_kernels; tested equal to the methods above) --
    def _kernel_exact(self, theta) -> dict[str, np.ndarray]:
        """J, Phi and the Gap of theta [R, d] (as :meth:`exact`, by the numba kernel)."""
        lJ, lJbar, gap = _kern.partial_exact(self.features, np.ascontiguousarray(theta, dtype=np.float64),
                                             self.correct, self._k())
        return {"J": _prob_from_log(lJ), "Phi": lJ - lJbar, "gap": gap}

    def _kernel_log_odds(self, theta) -> np.ndarray:
        """Phi of theta [..., d] (as :meth:`log_odds`, by the numba kernel)."""
        th = self.check_params(theta)
        lJ, lJbar = _kern.partial_log_terms(self.features, np.ascontiguousarray(th.reshape(-1, self.d)),
                                            self.correct, self._k())
        return (lJ - lJbar).reshape(th.shape[:-1])

    def _kernel_sampled_run(self, theta0, eta, u, stream, adv, *, normalized, steps, every, tail0, collapse_j):
        """Every sampled step of R runs in one kernel call (bandits._sequence_kernels.partial_sampled_run)."""
        scale = 1.0 / self.T if normalized else 1.0  # fixed length: |o| = T
        return _kern.partial_sampled_run(self.features, np.ascontiguousarray(theta0, dtype=np.float64), eta, u,
                                         stream, adv, self.correct, self._k(), scale, steps, every, tail0, collapse_j)
