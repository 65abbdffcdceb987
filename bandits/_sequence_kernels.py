"""Numba kernels of the token-level sequence bandits (float64, one thread): the hot path of
:func:`bandits.sequence.simulate`.

They compute exactly what the numpy methods of :class:`bandits.partial.PartialSharingBandit`,
:class:`bandits.sequence.SharedSequenceBandit` and :class:`bandits.sequence.TabularSequenceBandit` compute
(log-softmax, log-space Poisson-binomial / state sums, inverse-CDF draws), as plain loops per run, so no
[R, T, V] or [R, G, T, V] temporaries are built; sums are taken in another order, so results agree to
round-off (tests/test_bandits_sequence.py compares every kernel with the numpy route on random
configurations). Draws follow :func:`gapdyn.theory.sampling.inverse_cdf_draw` bit for bit (same cumsum, the count
of F_k <= u F_K capped at the last positive-mass token): a zero-probability token is never drawn.

Exact runs take J, Phi and the Gap of every step from :func:`partial_exact`, :func:`shared_exact` or
:func:`tabular_exact` (the expected scalar of gapdyn.expected_scalar stays in simulate's Python loop).
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


@njit(cache=True, inline="always")
def _draw_group(cdf, last, us, correct, k, tok, rew):
    """One group: G responses of T tokens drawn by inverse cdf (tok [G, T]), reward 1 when at least k tokens are
    the correct one (rew [G]); returns the number of correct responses."""
    G, T = tok.shape
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
    return c


@njit(cache=True, inline="always")
def _track(r, k, J, tail0, collapse_j, J_min, J_tmin, J_tmax, cstep):
    """State k of run r: min J over the run, min / max over the last quarter (k >= tail0; gapdyn.tail_start)
    and the first k with J < collapse_j (gapdyn.evidence.collapse)."""
    if J < J_min[r]:
        J_min[r] = J
    if k >= tail0:
        J_tmin[r] = min(J_tmin[r], J)
        J_tmax[r] = max(J_tmax[r], J)
    if cstep[r] < 0 and J < collapse_j:
        cstep[r] = k


@njit(cache=True)
def _expit(x):
    """1 / (1 + exp(-x)), from the side that does not overflow."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


@njit(cache=True, inline="always")
def _draw(cdf, last, u):
    """min(#{k : cdf_k <= u cdf_K}, last): gapdyn.theory.sampling.inverse_cdf_draw for one uniform."""
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
def _suffix_pmf(lq, lw, suf, linear):
    """Suffix pmfs of the correct count: suf[t, j] = P(#correct among positions > t = j), [T, T + 1], as
    probabilities (linear) or their logs (the twin of :func:`_count_pmf`)."""
    T = lq.shape[0]
    if linear:
        suf[:, :] = 0.0
        suf[T - 1, 0] = 1.0
        for t in range(T - 1, 0, -1):
            q, w = math.exp(lq[t]), math.exp(lw[t])
            suf[t - 1, 0] = suf[t, 0] * w
            for j in range(1, T - t + 1):  # suf[t - 1] counts the T - t positions > t - 1
                suf[t - 1, j] = suf[t, j] * w + suf[t, j - 1] * q
        return
    suf[:, :] = -np.inf
    suf[T - 1, 0] = 0.0
    for t in range(T - 1, 0, -1):
        suf[t - 1, 0] = suf[t, 0] + lw[t]
        for j in range(1, T - t + 1):
            suf[t - 1, j] = _logaddexp(suf[t, j] + lw[t], suf[t, j - 1] + lq[t])


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
        _suffix_pmf(lq, lw, suf, linear)
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
            c = _draw_group(cdf, last, u[stream[r], step], correct, k, tok, rew)
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
            _track(r, step + 1, J, tail0, collapse_j, J_min, J_tmin, J_tmax, cstep)
        J_out[r], Phi_out[r] = J, Phi
    return theta, rec_J, rec_Phi, J_out, Phi_out, J_min, J_tmin, J_tmax, cstep


# ---------------------------------------------------------------------------------------------
# shared parameters (bandits.sequence.SharedSequenceBandit): one token distribution at every position


@njit(cache=True)
def _shared_logmass(feat, theta, is_corr, end, logp, p):
    """(log q, log w, log e): the log masses of the correct set, the other non-end tokens and the end token
    (-inf without one) under p = softmax(feat . theta); fills logp and p."""
    V, d = feat.shape
    zmax = -np.inf
    for v in range(V):
        z = 0.0
        for j in range(d):
            z += feat[v, j] * theta[j]
        logp[v] = z
        if z > zmax:
            zmax = z
    s = 0.0
    for v in range(V):
        logp[v] -= zmax
        s += math.exp(logp[v])
    ls = math.log(s)
    mq, mw = -np.inf, -np.inf
    for v in range(V):
        logp[v] -= ls
        p[v] = math.exp(logp[v])
        if is_corr[v]:
            mq = max(mq, logp[v])
        elif v != end:
            mw = max(mw, logp[v])
    sq, sw = 0.0, 0.0
    for v in range(V):
        if is_corr[v]:
            sq += math.exp(logp[v] - mq)
        elif v != end:
            sw += math.exp(logp[v] - mw)
    lq, lw = mq + math.log(sq), mw + math.log(sw)
    le = logp[end] if end >= 0 else -np.inf
    return lq, lw, le


@njit(cache=True)
def _shared_logodds_one(feat, theta, is_corr, end, rule_ac, T, logp, p, lgam):
    """(log J, log(1 - J)) of one theta: log-space sums over the states (n, m, ended) of the module doc of
    bandits.sequence, log P = log C(m, n) + n log q + (m - n) log w + ended log e; fills logp and p."""
    lq, lw, le = _shared_logmass(feat, theta, is_corr, end, logp, p)
    # two passes over the states: the maxima, then the shifted sums
    m1, m0 = -np.inf, -np.inf
    for pas in range(2):
        s1, s0 = 0.0, 0.0
        for m in range(T + 1) if end >= 0 else range(T, T + 1):
            e = 1 if (end >= 0 and m < T) else 0
            for n in range(m + 1):
                lp = lgam[m] - lgam[n] - lgam[m - n]
                if n > 0:
                    lp += n * lq
                if m - n > 0:
                    lp += (m - n) * lw
                if e > 0:
                    lp += le
                win = m >= 1 and (n == m if rule_ac else 2 * n >= m)
                if pas == 0:
                    if win:
                        m1 = max(m1, lp)
                    else:
                        m0 = max(m0, lp)
                elif win:
                    s1 += math.exp(lp - m1)
                else:
                    s0 += math.exp(lp - m0)
    l1 = m1 + math.log(s1) if m1 > -np.inf else -np.inf
    l0 = m0 + math.log(s0) if m0 > -np.inf else -np.inf
    return l1, l0


@njit(cache=True)
def shared_log_terms(feat, theta, is_corr, end, rule_ac, T):
    """(log P(r = 1) [R], log P(r = 0) [R]) for theta [R, d] (SharedSequenceBandit._reward_logmass)."""
    R = theta.shape[0]
    V = feat.shape[0]
    logp, p = np.empty(V), np.empty(V)
    lgam = np.empty(T + 1)
    for i in range(T + 1):
        lgam[i] = math.lgamma(i + 1.0)
    l1, l0 = np.empty(R), np.empty(R)
    for r in range(R):
        l1[r], l0[r] = _shared_logodds_one(feat, theta[r], is_corr, end, rule_ac, T, logp, p, lgam)
    return l1, l0


@njit(cache=True)
def _lse_where(a, win, want):
    """log sum of exp(a[s]) over the s with win[s] == want (-inf if none or all -inf)."""
    m = -np.inf
    for s in range(a.shape[0]):
        if win[s] == want and a[s] > m:
            m = a[s]
    if m == -np.inf:
        return -np.inf
    acc = 0.0
    for s in range(a.shape[0]):
        if win[s] == want:
            acc += math.exp(a[s] - m)
    return m + math.log(acc)


@njit(cache=True)
def shared_exact(feat, theta, is_corr, end, rule_ac, T):
    """(log J [R], log(1 - J) [R], Gap [R, d]) for theta [R, d]: SharedSequenceBandit.exact's state sums,
    g+- = sum_s P(s | r = +-) E[s | state s] with E[s | n, m, ended] = n mu_c + (m - n) mu_w + ended phi_e - L mu
    (bandits.sequence module doc), collected per class as E[n | r], E[m - n | r], P(ended | r), E[L | r]
    before the features; log P normalised over the states as there."""
    R = theta.shape[0]
    V, d = feat.shape
    variable = end >= 0
    S = (T + 1) * (T + 2) // 2 if variable else T + 1
    ns, ms, es, win = np.empty(S, np.int64), np.empty(S, np.int64), np.empty(S, np.int64), np.empty(S, np.int64)
    s = 0
    for m in range(T + 1) if variable else range(T, T + 1):  # the order of bandits.sequence._states
        for n in range(m + 1):
            ns[s], ms[s], es[s] = n, m, 1 if (variable and m < T) else 0
            win[s] = 1 if (m >= 1 and (n == m if rule_ac else 2 * n >= m)) else 0
            s += 1
    lgam = np.empty(T + 1)
    for i in range(T + 1):
        lgam[i] = math.lgamma(i + 1.0)
    logp, p, lP = np.empty(V), np.empty(V), np.empty(S)
    mu_c, mu_w, mu, phi_e = np.empty(d), np.empty(d), np.empty(d), np.zeros(d)
    if variable:
        phi_e[:] = feat[end]
    lJ, lJbar, gap = np.empty(R), np.empty(R), np.zeros((R, d))
    for r in range(R):
        lq, lw, le = _shared_logmass(feat, theta[r], is_corr, end, logp, p)
        for s in range(S):
            n, m = ns[s], ms[s]
            lp = lgam[m] - lgam[n] - lgam[m - n]
            if n > 0:
                lp += n * lq
            if m - n > 0:
                lp += (m - n) * lw
            if es[s] > 0:
                lp += le
            lP[s] = lp
        lZ = _lse_range(lP, 0, S)
        for s in range(S):
            lP[s] -= lZ
        lJ[r], lJbar[r] = _lse_where(lP, win, 1), _lse_where(lP, win, 0)
        mu_c[:], mu_w[:], mu[:] = 0.0, 0.0, 0.0
        for v in range(V):
            wc = math.exp(logp[v] - lq) if is_corr[v] else 0.0
            ww = math.exp(logp[v] - lw) if (not is_corr[v] and v != end) else 0.0
            for j in range(d):
                mu_c[j] += wc * feat[v, j]
                mu_w[j] += ww * feat[v, j]
                mu[j] += p[v] * feat[v, j]
        for cls in (1, 0):
            lc = lJ[r] if cls == 1 else lJbar[r]
            if lc == -np.inf:  # an empty class: its conditional mean is 0, as numpy's nan_to_num makes it
                continue
            En, Ew, Ee, EL = 0.0, 0.0, 0.0, 0.0
            for s in range(S):
                if win[s] == cls:
                    ps = math.exp(lP[s] - lc)
                    En += ps * ns[s]
                    Ew += ps * (ms[s] - ns[s])
                    Ee += ps * es[s]
                    EL += ps * (ms[s] + es[s])
            sign = 1.0 if cls == 1 else -1.0
            for j in range(d):
                gap[r, j] += sign * (En * mu_c[j] + Ew * mu_w[j] + Ee * phi_e[j] - EL * mu[j])
    return lJ, lJbar, gap


@njit(cache=True)
def shared_sampled_run(feat, theta0, eta, u, stream, adv, is_corr, end, rule_ac, normalized, steps, every, tail0,
                       collapse_j, J0, Phi0):
    """Every sampled step of R runs of the shared model (as :func:`partial_sampled_run`): tokens by inverse CDF
    of the one distribution p, a response stops at its first end token (|o| = position + 1) or after T;
    s(o) = counts @ phi - |o| mu, divided by |o| if normalized. J0, Phi0 [R]: J and Phi at theta0 from the
    numpy ``exact`` (as the numpy route records them); later Phi = log P(r = 1) - log P(r = 0), J = expit(Phi)."""
    R, d = theta0.shape
    V = feat.shape[0]
    G, T = u.shape[2], u.shape[3]
    n_rec = (steps - 1) // every + 1
    rec_J, rec_Phi = np.full((R, n_rec), np.nan), np.full((R, n_rec), np.nan)
    theta = theta0.copy()
    J_out, Phi_out = np.empty(R), np.empty(R)
    J_min, J_tmin, J_tmax = np.empty(R), np.full(R, np.inf), np.full(R, -np.inf)
    cstep = np.full(R, -1, np.int64)
    logp, p, cdf = np.empty(V), np.empty(V), np.empty(V)
    lgam = np.empty(T + 1)
    for i in range(T + 1):
        lgam[i] = math.lgamma(i + 1.0)
    counts = np.zeros((G, V), np.int64)
    L, rew, A = np.empty(G, np.int64), np.empty(G, np.int64), np.empty(G)
    w, mu = np.empty(d), np.empty(d)
    for r in range(R):
        th = theta[r]
        _shared_logodds_one(feat, th, is_corr, end, rule_ac, T, logp, p, lgam)  # logp, p at theta_0
        Phi, J = Phi0[r], J0[r]
        J_min[r] = J
        if J < collapse_j:
            cstep[r] = 0
        fresh = False
        last = 0
        for step in range(steps):
            if step % every == 0:
                rec_J[r, step // every], rec_Phi[r, step // every] = J, Phi
            if not fresh:
                s = 0.0
                last = 0
                for v in range(V):
                    s += p[v]
                    cdf[v] = s
                    if p[v] > 0:
                        last = v
                fresh = True
            us = u[stream[r], step]
            c = 0
            for g in range(G):
                counts[g, :] = 0
                n, m, ended = 0, 0, 0
                for t in range(T):
                    tk = _draw(cdf, last, us[g, t])
                    counts[g, tk] += 1
                    if tk == end:
                        ended = 1
                        break
                    m += 1
                    if is_corr[tk]:
                        n += 1
                L[g] = m + ended
                rew[g] = 1 if (m >= 1 and (n == m if rule_ac else 2 * n >= m)) else 0
                c += rew[g]
            moves = False
            for g in range(G):
                A[g] = adv[c, rew[g]]
                if A[g] != 0.0:
                    moves = True
            if moves:
                mu[:] = 0.0
                for v in range(V):
                    for j in range(d):
                        mu[j] += p[v] * feat[v, j]
                w[:] = 0.0
                for g in range(G):
                    if A[g] == 0.0:
                        continue
                    a = A[g] / L[g] if normalized else A[g]
                    for j in range(d):
                        sc = -L[g] * mu[j]
                        for v in range(V):
                            if counts[g, v] > 0:
                                sc += counts[g, v] * feat[v, j]
                        w[j] += a * sc
                for j in range(d):
                    th[j] = th[j] + eta[r] * (w[j] / G)
                lJ, lJbar = _shared_logodds_one(feat, th, is_corr, end, rule_ac, T, logp, p, lgam)
                Phi = lJ - lJbar
                fresh = False
            J = _expit(Phi)
            _track(r, step + 1, J, tail0, collapse_j, J_min, J_tmin, J_tmax, cstep)
        J_out[r], Phi_out[r] = J, Phi
    return theta, rec_J, rec_Phi, J_out, Phi_out, J_min, J_tmin, J_tmax, cstep


# ---------------------------------------------------------------------------------------------
# position-wise tabular logits (bandits.sequence.TabularSequenceBandit)


@njit(cache=True)
def _tabular_logodds_one(z, correct, k, logp, p, lq, lw, pre):
    """(log J, log(1 - J)) of logits z [T, V] (J = P(N >= k), x_t ~ Bernoulli(q_t)); fills logp, p, lq, lw."""
    T, V = z.shape
    for t in range(T):
        zmax = -np.inf
        for v in range(V):
            if z[t, v] > zmax:
                zmax = z[t, v]
        s = 0.0
        for v in range(V):
            logp[t, v] = z[t, v] - zmax
            s += math.exp(logp[t, v])
        ls = math.log(s)
        for v in range(V):
            logp[t, v] -= ls
    _class_logmass(logp, correct, p, lq, lw)
    linear = _linear_ok(lq, lw)
    _count_pmf(lq, lw, pre, linear)
    full = pre[T]
    return _log_sum_range(full, k, T + 1, linear), _log_sum_range(full, 0, k, linear)


@njit(cache=True)
def tabular_log_terms(z, correct, k):
    """(log J [R], log(1 - J) [R]) for logits z [R, T, V]."""
    R, T, V = z.shape
    logp, p, lq, lw = np.empty((T, V)), np.empty((T, V)), np.empty(T), np.empty(T)
    pre = np.empty((T + 1, T + 1))
    lJ, lJbar = np.empty(R), np.empty(R)
    for r in range(R):
        lJ[r], lJbar[r] = _tabular_logodds_one(z[r], correct, k, logp, p, lq, lw, pre)
    return lJ, lJbar


@njit(cache=True)
def tabular_exact(z, correct, k):
    """(log J [R], log(1 - J) [R], Gap [R, T, V]) for logits z [R, T, V]: TabularSequenceBandit.exact, block t
    of the Gap (P(x_t = 1 | r = 1) - P(x_t = 1 | r = 0)) (e_c - u_t) with P(x_t = 1 | r = 1) = q_t P(N_{-t} >= k - 1)
    / J, P(x_t = 1 | r = 0) = q_t P(N_{-t} < k - 1) / (1 - J), the pmf of N_{-t} the convolution of the prefix
    and suffix pmfs (linear or log space as :func:`partial_exact`), u_t = p_t on the wrong tokens / (1 - q_t)."""
    R, T, V = z.shape
    logp, p, lq, lw = np.empty((T, V)), np.empty((T, V)), np.empty(T), np.empty(T)
    pre, suf, loo, tmp = np.empty((T + 1, T + 1)), np.empty((T, T + 1)), np.empty(T), np.empty(T)
    lJ, lJbar, gap = np.empty(R), np.empty(R), np.zeros((R, T, V))
    for r in range(R):
        lJ[r], lJbar[r] = _tabular_logodds_one(z[r], correct, k, logp, p, lq, lw, pre)
        linear = _linear_ok(lq, lw)
        _suffix_pmf(lq, lw, suf, linear)
        for t in range(T):
            for j in range(T):  # loo[j] = P(N_{-t} = j) = sum_i pre[t, i] suf[t, j - i], i <= t, j - i <= T - 1 - t
                lo, hi = max(0, j - (T - 1 - t)), min(j, t)
                if linear:
                    acc = 0.0
                    for i in range(lo, hi + 1):
                        acc += pre[t, i] * suf[t, j - i]
                    loo[j] = acc
                else:
                    for i in range(lo, hi + 1):
                        tmp[i - lo] = pre[t, i] + suf[t, j - i]
                    loo[j] = _lse_range(tmp, 0, hi - lo + 1)
            a1 = math.exp(lq[t] + _log_sum_range(loo, k - 1, T, linear) - lJ[r])
            a0 = math.exp(lq[t] + _log_sum_range(loo, 0, k - 1, linear) - lJbar[r])
            g = a1 - a0
            for v in range(V):
                gap[r, t, v] = g if v == correct else -(g * math.exp(logp[t, v] - lw[t]))
    return lJ, lJbar, gap


@njit(cache=True)
def tabular_sampled_run(z0, eta, u, stream, adv, correct, k, scale, steps, every, tail0, collapse_j):
    """Every sampled step of R runs of the tabular model (as :func:`partial_sampled_run`): z [R, T, V], the
    score of a response is e_{o_t} - p_t per position, w = (scale / G) sum_i A_i s(o_i)."""
    R, T, V = z0.shape
    G = u.shape[2]
    n_rec = (steps - 1) // every + 1
    rec_J, rec_Phi = np.full((R, n_rec), np.nan), np.full((R, n_rec), np.nan)
    z = z0.copy()
    J_out, Phi_out = np.empty(R), np.empty(R)
    J_min, J_tmin, J_tmax = np.empty(R), np.full(R, np.inf), np.full(R, -np.inf)
    cstep = np.full(R, -1, np.int64)
    logp, p, lq, lw = np.empty((T, V)), np.empty((T, V)), np.empty(T), np.empty(T)
    pre, cdf, last = np.empty((T + 1, T + 1)), np.empty((T, V)), np.empty(T, np.int64)
    tok, rew, A = np.empty((G, T), np.int64), np.empty(G, np.int64), np.empty(G)
    w = np.empty((T, V))
    for r in range(R):
        zr = z[r]
        lJ, lJbar = _tabular_logodds_one(zr, correct, k, logp, p, lq, lw, pre)
        Phi = lJ - lJbar
        J = math.exp(min(lJ, 0.0))
        J_min[r] = J
        if J < collapse_j:
            cstep[r] = 0
        fresh = False
        for step in range(steps):
            if step % every == 0:
                rec_J[r, step // every], rec_Phi[r, step // every] = J, Phi
            if not fresh:
                _cdf_rows(p, cdf, last)
                fresh = True
            c = _draw_group(cdf, last, u[stream[r], step], correct, k, tok, rew)
            moves = False
            asum = 0.0
            for g in range(G):
                A[g] = adv[c, rew[g]]
                asum += A[g] * scale
                if A[g] != 0.0:
                    moves = True
            if moves:
                for t in range(T):  # sum_i a_i (e_{o_it} - p_t) = sum_i a_i e_{o_it} - (sum_i a_i) p_t
                    for v in range(V):
                        w[t, v] = -asum * p[t, v]
                for g in range(G):
                    for t in range(T):
                        w[t, tok[g, t]] += A[g] * scale
                for t in range(T):
                    for v in range(V):
                        zr[t, v] = zr[t, v] + eta[r] * (w[t, v] / G)
                lJ, lJbar = _tabular_logodds_one(zr, correct, k, logp, p, lq, lw, pre)
                Phi = lJ - lJbar
                fresh = False
            J = _expit(Phi)
            _track(r, step + 1, J, tail0, collapse_j, J_min, J_tmin, J_tmax, cstep)
        J_out[r], Phi_out[r] = J, Phi
    return z, rec_J, rec_Phi, J_out, Phi_out, J_min, J_tmin, J_tmax, cstep
