"""The plain reference loop: one run at a time, one step at a time, every quantity from gapdyn.

This is the independent route that :mod:`bandits.engine` is tested against (and benchmarked against):
no numba, no fused kernels; each step calls gapdyn's public functions (log-odds, Gap, scores, Hessian,
expected scalars, group advantages) and :mod:`bandits.schedules`' plain rules. The group draws are
inverse-CDF draws from pre-drawn uniforms (:func:`gapdyn.theory.sampling.inverse_cdf_draw`), because the
engine must consume the same random stream: per step, ``rng.random((C, G))`` with
``rng = numpy.random.default_rng(seed)``.
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit

import gapdyn
from gapdyn._validate import as_float_array
from gapdyn.evidence.collapse import tail_start
from gapdyn.theory.sampling import inverse_cdf_draw

from .engine import Dynamics, Trajectory, _runs
from .envs import ContextualBandit

from .schedules import adam_direction, adam_init, adaptive_step, group_alignment_curvature, line_search_step, schedule_step

__all__ = ["simulate_reference", "sample_arms"]


def sample_arms(probs: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Inverse-CDF draws (:func:`gapdyn.theory.sampling.inverse_cdf_draw`): for each context c, arms
    min(searchsorted(cumsum(pi_c), u[c] * total, 'right'), last arm with positive probability).

    probs [C, K] finite and non-negative (rows need not be normalised); u [C, G] uniforms in [0, 1].
    A zero-probability arm is never drawn, also at u = 1 (the draw is capped at the last arm with
    positive probability, not at arm K - 1).
    """
    probs = as_float_array(probs, "probs", min_ndim=2)
    u = as_float_array(u, "u", min_ndim=2)
    if probs.ndim != 2 or u.ndim != 2 or u.shape[0] != probs.shape[0]:
        raise ValueError(f"probs must be [C, K] and u [C, G] with the same C, got {probs.shape} and {u.shape}")
    if np.any(probs < 0) or np.any(probs.sum(axis=1) <= 0):
        raise ValueError("probs must be non-negative with positive mass in every row")
    if np.any((u < 0) | (u > 1)):
        raise ValueError("u must hold uniforms in [0, 1]")
    return _sample_arms(probs, u)


def _sample_arms(probs: np.ndarray, u: np.ndarray) -> np.ndarray:
    """:func:`sample_arms` without the boundary checks (the reference loop's inner step)."""
    return inverse_cdf_draw(probs, u)  # gapdyn's one sampler; tests compare it with a per-row searchsorted loop


def _cond_abs_scale(z, r, fnorm):
    """sum_a (pi+(a) + pi-(a)) ||phi(a)||, pi+/- the softmax of the logits restricted to O+/O-."""
    out = 0.0
    for mask in (r == 1, r == 0):
        zz = np.where(mask, z, -np.inf)
        w = np.exp(zz - zz.max())
        out += float(w @ fnorm / w.sum())
    return out


def _hessian_from_logits(z, r, phi):
    """Hess Phi = Cov_{pi+}(phi) - Cov_{pi-}(phi), pi+/- = softmax of the logits restricted to O+/O-."""

    def cov(mask):
        zz = np.where(mask, z, -np.inf)
        w = np.exp(zz - zz.max())
        w /= w.sum()
        m = w @ phi
        return (phi - m).T @ (w[:, None] * (phi - m))

    return cov(r == 1) - cov(r == 0)


def simulate_reference(bandit: ContextualBandit, dyn: Dynamics, *, eta, seed=0, theta0=None) -> Trajectory:
    """Same contract and output as :func:`bandits.engine.simulate`, by a plain loop (slow)."""
    eta0, seeds, theta_all = _runs(bandit, eta, seed, theta0)
    R, P, d = theta_all.shape
    C, K, G, T, every = bandit.n_contexts, bandit.n_arms, dyn.group_size, dyn.steps, dyn.record_every
    phi, rew, pmap = bandit.features, bandit.rewards, bandit.param_map
    blocks = [np.flatnonzero(pmap == p) for p in range(P)]
    n_rec = (T - 1) // every + 1
    rec = {k: np.full((R, n_rec, C), np.nan) for k in ("J", "Phi", "dmu", "M", "wnorm", "dPhi", "entropy")}
    rec_eta = np.full((R, n_rec, P), np.nan)
    out = {k: np.zeros((R, C)) for k in ("J_final", "Phi_final", "M_final", "J_min", "J_tail_min", "J_tail_max")}
    out.update({k: np.zeros(R) for k in ("Jbar_min", "Jbar_tail_min", "Jbar_tail_max")})
    tail0 = tail_start(T)  # the last quarter of the states 0..T
    ndec = np.zeros((R, C), np.int64)
    opts = dyn.method_opts
    sched = dyn.schedule
    b1, b2 = dyn.adam_betas
    fnorm = np.linalg.norm(phi, axis=-1)  # [C, K]
    logodds_fns = [gapdyn.loglinear_logodds_fn(phi[c], rew[c]) for c in range(C)]
    for r in range(R):
        rng = np.random.default_rng(int(seeds[r]))
        theta = theta_all[r].copy()
        adam = [adam_init(d) for _ in range(P)]
        M = np.zeros(C)
        J_min = np.full(C, np.inf)
        J_tail = []  # J [C] at the states k >= tail0
        Jbar = []  # mean_x J(x) at every state (contexts are uniform)
        phi_prev = None
        for k in range(T + 1):
            logits = gapdyn.loglinear_logits(phi, theta[pmap])  # [C, K]
            Phi = gapdyn.log_odds_from_logits(logits, rew)  # [C]
            J = expit(Phi)
            J_min = np.minimum(J_min, J)
            Jbar.append(float(np.mean(J)))
            if k >= tail0:
                J_tail.append(J)
            if phi_prev is not None:
                dph = Phi - phi_prev
                ndec += (dph < -1e-12 * (1.0 + np.abs(Phi))).astype(np.int64) * (np.arange(R) == r)[:, None]
                if (k - 1) % every == 0:
                    rec["dPhi"][r, (k - 1) // every] = dph
            phi_prev = Phi
            if k == T:
                out["J_final"][r], out["Phi_final"][r], out["M_final"][r], out["J_min"][r] = J, Phi, M, J_min
                out["J_tail_min"][r], out["J_tail_max"][r] = np.min(J_tail, axis=0), np.max(J_tail, axis=0)
                out["Jbar_min"][r] = min(Jbar)
                out["Jbar_tail_min"][r], out["Jbar_tail_max"][r] = min(Jbar[tail0:]), max(Jbar[tail0:])
                break
            probs = gapdyn.softmax(logits)
            gap = gapdyn.gradient_gap_from_logits(logits, rew, phi)  # [C, d]
            scores = gapdyn.loglinear_scores(phi, theta[pmap])  # [C, K, d]
            entropy = -np.sum(probs * gapdyn.log_softmax(logits), axis=-1)
            # direction per context
            if dyn.gradient == "exact":
                if dyn.method == "gap":
                    scal = np.ones(C)
                else:
                    Jc = np.clip(J, 1e-300, 1.0 - 2.0**-53)
                    scal = gapdyn.expected_scalar(dyn.method, Jc, G, **opts)
                w_ctx = scal[:, None] * gap
                # scale of the terms that cancel in gap = E_{pi+}[phi] - E_{pi-}[phi]
                wscale = np.abs(scal) * np.array([_cond_abs_scale(logits[c], rew[c], fnorm[c]) for c in range(C)])
            else:
                u = rng.random((C, G))
                idx = _sample_arms(probs, u)
                r_g = np.take_along_axis(rew, idx, axis=1)  # [C, G]
                A = gapdyn.group_advantages(dyn.method, r_g, **opts)
                s_g = np.take_along_axis(scores, idx[..., None], axis=1)  # [C, G, d]
                w_ctx = np.einsum("cg,cgd->cd", A, s_g) / G
                mean_norm = np.sum(probs * fnorm, axis=1)  # E_pi ||phi||
                wscale = np.sum(np.abs(A) * (np.take_along_axis(fnorm, idx, axis=1) + mean_norm[:, None]), axis=1) / G
            w = np.stack([w_ctx[b].mean(axis=0) for b in blocks])  # [P, d]
            # a direction below 1e-12 of the terms it cancels from is round-off: exactly 0 (as in the engine)
            scale = np.array([wscale[b].mean() for b in blocks])
            w[np.linalg.norm(w, axis=-1) <= 1e-12 * scale] = 0.0
            if dyn.normalize:
                n = np.linalg.norm(w, axis=-1, keepdims=True)
                w = np.where(n > 0, w / np.where(n > 0, n, 1.0), w)
            if dyn.optimizer == "adam":
                upd = np.empty_like(w)
                for p in range(P):
                    upd[p], adam[p] = adam_direction(adam[p], w[p], beta1=b1, beta2=b2, eps=dyn.adam_eps)
            else:
                upd = w
            # step size per block
            etas = np.empty(P)
            for p, b in enumerate(blocks):
                if sched.kind in ("constant", "decay"):
                    etas[p] = schedule_step(sched.kind, eta0[r, p], k)
                elif sched.kind == "linesearch":
                    fns = [logodds_fns[c] for c in b]
                    etas[p] = line_search_step(
                        lambda th, fns=fns: sum(f(th) for f in fns), theta[p], upd[p], eta0[r, p],
                        max_halvings=sched.max_halvings, gap=gap[b].sum(axis=0),
                    )  # fmt: skip
                else:
                    if dyn.gradient == "exact":
                        try:
                            hess = gapdyn.logodds_hessian(probs[b], rew[b], scores[b])  # [n, d, d]
                        except ValueError:  # J is 0 or 1 in floating point: Cov+ - Cov- from the logits
                            hess = np.stack([_hessian_from_logits(logits[c], rew[c], phi[c]) for c in b])
                        cov = np.einsum("nk,nki,nkj->nij", probs[b], scores[b], scores[b])  # Cov_pi(s)
                        dmu_hat = float(np.mean(gap[b] @ upd[p]))
                        kappa = float(np.mean(-np.einsum("i,nij,j->n", upd[p], hess, upd[p])))
                        # a variance: clip its round-off below 0 (u ~ 0) before the square root
                        spread = float(np.max(np.sqrt(np.maximum(np.einsum("i,nij,j->n", upd[p], cov, upd[p]), 0.0))))
                        mixed = True
                    else:
                        ests = [group_alignment_curvature(s_g[c] @ upd[p], r_g[c]) for c in b]
                        spread = max(e[2] for e in ests)
                        ests = [e for e in ests if e[3]]
                        mixed = bool(ests)
                        dmu_hat = float(np.mean([e[0] for e in ests])) if mixed else 0.0
                        kappa = float(np.mean([e[1] for e in ests])) if mixed else 0.0
                    etas[p] = adaptive_step(
                        dmu_hat, kappa, spread, eta0[r, p], c=sched.c, delta=sched.delta, mixed=mixed
                    )
            dmu = np.einsum("cd,cd->c", upd[pmap], gap)
            if k % every == 0:
                i = k // every
                rec["J"][r, i], rec["Phi"][r, i], rec["entropy"][r, i], rec["M"][r, i] = J, Phi, entropy, M
                rec["dmu"][r, i] = dmu
                rec["wnorm"][r, i] = np.linalg.norm(upd[pmap], axis=-1)
                rec_eta[r, i] = etas
            M = M + etas[pmap] * np.maximum(dmu, 0.0)
            theta = theta + etas[:, None] * upd
        theta_all[r] = theta
    return Trajectory(
        steps=np.arange(0, T, every),
        **rec,
        eta=rec_eta,
        **out,
        n_decrease=ndec,
        theta_final=theta_all,
        eta0=eta0,
        seed=seeds,
        dynamics=dyn,
    )
