"""Success rate, log-odds and the Gradient Gap.

Suk & Duan (arXiv 2510.08539), Sec. 2; docs/equations.md. With O+ = {r = 1}, O- = {r = 0}, pi+/pi- the policy conditioned on each:
- J = sum_o pi(o) r(o);  Phi = log(J / (1 - J))                                 [paper]
- g+ = E_{pi+}[s], g- = E_{pi-}[s];  Gradient Gap = g+ - g-                      [paper]
- grad Phi = g+ - g-;  grad J = J (1 - J) (g+ - g-);  J g+ + (1 - J) g- = 0       [derived]
- Hess Phi = Cov_{pi+}(s) - Cov_{pi-}(s) for softmax / log-linear policies        [derived]

Inputs: probs [..., K], rewards [..., K] in {0, 1}, scores [..., K, P]. 1 - J is computed as the
mass of the incorrect responses (not as 1 - J), so J within 1e-12 of 0 or 1 stays accurate.
For policies given by logits (where probabilities can underflow), the ``*_from_logits`` routes use
log-sum-exp and stay finite for logits of +-1e3.
"""

from __future__ import annotations

import numpy as np
from scipy.special import logsumexp

from .._validate import as_float_array, as_probs, as_rewards, as_scores, check_success_defined

__all__ = [
    "success_rate",
    "failure_rate",
    "log_odds",
    "log_odds_from_logits",
    "conditional_scores",
    "gradient_gap",
    "gradient_gap_from_logits",
    "success_gradient",
    "logodds_gradient",
    "logodds_hessian",
    "logodds_hessian_from_logits",
]


def _pr(probs, rewards):
    p = as_probs(probs)
    r = as_rewards(rewards, p.shape)
    return p, r


def success_rate(probs, rewards) -> np.ndarray:
    """J = sum_o pi(o) r(o)  [paper], in [0, 1] (probs are renormalised, see ``as_probs``)."""
    p, r = _pr(probs, rewards)
    return np.minimum(np.sum(p * r, axis=-1), 1.0)


def failure_rate(probs, rewards) -> np.ndarray:
    """1 - J, computed as the mass of incorrect responses (accurate near J = 1)."""
    p, r = _pr(probs, rewards)
    return np.sum(p * (1.0 - r), axis=-1)


def log_odds(probs, rewards) -> np.ndarray:
    """Phi = log J - log(1 - J)  [paper]; ValueError where J is 0 or 1."""
    p, r = _pr(probs, rewards)
    J, Jbar = np.sum(p * r, -1), np.sum(p * (1 - r), -1)
    check_success_defined(J, Jbar, "the log-odds Phi")
    return np.log(J) - np.log(Jbar)


def log_odds_from_logits(logits, rewards) -> np.ndarray:
    """Phi = logsumexp(z over O+) - logsumexp(z over O-), finite for any finite logits."""
    z = as_float_array(logits, "logits", min_ndim=1)
    r = as_rewards(rewards, z.shape)
    if np.any(r.sum(-1) == 0) or np.any(r.sum(-1) == z.shape[-1]):
        raise ValueError("rewards must contain both a correct and an incorrect response (else Phi = +-inf)")
    neg = np.full_like(z, -np.inf)
    return logsumexp(np.where(r == 1, z, neg), axis=-1) - logsumexp(np.where(r == 0, z, neg), axis=-1)


def conditional_scores(probs, rewards, scores) -> tuple[np.ndarray, np.ndarray]:
    """(g+, g-) = (E_{pi+}[s], E_{pi-}[s])  [paper], each of shape [..., P]."""
    p, r = _pr(probs, rewards)
    s = as_scores(scores, p.shape)
    J, Jbar = np.sum(p * r, -1), np.sum(p * (1 - r), -1)
    check_success_defined(J, Jbar, "the conditional scores g+ / g-")
    # normalise the weights before they meet the scores: dividing last would lose the low bits of
    # subnormal p * s products (and flush them to 0)
    g_plus = np.einsum("...k,...kp->...p", (p * r) / J[..., None], s)
    g_minus = np.einsum("...k,...kp->...p", (p * (1 - r)) / Jbar[..., None], s)
    return g_plus, g_minus


def gradient_gap(probs, rewards, scores) -> np.ndarray:
    """Gradient Gap g+ - g-  [paper]; equals grad Phi  [derived]. Shape [..., P]."""
    g_plus, g_minus = conditional_scores(probs, rewards, scores)
    return g_plus - g_minus


logodds_gradient = gradient_gap


def _conditional_softmaxes(z, r):
    """pi+ and pi-: softmaxes of the logits restricted to O+ and O- (log-sum-exp, finite)."""
    if np.any(r.sum(-1) == 0) or np.any(r.sum(-1) == z.shape[-1]):
        raise ValueError("rewards must contain both a correct and an incorrect response (the Gap needs both)")
    neg = np.full_like(z, -np.inf)
    zp, zm = np.where(r == 1, z, neg), np.where(r == 0, z, neg)
    return np.exp(zp - logsumexp(zp, axis=-1, keepdims=True)), np.exp(zm - logsumexp(zm, axis=-1, keepdims=True))


def _logits_inputs(logits, rewards, features):
    z = as_float_array(logits, "logits", min_ndim=1)
    r = as_rewards(rewards, z.shape)
    if features is None:
        return z, r, None
    phi = as_float_array(features, "features", min_ndim=2)
    if phi.shape[:-1] != z.shape:
        raise ValueError(f"features must have shape {z.shape} + (d,), got {phi.shape}")
    return z, r, phi


def gradient_gap_from_logits(logits, rewards, features=None) -> np.ndarray:
    """The Gap from logits, stable for extreme logits.

    Tabular softmax (features=None): gap = pi+ - pi- in logit space (derived: s(a) = e_a - pi, the
    -pi terms cancel). Log-linear (features [..., K, d]): gap = E_{pi+}[phi] - E_{pi-}[phi].
    pi+ / pi- are softmaxes of the logits restricted to O+ / O-.
    """
    z, r, phi = _logits_inputs(logits, rewards, features)
    pi_plus, pi_minus = _conditional_softmaxes(z, r)
    if phi is None:
        return pi_plus - pi_minus
    return np.einsum("...k,...kd->...d", pi_plus - pi_minus, phi)


def logodds_hessian_from_logits(logits, rewards, features=None) -> np.ndarray:
    """Hess Phi = Cov_{pi+}(phi) - Cov_{pi-}(phi) from logits, finite even where J rounds to 0 or 1.

    derived (as :func:`logodds_hessian`); features=None gives the tabular (logit-space) Hessian
    diag(pi+) - pi+ pi+^T - diag(pi-) + pi- pi-^T.
    """
    z, r, phi = _logits_inputs(logits, rewards, features)
    pi_plus, pi_minus = _conditional_softmaxes(z, r)
    if phi is None:
        phi = np.broadcast_to(np.eye(z.shape[-1]), z.shape + (z.shape[-1],))

    def cov(w):
        mean = np.einsum("...k,...kp->...p", w, phi)
        second = np.einsum("...k,...kp,...kq->...pq", w, phi, phi)
        return second - mean[..., :, None] * mean[..., None, :]

    return cov(pi_plus) - cov(pi_minus)


def success_gradient(probs, rewards, scores) -> np.ndarray:
    """grad J = J (1 - J) (g+ - g-) = E_pi[r s]  [derived]."""
    p, r = _pr(probs, rewards)
    s = as_scores(scores, p.shape)
    return np.einsum("...k,...kp->...p", p * r, s)


def logodds_hessian(probs, rewards, scores) -> np.ndarray:
    """Hess Phi = Cov_{pi+}(s) - Cov_{pi-}(s), shape [..., P, P].

    derived (docs/equations.md): exact for tabular softmax (scores in logit space) and log-linear
    policies, whose Hess log pi(o) does not depend on o. For other policies it omits
    E_{pi+}[H] - E_{pi-}[H].
    """
    p, r = _pr(probs, rewards)
    s = as_scores(scores, p.shape)
    J, Jbar = np.sum(p * r, -1), np.sum(p * (1 - r), -1)
    check_success_defined(J, Jbar, "the Hessian of Phi")

    def cov(weights, mass):
        w = weights / mass[..., None]
        mean = np.einsum("...k,...kp->...p", w, s)
        second = np.einsum("...k,...kp,...kq->...pq", w, s, s)
        return second - mean[..., :, None] * mean[..., None, :]

    return cov(p * r, J) - cov(p * (1 - r), Jbar)
