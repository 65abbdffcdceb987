"""Speed references for bandits.engine, timed against it in the same run (``python -m benchmarks``).

- :func:`fused_exact`: the straightforward fused single-core kernel of the exact dynamics, compiled with
  ``fastmath=True``: per run, step and context ONE pass over the arms computes the logit
  z_a = <phi_a, theta>, keeps a running maximum and sum of exp(z - max) per reward class (rescaling the
  sums when the maximum moves) and accumulates sum_a exp(z_a - max) phi_a per class; then
  Gap = g+ - g- from the two class sums, Phi = lse+ - lse-, J = sigmoid(Phi) and
  theta += eta E[w] / Gap * Gap with the method's expected scalar (bandits.engine.exact_scalar_nb's
  rule). No records, no schedules, no optimiser: the least work of one exact update. It is the same
  update as the engine's constant-step SGD dynamics (tests check theta_final equal to ~1e-12).
- :func:`numpy_sampled`: a plain numpy loop of the sampled dynamics, one run and one step at a time,
  each context's group drawn with ``rng.choice(K, G, p=pi)``, advantages from
  ``gapdyn.group_advantages``, w = (1/G) sum_i A_i (phi_i - E_pi[phi]). It draws a different random
  stream from the engine (equality tests of the engine stay against bandits.reference); it is a
  speed reference only.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

import gapdyn
from bandits.engine import _CODE, _exact_scalar, _grpo_table

__all__ = ["fused_exact", "numpy_sampled"]


@njit(fastmath=True, cache=True)
def _fused(feat, rew, pmap, theta, eta, steps, method, G, tab, lam):
    R, P, d = theta.shape
    C, K = feat.shape[0], feat.shape[1]
    gp = np.empty(d)
    gn = np.empty(d)
    w = np.empty((P, d))
    cnt = np.zeros(P)
    for c in range(C):
        cnt[pmap[c]] += 1.0
    for r in range(R):
        for k in range(steps):
            w[:, :] = 0.0
            for c in range(C):
                th = theta[r, pmap[c]]
                mp, mn, sp, sn = -np.inf, -np.inf, 0.0, 0.0
                gp[:] = 0.0
                gn[:] = 0.0
                for a in range(K):
                    z = 0.0
                    for j in range(d):
                        z += feat[c, a, j] * th[j]
                    if rew[c, a] > 0.5:
                        if z > mp:  # new class maximum: rescale what was summed so far
                            s = math.exp(mp - z)
                            sp *= s
                            for j in range(d):
                                gp[j] *= s
                            mp = z
                        e = math.exp(z - mp)
                        sp += e
                        for j in range(d):
                            gp[j] += e * feat[c, a, j]
                    else:
                        if z > mn:
                            s = math.exp(mn - z)
                            sn *= s
                            for j in range(d):
                                gn[j] *= s
                            mn = z
                        e = math.exp(z - mn)
                        sn += e
                        for j in range(d):
                            gn[j] += e * feat[c, a, j]
                phi = (mp + math.log(sp)) - (mn + math.log(sn))
                J, Jb = 1.0 / (1.0 + math.exp(-phi)), 1.0 / (1.0 + math.exp(phi))
                sc = _exact_scalar(method, J, Jb, G, tab, lam) / cnt[pmap[c]]
                for j in range(d):
                    w[pmap[c], j] += sc * (gp[j] / sp - gn[j] / sn)
            for p in range(P):
                for j in range(d):
                    theta[r, p, j] += eta[r, p] * w[p, j]
    return theta


def fused_exact(bandit, method: str, group_size: int, eta, steps: int, theta0=None, *, lam: float = 0.1):
    """Final theta [R, P, d] of the fused kernel (module doc) for R = len(eta) runs; population std, eps 0."""
    R = np.size(eta)
    P, d = bandit.n_params, bandit.dim
    eta = np.ascontiguousarray(np.broadcast_to(np.asarray(eta, float).reshape(R, 1), (R, P)))
    th = np.zeros((R, P, d)) if theta0 is None else np.array(np.broadcast_to(theta0, (R, P, d)), dtype=float)
    tab = _grpo_table(int(group_size), False, 0.0)
    return _fused(bandit.features, bandit.rewards, bandit.param_map, th, eta, int(steps), _CODE[method],
                  int(group_size), tab, float(lam))


def numpy_sampled(bandit, method: str, group_size: int, eta, seed, steps: int) -> np.ndarray:
    """Final theta [R, P, d] of the plain numpy sampled loop (module doc); run r uses default_rng(seed[r])."""
    phi, rew, pmap = bandit.features, bandit.rewards, bandit.param_map
    C, K, d = phi.shape
    P, G = bandit.n_params, int(group_size)
    eta = np.atleast_1d(np.asarray(eta, float))
    seed = np.broadcast_to(np.atleast_1d(seed), eta.shape)
    out = np.zeros((eta.size, P, d))
    counts = np.bincount(pmap, minlength=P)[:, None]
    rows = np.arange(C)[:, None]
    for r in range(eta.size):
        rng = np.random.default_rng(int(seed[r]))
        theta = np.zeros((P, d))
        for _ in range(steps):
            probs = gapdyn.softmax(np.einsum("ckd,cd->ck", phi, theta[pmap]))
            idx = np.stack([rng.choice(K, size=G, p=probs[c]) for c in range(C)])
            A = gapdyn.group_advantages(method, rew[rows, idx])
            mean_phi = np.einsum("ck,ckd->cd", probs, phi)
            w_ctx = np.einsum("cg,cgd->cd", A, phi[rows, idx] - mean_phi[:, None, :]) / G
            w = np.zeros((P, d))
            np.add.at(w, pmap, w_ctx)
            theta = theta + eta[r] * w / counts
        out[r] = theta
    return out
