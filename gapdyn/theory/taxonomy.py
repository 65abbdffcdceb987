"""WAPO's token taxonomy: how one token's update moves probabilities and entropy.

docs/equations.md §4 (derived, checked by finite differences). One position with logits z, p = softmax(z),
sampled token s, step a = eta * A * w (w the importance weight), C = sum_k p_k^2, H = -sum p log p:
- dz      = a (e_s - p)
- dlogp_j = a (1[j = s] - p_j - p_s + C)          (so dlogp_s = a (1 - 2 p_s + C))
- dp_j    = p_j dlogp_j
- dH      = -a [ p_s (log p_s + H) - sum_k p_k^2 (log p_k + H) ]
The code evaluates these brackets in an order free of the 1 - p_s and p_s - C cancellations (comment
in :func:`token_step_effects`) and multiplies by a last; a step a that overflows float64 is refused.
A token is a **peak** when p_s >= C, a **valley** otherwise (WAPO's code). Crossed with the sign of
A: pos_peak, pos_valley, neg_peak, neg_valley. The bin predicts the sign of dH for most tokens and
is exact for valley tokens [derived]: with f(x) = x (log x + H), sign(dH) = sign(a) sign(E_p[f(p)] - f(p_s));
E_p[f(p)] = C (E_q[log p] - E_p[log p]) >= 0 with q = p^2 / C; f < 0 below e^{-H} <= C and f increases
above e^{-H-1}, so p_s < C implies f(p_s) < E_p[f(p)]. Peak tokens can disagree (just above p_s = C):
:func:`token_step_effects` also reports the exact first-order sign.

The small helpers (:func:`collision_probability`, :func:`token_entropy`, :func:`token_bin_index`)
work on numpy arrays and torch tensors alike, so ``llm_probe`` applies the same formula. They run
inside training loops (maybe on a GPU), so they check types, not values: NaN propagates (llm_probe
checks its losses and gradients for non-finite values itself).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy.special import log_softmax

from .._validate import array_namespace_checked, as_float_array, check_positive

__all__ = [
    "BIN_NAMES",
    "PROB_BIN_EDGES",
    "TokenStepEffects",
    "collision_probability",
    "token_entropy",
    "token_bin_index",
    "token_step_effects",
    "exact_token_step",
]

BIN_NAMES: tuple[str, ...] = ("pos_peak", "pos_valley", "neg_peak", "neg_valley")
"""Index i of :func:`token_bin_index` names BIN_NAMES[i] (A = 0 gets -1)."""

PROB_BIN_EDGES: tuple[float, ...] = (0.0, 0.01, 0.1, 0.25, 0.5, 1.0)
"""WAPO's probability bins [0,.01), [.01,.1), [.1,.25), [.25,.5), [.5,1] for gradient mass."""


def collision_probability(probs):
    """C = sum_k p_k^2 over the last axis (numpy or torch)."""
    xp = array_namespace_checked(probs)
    return xp.sum(probs * probs, axis=-1)


def token_entropy(logprobs):
    """H = -sum_k p_k log p_k from log-probabilities over the last axis (numpy or torch).

    A log-probability of -inf (p = 0) contributes 0 (the limit of p log p), not 0 * inf = NaN.
    """
    xp = array_namespace_checked(logprobs)
    finite = xp.where(logprobs == -float("inf"), xp.zeros_like(logprobs), logprobs)
    return -xp.sum(xp.exp(logprobs) * finite, axis=-1)


def token_bin_index(p_token, collision, advantage):
    """0 pos_peak, 1 pos_valley, 2 neg_peak, 3 neg_valley, -1 where A = 0 (numpy or torch)."""
    xp = array_namespace_checked(p_token, collision, advantage)
    valley = xp.astype(p_token < collision, xp.int64)
    idx = valley + 2 * xp.astype(advantage < 0, xp.int64)
    return xp.where(advantage == 0, -xp.ones_like(idx), idx)


class TokenStepEffects(NamedTuple):
    """First-order effects of one token update; leading axes as the inputs, V = vocabulary."""

    dz: np.ndarray  # [..., V]
    dlogp: np.ndarray  # [..., V]
    dp: np.ndarray  # [..., V]
    dH: np.ndarray  # [...]
    collision: np.ndarray  # [...]   C = sum p^2
    p_token: np.ndarray  # [...]   p_s
    is_peak: np.ndarray  # [...]   p_s >= C
    entropy_sign: np.ndarray  # [...] sign of dH (first order)
    bin: np.ndarray  # [...]   index into BIN_NAMES, -1 when A = 0


def _inputs(logits, token, advantage, eta, weight):
    z = as_float_array(logits, "logits", min_ndim=1)
    V = z.shape[-1]
    if V < 2:
        raise ValueError(f"logits must have a vocabulary axis of size >= 2, got shape {z.shape}")
    tok = np.asarray(token)
    if not np.issubdtype(tok.dtype, np.integer):
        raise ValueError(f"token must be an integer array, got dtype {tok.dtype}")
    if np.any((tok < 0) | (tok >= V)):
        raise ValueError(f"token must lie in [0, {V}), got values outside")
    A = as_float_array(advantage, "advantage")
    w = as_float_array(weight, "weight")
    eta = check_positive(eta, "eta")
    lead = np.broadcast_shapes(z.shape[:-1], tok.shape, A.shape, w.shape)
    z = np.broadcast_to(z, lead + (V,))
    tok = np.broadcast_to(tok, lead)
    # a = eta * A * w by mantissas and exponents: exact up to the rounding of one product, and finite
    # whenever a is (eta * A or A * w alone may overflow while a does not)
    (m_e, x_e), (m_A, x_A), (m_w, x_w) = np.frexp(eta), np.frexp(A), np.frexp(w)
    with np.errstate(over="ignore"):
        a = np.broadcast_to(np.ldexp(m_e * m_A * m_w, x_e + x_A + x_w), lead)
    if np.any(np.isinf(a)):
        raise ValueError(
            f"the step a = eta * A * weight overflows float64 (eta = {eta!r}, max |eta * A| = "
            f"{float(np.max(np.abs(A))) * eta:.3g}): the first-order effects do not exist; lower eta or the advantage"
        )
    return z, tok, A, a


def token_step_effects(logits, token, advantage, eta, *, weight=1.0) -> TokenStepEffects:
    """The WAPO taxonomy to first order in a = eta * A * weight (formulas in the module doc).

    logits [..., V]; token, advantage, weight broadcast against logits[..., 0].
    """
    z, tok, A, a = _inputs(logits, token, advantage, eta, weight)
    with np.errstate(over="ignore"):  # logits further apart than the float range: log p = -inf, p = 0
        logp = log_softmax(z, axis=-1)
    p = np.exp(logp)
    onehot = np.zeros(p.shape, dtype=bool)
    np.put_along_axis(onehot, tok[..., None], True, axis=-1)
    p_s = np.take_along_axis(p, tok[..., None], axis=-1)[..., 0]
    C = np.sum(p * p, axis=-1)
    # p log p -> 0 at p = 0 (log p = -inf when logits differ by more than the float range)
    logp_or_0 = np.where(p > 0, logp, 0.0)
    H = -np.sum(p * logp_or_0, axis=-1)
    # stable order (no 1 - p_s or p_s - C cancellation when p_s ~ 1): with q_s = 1 - p_s = sum_{k!=s} p_k,
    # S2 = sum_{k!=s} p_k^2 and D = p_s - C = p_s q_s - S2, the module's brackets are
    #   e_s - p = (q_s at s, -p_j elsewhere);  dlogp_s / a = q_s^2 + S2;  dlogp_j / a = -p_j - D;
    #   -dH / a = p_s q_s (log p_s + H) - sum_{k!=s} p_k^2 (log p_k + H);  each bracket is then times a
    others = np.where(onehot, 0.0, p)
    q_s = np.sum(others, axis=-1)
    S2 = np.sum(others * others, axis=-1)
    D = p_s * q_s - S2
    centred = np.where(p > 0, logp_or_0 + H[..., None], 0.0)  # log p_k + H, 0 where p_k = 0 (its weight)
    c_s = np.take_along_axis(centred, tok[..., None], axis=-1)[..., 0]
    dz = a[..., None] * np.where(onehot, q_s[..., None], -p)
    dlogp = a[..., None] * np.where(onehot, (q_s * q_s + S2)[..., None], -p - D[..., None])
    dp = p * dlogp
    dH = -a * (p_s * q_s * c_s - np.sum(others * others * centred, axis=-1))
    return TokenStepEffects(
        dz=dz,
        dlogp=dlogp,
        dp=dp,
        dH=dH,
        collision=C,
        p_token=p_s,
        is_peak=p_s >= C,
        entropy_sign=np.sign(dH),
        bin=token_bin_index(p_s, C, np.broadcast_to(A, a.shape)),
    )


class ExactTokenStep(NamedTuple):
    """Finite-step effects of z -> z + a (e_s - p), for comparison with first order."""

    dlogp: np.ndarray
    dp: np.ndarray
    dH: np.ndarray


def exact_token_step(logits, token, advantage, eta, *, weight=1.0) -> ExactTokenStep:
    """Exact change of log p, p and H after the logit step dz = a (e_s - p)."""
    z, tok, _, a = _inputs(logits, token, advantage, eta, weight)
    logp = log_softmax(z, axis=-1)
    p = np.exp(logp)
    onehot = np.zeros_like(p)
    np.put_along_axis(onehot, tok[..., None], 1.0, axis=-1)
    logp_new = log_softmax(z + a[..., None] * (onehot - p), axis=-1)
    p_new = np.exp(logp_new)
    H, H_new = -np.sum(p * logp, -1), -np.sum(p_new * logp_new, -1)
    return ExactTokenStep(dlogp=logp_new - logp, dp=p_new - p, dH=H_new - H)
