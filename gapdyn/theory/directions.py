"""Update directions: the exact expectation and one sampled group, for every registered method.

w = (1/G) sum_{i=1}^G A_i s(o_i), o_i ~ pi i.i.d., A_i from :func:`gapdyn.theory.methods.group_advantages`.
E[w] = scalar(J, G) * (g+ - g-)  (docs/equations.md §2, derived).
"""

from __future__ import annotations

import numpy as np

from .._validate import as_probs, as_rewards, as_scores, check_group_size
from .gap import gradient_gap
from .methods import expected_scalar, get_method, group_advantages
from .sampling import inverse_cdf_draw

__all__ = ["expected_direction", "sampled_direction", "sample_group"]

MAX_DRAWS = 2**26
"""Most responses (x score entries) one call draws and holds at once: 512 MiB of float64."""


def _check_draws(count: int, what: str) -> None:
    if count > MAX_DRAWS:
        raise ValueError(f"group_size asks for {count} {what} at once, more than 2**26: draw the groups in chunks")


def expected_direction(method: str, probs, rewards, scores, *, group_size: int, **opts) -> np.ndarray:
    """E[w] for ``method``: the closed-form scalar (incl. GRPO's binomial sum c_G(J)) times the Gap.

    probs [..., K], rewards [..., K], scores [..., K, P] -> [..., P].
    """
    get_method(method)
    gap = gradient_gap(probs, rewards, scores)
    p = as_probs(probs)
    J = np.minimum(np.sum(p * as_rewards(rewards, p.shape), -1), 1.0)
    return expected_scalar(method, J, group_size, **opts)[..., None] * gap


def sample_group(probs, group_size: int, rng: np.random.Generator) -> np.ndarray:
    """Indices of G responses drawn i.i.d. from pi (one group per leading index): [..., G].

    Inverse-CDF draws (:func:`gapdyn.theory.sampling.inverse_cdf_draw`) from ``rng.random(probs.shape[:-1] + (G,))``;
    a response of probability 0 is never drawn.
    """
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    p = as_probs(probs)
    G = check_group_size(group_size)
    _check_draws(int(np.prod(p.shape[:-1], dtype=object)) * G, "draws")
    return inverse_cdf_draw(p, rng.random(p.shape[:-1] + (G,)))


def sampled_direction(
    method: str, probs, rewards, scores, *, group_size: int, rng: np.random.Generator, return_group: bool = False, **opts
):
    """One sampled group's direction w = (1/G) sum_i A_i s(o_i)  [..., P].

    With ``return_group=True`` also returns (indices [..., G], rewards [..., G], advantages [..., G]).
    """
    if not isinstance(return_group, (bool, np.bool_)):
        raise ValueError(f"return_group must be a bool, got {return_group!r}")
    p = as_probs(probs)
    r = as_rewards(rewards, p.shape)
    s = as_scores(scores, p.shape)
    G = check_group_size(group_size)
    _check_draws(int(np.prod(p.shape[:-1], dtype=object)) * G * max(1, s.shape[-1]), "score entries")
    idx = sample_group(p, G, rng)
    r_g = np.take_along_axis(r, idx, axis=-1)
    A = group_advantages(method, r_g, **opts)
    s_g = np.take_along_axis(s, idx[..., None], axis=-2)  # [..., G, P]
    w = np.einsum("...g,...gp->...p", A, s_g) / G
    return (w, (idx, r_g, A)) if return_group else w
