"""Numba kernels of the token-level sequence bandits (float64, one thread): the hot path of
:func:`bandits.sequence.simulate`.

They compute exactly what the numpy methods of :class:`bandits.partial.PartialSharingBandit`,
:class:`bandits.sequence.SharedSequenceBandit` and :class:`bandits.sequence.TabularSequenceBandit` compute
(log-softmax, log-space Poisson-binomial / state sums, inverse-CDF draws), as plain loops per run, so no
[R, T, V] or [R, G, T, V] temporaries are built; sums are taken in another order, so results agree to
round-off (tests/test_bandits_sequence.py compares every kernel with the numpy route on random
configurations). Draws follow :func:`gapdyn.sampling.inverse_cdf_draw` bit for bit (same cumsum, the count
of F_k <= u F_K capped at the last positive-mass token): a zero-probability token is never drawn.

Sampled runs take every step inside one kernel call (:func:`partial_sampled_run`): binary rewards make a
group's advantages a function of (its number of correct responses c, own reward r) only, so the advantages
come from a table A[c, r] built by gapdyn.group_advantages (no advantage rule is re-written here); a run whose
group has all-zero advantages does not move, and its logits and cdf rows are reused for the next draw.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

_LOG2 = math.log(2.0)


@njit(cache=True, inline="always")
def _logaddexp(x, y):
    """numpy.logaddexp's rule: x + log1p(exp(-|x - y|)) from the larger argument (x + log 2 if equal)."""
    if x == y:
        return x + _LOG2
    tmp = x - y
    if tmp > 0:
        return x + math.log1p(math.exp(-tmp))
    if tmp <= 0:
        return y + math.log1p(math.exp(tmp))
    return tmp  # nan


@njit(cache=True)
def _expit(x):
    """1 / (1 + exp(-x)), from the side that does not overflow."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


@njit(cache=True, inline="always")
def _draw(cdf, last, u):
    """min(#{k : cdf_k <= u cdf_K}, last): gapdyn.sampling.inverse_cdf_draw for one uniform."""
    target = u * cdf[cdf.shape[0] - 1]
    idx = 0
    while idx < last and cdf[idx] <= target:
        idx += 1
    return idx


@njit(cache=True)
def _logp_rows(feat, theta, logp):
    """logp[t, v] = log_softmax_v(feat[t, v] . theta) for feat [T, V, d] (scipy.special.log_softmax's order)."""
    T, V, d = feat.shape
    for t in range(T):
        zmax = -np.inf
        for v in range(V):
            z = 0.0
            for j in range(d):
                z += feat[t, v, j] * theta[j]
            logp[t, v] = z
            if z > zmax:
                zmax = z
        s = 0.0
        for v in range(V):
            logp[t, v] -= zmax
            s += math.exp(logp[t, v])
        ls = math.log(s)
        for v in range(V):
            logp[t, v] -= ls


@njit(cache=True)
def _class_logmass(logp, correct, p, lq, lw):
    """p = exp(logp); lq[t] = log p_t(correct), lw[t] = log sum of the other tokens' p_t: the log of the plain
    sum of p where it is a normal number, else the max-shifted log-sum-exp of their logp (no underflow)."""
    T, V = logp.shape
    for t in range(T):
        lq[t] = logp[t, correct]
        s = 0.0
        for v in range(V):
            p[t, v] = math.exp(logp[t, v])
            if v != correct:
                s += p[t, v]
        if s > 1e-300:
            lw[t] = math.log(s)
            continue
        m = -np.inf
        for v in range(V):
            if v != correct and logp[t, v] > m:
                m = logp[t, v]
        if m == -np.inf:
            lw[t] = -np.inf
            continue
        s = 0.0
        for v in range(V):
            if v != correct:
                s += math.exp(logp[t, v] - m)
        lw[t] = m + math.log(s)


@njit(cache=True)
def _lse_range(a, lo, hi):
    """log sum_{lo <= i < hi} exp(a[i]) (-inf for an empty range or all -inf)."""
    m = -np.inf
    for i in range(lo, hi):
        if a[i] > m:
            m = a[i]
    if m == -np.inf:
        return -np.inf
    s = 0.0
    for i in range(lo, hi):
        s += math.exp(a[i] - m)
    return m + math.log(s)


@njit(cache=True)
def _linear_ok(lq, lw):
    """True where every product of <= T of the masses q_t, 1 - q_t is >= e^-700 (a normal float64): then the
    count pmfs can be summed in linear space (positive terms only: relative error ~T ulp), else in log space."""
    T = lq.shape[0]
    for t in range(T):
        if lq[t] < -700.0 / T or lw[t] < -700.0 / T:
            return False
    return True


@njit(cache=True)
def _count_pmf(lq, lw, pre, linear):
    """Prefix pmfs of the correct count: pre[t, j] = P(#correct among positions < t = j), [T + 1, T + 1],
    as probabilities (linear) or their logs."""
    T = lq.shape[0]
    if linear:
        pre[:, :] = 0.0
        pre[0, 0] = 1.0
        for t in range(T):
            q, w = math.exp(lq[t]), math.exp(lw[t])
            pre[t + 1, 0] = pre[t, 0] * w
            for j in range(1, t + 2):
                pre[t + 1, j] = pre[t, j] * w + pre[t, j - 1] * q
        return
    pre[:, :] = -np.inf
    pre[0, 0] = 0.0
    for t in range(T):  # entries j > t + 1 stay -inf (logaddexp(-inf, -inf) = -inf: skipping them is exact)
        pre[t + 1, 0] = pre[t, 0] + lw[t]
        for j in range(1, t + 2):
            pre[t + 1, j] = _logaddexp(pre[t, j] + lw[t], pre[t, j - 1] + lq[t])


@njit(cache=True)
def _log_sum_range(a, lo, hi, linear):
    """log sum_{lo <= i < hi} of a (linear) or of exp(a) (log space)."""
    if not linear:
        return _lse_range(a, lo, hi)
    s = 0.0
    for i in range(lo, hi):
        s += a[i]
    return math.log(s) if s > 0 else -np.inf


@njit(cache=True)
def _partial_logodds_one(feat, theta, correct, k, logp, p, lq, lw, pre):
    """(log J, log(1 - J), linear) of one theta (bandits.partial: J = P(N >= k)); fills logp, p, lq, lw, pre."""
    T = feat.shape[0]
    _logp_rows(feat, theta, logp)
    _class_logmass(logp, correct, p, lq, lw)
    linear = _linear_ok(lq, lw)
    _count_pmf(lq, lw, pre, linear)
    full = pre[T]
    return _log_sum_range(full, k, T + 1, linear), _log_sum_range(full, 0, k, linear), linear


@njit(cache=True)
def partial_log_terms(feat, theta, correct, k):
    """(log J [R], log(1 - J) [R]) for theta [R, d]."""
    R = theta.shape[0]
    T, V, _ = feat.shape
    logp, p, lq, lw = np.empty((T, V)), np.empty((T, V)), np.empty(T), np.empty(T)
    pre = np.empty((T + 1, T + 1))
    lJ, lJbar = np.empty(R), np.empty(R)
    for r in range(R):
        lJ[r], lJbar[r], _ = _partial_logodds_one(feat, theta[r], correct, k, logp, p, lq, lw, pre)
    return lJ, lJbar


@njit(cache=True)
def partial_exact(feat, theta, correct, k):
    """(log J [R], log(1 - J) [R], Gap [R, d]) for theta [R, d]: the Gap of bandits.partial's module doc,
    sum_t q_t (1 - q_t) P(N_{-t} = k - 1) (phi_t(c) - mu_w,t) / (J (1 - J)), every factor from log space
    (or from linear sums of positive terms where no product underflows)."""
    R = theta.shape[0]
    T, V, d = feat.shape
    logp, p, lq, lw = np.empty((T, V)), np.empty((T, V)), np.empty(T), np.empty(T)
    pre, suf = np.empty((T + 1, T + 1)), np.empty((T, T + 1))
    tmp, muw = np.empty(k), np.empty(d)
    lJ, lJbar, gap = np.empty(R), np.empty(R), np.zeros((R, d))
    for r in range(R):
        lJ[r], lJbar[r], linear = _partial_logodds_one(feat, theta[r], correct, k, logp, p, lq, lw, pre)
        if linear:
            suf[:, :] = 0.0
            suf[T - 1, 0] = 1.0
            for t in range(T - 1, 0, -1):
                q, w = math.exp(lq[t]), math.exp(lw[t])
                suf[t - 1, 0] = suf[t, 0] * w
                for j in range(1, T - t + 1):  # suf[t - 1] counts the T - t positions > t - 1
                    suf[t - 1, j] = suf[t, j] * w + suf[t, j - 1] * q
        else:
            suf[:, :] = -np.inf
            suf[T - 1, 0] = 0.0
            for t in range(T - 1, 0, -1):
                suf[t - 1, 0] = suf[t, 0] + lw[t]
                for j in range(1, T - t + 1):
                    suf[t - 1, j] = _logaddexp(suf[t, j] + lw[t], suf[t, j - 1] + lq[t])
        inv_JJbar = math.exp(-lJ[r] - lJbar[r])
        for t in range(T):
            if linear:  # q_t (1 - q_t) P(N_{-t} = k - 1) / (J (1 - J)), products of positive normal numbers
                loo = 0.0
                for i in range(k):
                    loo += pre[t, i] * suf[t, k - 1 - i]
                w_t = math.exp(lw[t])
                wt = p[t, correct] * w_t * loo * inv_JJbar
            else:
                for i in range(k):
                    tmp[i] = pre[t, i] + suf[t, k - 1 - i]
                loo = _lse_range(tmp, 0, k)  # log P(N_{-t} = k - 1)
                wt = math.exp(lq[t] + lw[t] + loo - lJ[r] - lJbar[r])
            if wt == 0.0:
                continue
            muw[:] = 0.0  # the wrong tokens' mean feature under p_t; 1 - q_t is their own sum (no cancellation)
            for v in range(V):
                if v != correct:
                    pw = p[t, v] / w_t if linear else math.exp(logp[t, v] - lw[t])
                    for j in range(d):
                        muw[j] += pw * feat[t, v, j]
            for j in range(d):
                gap[r, j] += wt * (feat[t, correct, j] - muw[j])
    return lJ, lJbar, gap


@njit(cache=True)
def _cdf_rows(p, cdf, last):
    """cdf[t] = cumsum(p[t]) (numpy's sequential order), last[t] = the last token with p > 0."""
    T, V = p.shape
    for t in range(T):
        s = 0.0
        last[t] = 0
        for v in range(V):
            s += p[t, v]
            cdf[t, v] = s
            if p[t, v] > 0:
                last[t] = v


@njit(cache=True)
def partial_draw(feat, theta, u, correct):
    """Tokens [R, G, T] of bandits.partial's inverse-CDF draw from uniforms u [R, G, T]."""
    R, G, T = u.shape
    V = feat.shape[1]
    logp, p, lq, lw = np.empty((T, V)), np.empty((T, V)), np.empty(T), np.empty(T)
    cdf, last = np.empty((T, V)), np.empty(T, np.int64)
    tok = np.empty((R, G, T), np.int64)
    for r in range(R):
        _logp_rows(feat, theta[r], logp)
        _class_logmass(logp, correct, p, lq, lw)
        _cdf_rows(p, cdf, last)
        for g in range(G):
            for t in range(T):
                tok[r, g, t] = _draw(cdf[t], last[t], u[r, g, t])
    return tok


@njit(cache=True)
def partial_sampled_run(feat, theta0, eta, u, stream, adv, correct, k, scale, steps, every, tail0, collapse_j):
    """Every step of R sampled runs: theta <- theta + eta (scale / G) sum_i A_i s(o_i) (bandits.sequence.simulate).

    feat [T, V, d]; theta0 [R, d]; eta [R]; u [S, steps, G, T] the uniforms of each stream, run r uses
    stream[r]; adv [G + 1, 2]: A of a response with reward r in a group with c correct responses; scale: 1
    or 1/T (1/|o| normalisation at fixed length). Returns (theta, rec J, rec Phi [R, n_rec], J, Phi, J_min,
    J_tail_min, J_tail_max [R], collapse_step [R]) with the conventions of SequenceTrajectory; J(theta_0) is
    exp(min(log J, 0)) as from ``exact``, later J = expit(Phi) as from ``log_odds``.
    """
    R, d = theta0.shape
    T, V, _ = feat.shape
    G = u.shape[2]
    n_rec = (steps - 1) // every + 1
    rec_J, rec_Phi = np.full((R, n_rec), np.nan), np.full((R, n_rec), np.nan)
    theta = theta0.copy()
    J_out, Phi_out = np.empty(R), np.empty(R)
    J_min, J_tmin, J_tmax = np.empty(R), np.full(R, np.inf), np.full(R, -np.inf)
    cstep = np.full(R, -1, np.int64)
    logp, p, lq, lw = np.empty((T, V)), np.empty((T, V)), np.empty(T), np.empty(T)
    pre, cdf, last = np.empty((T + 1, T + 1)), np.empty((T, V)), np.empty(T, np.int64)
    tok, rew, A = np.empty((G, T), np.int64), np.empty(G, np.int64), np.empty(G)
    w, mu = np.empty(d), np.empty(d)
    for r in range(R):
        th = theta[r]
        lJ, lJbar, _ = _partial_logodds_one(feat, th, correct, k, logp, p, lq, lw, pre)
        Phi = lJ - lJbar
        J = math.exp(min(lJ, 0.0))
        J_min[r] = J
        if J < collapse_j:
            cstep[r] = 0
        fresh = False  # cdf rows not yet formed from logp
        for step in range(steps):
            if step % every == 0:
                rec_J[r, step // every], rec_Phi[r, step // every] = J, Phi
            if not fresh:
                _cdf_rows(p, cdf, last)
                fresh = True
            us = u[stream[r], step]
            c = 0
            for g in range(G):
                n = 0
                for t in range(T):
                    tk = _draw(cdf[t], last[t], us[g, t])
                    tok[g, t] = tk
                    if tk == correct:
                        n += 1
                rew[g] = 1 if n >= k else 0
                c += rew[g]
            moves = False
            for g in range(G):
                A[g] = adv[c, rew[g]]
                if A[g] != 0.0:
                    moves = True
            if moves:
                mu[:] = 0.0  # sum_t mu_t, mu_t = E_{p_t}[phi_t]
                for t in range(T):
                    for v in range(V):
                        for j in range(d):
                            mu[j] += p[t, v] * feat[t, v, j]
                w[:] = 0.0
                for g in range(G):
                    if A[g] == 0.0:
                        continue
                    a = A[g] * scale
                    for j in range(d):
                        s = -mu[j]
                        for t in range(T):
                            s += feat[t, tok[g, t], j]
                        w[j] += a * s
                for j in range(d):
                    th[j] = th[j] + eta[r] * (w[j] / G)
                lJ, lJbar, _ = _partial_logodds_one(feat, th, correct, k, logp, p, lq, lw, pre)
                Phi = lJ - lJbar
                fresh = False
            J = _expit(Phi)
            if J < J_min[r]:
                J_min[r] = J
            if step + 1 >= tail0:
                J_tmin[r] = min(J_tmin[r], J)
                J_tmax[r] = max(J_tmax[r], J)
            if cstep[r] < 0 and J < collapse_j:
                cstep[r] = step + 1
        J_out[r], Phi_out[r] = J, Phi
    return theta, rec_J, rec_Phi, J_out, Phi_out, J_min, J_tmin, J_tmax, cstep
