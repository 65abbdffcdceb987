"""Vectorised dynamics of policy-gradient updates on the contextual bandit (numba kernels, float64).

One call of :func:`simulate` runs R independent runs (seeds x step sizes) of

    theta_{k+1} = theta_k + eta_k u_k          (per parameter block; THEORY.md §2)

where u_k is the update direction of one of gapdyn's methods (``gapdyn.METHOD_NAMES``) or the Gap itself
(``method="gap"``: log-odds ascent, grad Phi = g+ - g-), optionally unit-normalised and/or passed through
Adam, and eta_k follows a :class:`bandits.schedules.Schedule`. Directions:

- ``mode="exact"``: the expected update E[w] = scalar(J, G) (g+ - g-) (gapdyn.expected_scalar: J(1-J),
  (1-1/G) J(1-J), c_G(J), ...), per context;
- ``mode="sampled"``: one group of G arms per context drawn by inverse CDF from pre-drawn uniforms
  (``numpy.random.default_rng(seed).random((C, G))`` per step, in step order: the plain loop of
  :mod:`bandits.reference` reproduces the stream), w = (1/G) sum_i A_i s(o_i) with gapdyn's advantage
  rules (re-implemented in numba; tests check them equal to ``gapdyn.group_advantages``).

Contexts sharing a parameter block average their directions: w_p = mean_{x: p(x) = p} w_x.

Recorded per step k (every ``record_every`` steps) and context: J, Phi, entropy H at theta_k; the update's
Delta mu = <u_k, g+ - g->, ||u_k||, M(k) = sum_{j<k} eta_j [Delta mu_j]_+ (before step k, so that J(k) and
M(k) pair as in Theorem 1), and the realised change Phi(theta_{k+1}) - Phi(theta_k); eta_k per block.
Same inputs give bitwise-identical outputs (no threads, no fastmath).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import numpy as np
from numba import njit

import gapdyn
from gapdyn._validate import check_group_size, check_positive

from .envs import ContextualBandit
from .schedules import SCHEDULES, Schedule

__all__ = ["DIRECTIONS", "MODES", "Dynamics", "Trajectory", "simulate", "run_grid", "advantages_nb", "exact_scalar_nb"]

DIRECTIONS: tuple[str, ...] = tuple(gapdyn.METHOD_NAMES) + ("gap",)
MODES = ("exact", "sampled")
_CODE = {"reinforce": 0, "rloo": 1, "grpo": 2, "dr_grpo": 3, "wapo": 4, "psr": 5, "nsr": 6, "w_reinforce": 7, "gap": 8}
_SCHED = {name: i for i, name in enumerate(SCHEDULES)}  # constant 0, decay 1, linesearch 2, adaptive 3


@dataclass(frozen=True)
class Dynamics:
    """What one simulation does (everything but eta, seed and theta0).

    Attributes:
        method: a gapdyn method name, or "gap" (w = g+ - g-, log-odds ascent; exact mode only).
        mode: "exact" (expected update) or "sampled" (one group of G per context per step).
        group_size: G >= 2 (also enters the exact scalars of dr_grpo, wapo, grpo).
        steps: number of updates.
        schedule: a Schedule or its kind ("constant", "decay", "linesearch", "adaptive").
        normalize: divide each block's w by ||w|| (unit steps) before the optimiser.
        optimizer: "sgd" (u = w) or "adam" (u = Adam's m_hat / (sqrt(v_hat) + eps)).
        adam_betas, adam_eps: Adam's constants.
        std, adv_eps: GRPO's std ("population" | "bessel") and epsilon; lam: W-REINFORCE's lambda.
        record_every: record steps 0, s, 2s, ... (the final state is always kept).
    """

    method: str = "grpo"
    mode: str = "exact"
    group_size: int = 8
    steps: int = 1000
    schedule: Schedule | str = "constant"
    normalize: bool = False
    optimizer: str = "sgd"
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    std: str = "population"
    adv_eps: float = 0.0
    lam: float = 0.1
    record_every: int = 1

    def __post_init__(self):
        if self.method not in DIRECTIONS:
            raise ValueError(f"method must be one of {DIRECTIONS}, got {self.method!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.method == "gap" and self.mode != "exact":
            raise ValueError("method 'gap' (log-odds ascent) needs mode='exact'")
        check_group_size(self.group_size)
        for name in ("steps", "record_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        sched = self.schedule if isinstance(self.schedule, Schedule) else Schedule(self.schedule)
        object.__setattr__(self, "schedule", sched)
        if self.optimizer not in ("sgd", "adam"):
            raise ValueError(f"optimizer must be 'sgd' or 'adam', got {self.optimizer!r}")
        if self.std not in ("population", "bessel"):
            raise ValueError(f"std must be 'population' or 'bessel', got {self.std!r}")
        if not (isinstance(self.adv_eps, numbers.Real) and np.isfinite(self.adv_eps) and self.adv_eps >= 0):
            raise ValueError(f"adv_eps must be finite and >= 0, got {self.adv_eps!r}")
        if not (isinstance(self.lam, numbers.Real) and np.isfinite(self.lam) and self.lam >= 0):
            raise ValueError(f"lam must be finite and >= 0, got {self.lam!r}")
        b1, b2 = self.adam_betas
        if not (0 <= b1 < 1 and 0 <= b2 < 1):
            raise ValueError(f"adam_betas must lie in [0, 1), got {self.adam_betas!r}")
        check_positive(self.adam_eps, "adam_eps")

    @property
    def method_opts(self) -> dict:
        """Options for gapdyn.group_advantages / expected_scalar."""
        if self.method == "grpo":
            return {"std": self.std, "eps": self.adv_eps}
        if self.method == "w_reinforce":
            return {"lam": self.lam}
        return {}


@dataclass(frozen=True)
class Trajectory:
    """Output of :func:`simulate` (R runs, n_rec recorded steps, C contexts, P blocks, d dims)."""

    steps: np.ndarray  # [n_rec] global step index of each record
    J: np.ndarray  # [R, n_rec, C] success rate at theta_k
    Phi: np.ndarray  # [R, n_rec, C] log-odds at theta_k
    dmu: np.ndarray  # [R, n_rec, C] <u_k, gap_k>
    M: np.ndarray  # [R, n_rec, C] cumulative alignment before step k
    wnorm: np.ndarray  # [R, n_rec, C] ||u_k|| of the context's block
    dPhi: np.ndarray  # [R, n_rec, C] Phi(theta_{k+1}) - Phi(theta_k)
    entropy: np.ndarray  # [R, n_rec, C] policy entropy at theta_k (nats)
    eta: np.ndarray  # [R, n_rec, P] step size used at step k
    J_final: np.ndarray  # [R, C] after the last step
    Phi_final: np.ndarray  # [R, C]
    M_final: np.ndarray  # [R, C]
    J_min: np.ndarray  # [R, C] min of J over all steps (incl. final)
    n_decrease: np.ndarray  # [R, C] number of steps with a realised decrease of Phi
    theta_final: np.ndarray  # [R, P, d]
    eta0: np.ndarray  # [R, P]
    seed: np.ndarray  # [R]
    dynamics: Dynamics = field(repr=False, default=None)

    @property
    def failure_final(self) -> np.ndarray:
        """1 - J after the last step, accurate near J = 1 (= sigmoid(-Phi))."""
        from scipy.special import expit

        return expit(-self.Phi_final)


# ---------------------------------------------------------------------------------------------
# numba kernels
# ---------------------------------------------------------------------------------------------


@njit(cache=True)
def _grpo_table(G, bessel, eps):
    """[3, G] terms of GRPO's c_G that do not depend on J, for m = 1..G-1: log Binom(G, m) (lgamma(G+1) -
    lgamma(m+1) - lgamma(G-m+1)), x_m = p_m (1 - p_m) with p_m = m / G, and sqrt(k x_m) + eps (k = G/(G-1)
    for the Bessel std, else 1). Computed once per kernel call; _exact_scalar uses them in the same
    operation order as evaluating them inline (bitwise-equal c_G)."""
    tab = np.zeros((3, G))
    k = G / (G - 1.0) if bessel and G > 1 else 1.0  # G > 1: the table is also built for other methods
    lgG = math.lgamma(G + 1.0)
    for m in range(1, G):
        ph = m / G
        x = ph * (1.0 - ph)
        tab[0, m] = lgG - math.lgamma(m + 1.0) - math.lgamma(G - m + 1.0)
        tab[1, m] = x
        tab[2, m] = math.sqrt(k * x) + eps
    return tab


@njit(cache=True)
def _exact_scalar(method, J, Jb, G, tab, lam):
    """E[w] / Gap for each method (gapdyn.methods table); J and Jb = 1 - J computed separately;
    tab = _grpo_table(G, bessel, eps) (read by GRPO only)."""
    if method == 8:
        return 1.0
    if method == 0 or method == 1 or method == 5 or method == 6:
        return J * Jb
    if method == 3:
        return (1.0 - 1.0 / G) * J * Jb
    if method == 4:
        return (1.0 - 1.0 / G) * J * Jb * Jb
    if method == 7:
        return (1.0 + lam) * J * Jb
    # grpo: c_G(J) = sum_m Binom(m; G, J) x / (sqrt(k x) + eps), x = p_hat (1 - p_hat)
    if J <= 0.0 or Jb <= 0.0:
        return 0.0
    lJ, lJb = math.log(J), math.log(Jb)
    tot = 0.0
    for m in range(1, G):
        lp = tab[0, m] + m * lJ + (G - m) * lJb
        tot += math.exp(lp) * tab[1, m] / tab[2, m]
    return tot


@njit(cache=True)
def _advantages(method, r, A, bessel, eps, lam):
    """Group advantages A_i (gapdyn.methods rules) for binary rewards r [G], written into A."""
    G = r.shape[0]
    s = 0.0
    for i in range(G):
        s += r[i]
    mean = s / G
    if method == 0 or method == 5:
        for i in range(G):
            A[i] = r[i]
    elif method == 1:
        for i in range(G):
            A[i] = (G * r[i] - s) / (G - 1)
    elif method == 3:
        for i in range(G):
            A[i] = r[i] - mean
    elif method == 2:
        ss = 0.0
        for i in range(G):
            ss += (r[i] - mean) ** 2
        sd = math.sqrt(ss / ((G - 1) if bessel else G)) + eps
        for i in range(G):
            A[i] = (r[i] - mean) / sd if sd > 0 else 0.0
    elif method == 4:
        for i in range(G):
            a = r[i] - mean
            A[i] = a if a > 0 else 0.0
    elif method == 6:
        for i in range(G):
            A[i] = r[i] - 1.0
    else:
        for i in range(G):
            A[i] = lam if r[i] > 0 else -1.0


@njit(cache=True)
def _logits(featT, c, th, z):
    """z_a = sum_j phi_j(c, a) th_j, summed in j order per arm (bitwise the plain per-arm dot product);
    featT [C, d, K] makes the loop over arms elementwise, so it vectorises without fast-math."""
    d, K = featT.shape[1], featT.shape[2]
    for a in range(K):
        z[a] = 0.0
    for j in range(d):
        tj = th[j]
        for a in range(K):
            z[a] += featT[c, j, a] * tj


@njit(cache=True)
def _class_max(rew, c, z, K):
    """(max logit over correct arms, max over incorrect arms) of context c: the log-sum-exp shifts."""
    zmp, zmn = -np.inf, -np.inf
    for a in range(K):
        s = z[a]
        if rew[c, a] > 0.5:
            if s > zmp:
                zmp = s
        elif s > zmn:
            zmn = s
    return zmp, zmn


@njit(cache=True)
def _forward(feat, featT, rew, fnorm, c, th, z, p, cw, gap, mphi, want_mphi, cdf, want_cdf):
    """Logits, pi, J, 1-J, Phi, entropy, Gap and E_pi[phi] of context c at parameters th.

    Returns (J, Jbar, Phi, H, lse_pos, lse_neg, gs) with gs = sum_a |cw_a| ||phi_a|| (the scale of the
    terms that cancel in Gap); z, p, cw (pi+ on correct arms, -pi- on incorrect), gap, (if want_mphi) mphi
    and (if want_cdf) cdf = cumsum(p) are filled in place.
    """
    K, d = feat.shape[1], feat.shape[2]
    _logits(featT, c, th, z)
    zmp, zmn = _class_max(rew, c, z, K)
    # one exp per arm: e_a = exp(z_a - max of its own reward class)
    Sp, Sn = 0.0, 0.0
    for a in range(K):
        if rew[c, a] > 0.5:
            e = math.exp(z[a] - zmp)
            Sp += e
        else:
            e = math.exp(z[a] - zmn)
            Sn += e
        cw[a] = e
    lsep = zmp + math.log(Sp)
    lsen = zmn + math.log(Sn)
    zmax = max(zmp, zmn)
    lse = zmax + math.log(Sp * math.exp(zmp - zmax) + Sn * math.exp(zmn - zmax))
    fp, fn = math.exp(zmp - lse), math.exp(zmn - lse)
    H = 0.0
    gs = 0.0
    acc = 0.0
    for j in range(d):
        gap[j] = 0.0
        mphi[j] = 0.0
    for a in range(K):
        if rew[c, a] > 0.5:
            p[a] = cw[a] * fp
            cw[a] = cw[a] / Sp
        else:
            p[a] = cw[a] * fn
            cw[a] = -cw[a] / Sn
        H -= p[a] * (z[a] - lse)
        wa = cw[a]
        gs += abs(wa) * fnorm[c, a]
        for j in range(d):
            gap[j] += wa * feat[c, a, j]
        if want_mphi:
            pa = p[a]
            for j in range(d):
                mphi[j] += pa * feat[c, a, j]
    if want_cdf:  # a separate pass: storing cdf inside the loop above costs more than this loop
        for a in range(K):
            acc += p[a]
            cdf[a] = acc
    return math.exp(lsep - lse), math.exp(lsen - lse), lsep - lsen, H, lsep, lsen, gs


@njit(cache=True)
def _logodds(featT, rew, c, th, z):
    """Phi of context c at th (log-sum-exp over correct minus incorrect arms); z is scratch [K]."""
    K = featT.shape[2]
    _logits(featT, c, th, z)
    zmp, zmn = _class_max(rew, c, z, K)
    Sp, Sn = 0.0, 0.0
    for a in range(K):
        if rew[c, a] > 0.5:
            Sp += math.exp(z[a] - zmp)
        else:
            Sn += math.exp(z[a] - zmn)
    return (zmp + math.log(Sp)) - (zmn + math.log(Sn))


@njit(cache=True)
def _search_right(cdf, x):
    """numpy.searchsorted(cdf, x, side='right') for increasing cdf."""
    lo, hi = 0, cdf.shape[0]
    while lo < hi:
        mid = (lo + hi) // 2
        if x < cdf[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


@njit(cache=True)
def _kernel(
    feat, featT, rew, fnorm, pmap, blk_ptr, blk_ctx,  # bandit
    theta, am, av, M, phi_prev, J_min, ndec,  # state (in/out)
    eta0, unif, k0, n_steps, do_final, total_steps,  # run inputs
    method, sampled, G, bessel, aeps, lam, normalize, sched, ac, tr_delta, max_halv, adam, b1, b2, adam_eps, rec_every,
    o_J, o_Phi, o_dmu, o_M, o_wn, o_dPhi, o_H, o_eta,  # records
    f_J, f_Phi,  # final values
):
    R = theta.shape[0]
    P = theta.shape[1]
    C, K, d = feat.shape[0], feat.shape[1], feat.shape[2]
    z_all = np.empty((C, K))
    p_all = np.empty((C, K))
    cw_all = np.empty((C, K))
    cdf_all = np.empty((C, K))  # sampled mode: cumsum of pi per context
    gs_all = np.empty(C)  # exact mode: sum_a |cw_a| ||phi_a|| per context
    tab = _grpo_table(G, bessel, aeps)
    gap = np.empty((C, d))
    mphi = np.empty((C, d))
    Jc = np.empty(C)
    Jbc = np.empty(C)
    Phic = np.empty(C)
    Hc = np.empty(C)
    lsep = np.empty(C)
    lsen = np.empty(C)
    w = np.empty((P, d))
    wabs = np.empty(P)
    u = np.empty((P, d))
    eta = np.empty(P)
    cdf = np.empty(K)
    idx = np.empty((C, G), np.int64)
    rg = np.empty((C, G))
    A = np.empty(G)
    trial = np.empty(d)
    for r in range(R):
        for k in range(n_steps + do_final):
            kk = k0 + k
            update = k < n_steps
            # 1) forward pass at theta_kk
            for c in range(C):
                J, Jb, Ph, H, lp, ln, gsc = _forward(
                    feat, featT, rew, fnorm, c, theta[r, pmap[c]], z_all[c], p_all[c], cw_all[c], gap[c], mphi[c],
                    False, cdf_all[c], sampled and update,
                )
                Jc[c], Jbc[c], Phic[c], Hc[c], lsep[c], lsen[c], gs_all[c] = J, Jb, Ph, H, lp, ln, gsc
                if kk > 0:
                    dph = Ph - phi_prev[r, c]
                    if dph < -1e-12 * (1.0 + abs(Ph)):
                        ndec[r, c] += 1
                    if (kk - 1) % rec_every == 0:
                        o_dPhi[r, (kk - 1) // rec_every, c] = dph
                phi_prev[r, c] = Ph
                if J < J_min[r, c]:
                    J_min[r, c] = J
            rec = kk % rec_every == 0 and update
            ri = kk // rec_every
            if rec:
                for c in range(C):
                    o_J[r, ri, c] = Jc[c]
                    o_Phi[r, ri, c] = Phic[c]
                    o_H[r, ri, c] = Hc[c]
                    o_M[r, ri, c] = M[r, c]
            if not update:
                for c in range(C):
                    f_J[r, c] = Jc[c]
                    f_Phi[r, c] = Phic[c]
                continue
            # 2) direction per context, averaged into its block
            w[:, :] = 0.0
            wabs[:] = 0.0
            for c in range(C):
                pb = pmap[c]
                nb = blk_ptr[pb + 1] - blk_ptr[pb]
                if not sampled:
                    sc = _exact_scalar(method, Jc[c], Jbc[c], G, tab, lam) / nb
                    for j in range(d):
                        w[pb, j] += sc * gap[c, j]
                    # gs_all[c]: scale of the terms that cancel in gap = sum_a cw_a phi_a (from _forward)
                    wabs[pb] += abs(sc) * gs_all[c]
                else:
                    cdfc = cdf_all[c]  # cumsum of pi, accumulated in _forward
                    for i in range(G):
                        a = _search_right(cdfc, unif[r, k, c, i] * cdfc[K - 1])
                        if a > K - 1:
                            a = K - 1
                        idx[c, i] = a
                        rg[c, i] = rew[c, a]
                    _advantages(method, rg[c], A, bessel, aeps, lam)
                    # w_x = (1/G) sum_i A_i phi(a_i) - (1/G) (sum_i A_i) E_pi[phi]
                    sA = 0.0
                    for i in range(G):
                        f = A[i] / G / nb
                        sA += f
                        if f != 0.0:
                            a = idx[c, i]
                            wabs[pb] += abs(f) * fnorm[c, a]
                            for j in range(d):
                                w[pb, j] += f * feat[c, a, j]
                    if sA != 0.0:
                        mn = 0.0
                        for j in range(d):
                            mphi[c, j] = 0.0
                        for a in range(K):
                            pa = p_all[c, a]
                            mn += pa * fnorm[c, a]
                            for j in range(d):
                                mphi[c, j] += pa * feat[c, a, j]
                        wabs[pb] += abs(sA) * mn
                        for j in range(d):
                            w[pb, j] -= sA * mphi[c, j]
            # 3) round-off cleanup, normalise, optimiser
            for pb in range(P):
                # a direction below 1e-12 of the terms it cancels from is round-off: make it exactly 0
                nrm = 0.0
                for j in range(d):
                    nrm += w[pb, j] * w[pb, j]
                if math.sqrt(nrm) <= 1e-12 * wabs[pb]:
                    for j in range(d):
                        w[pb, j] = 0.0
                if normalize:
                    nrm = 0.0
                    for j in range(d):
                        nrm += w[pb, j] * w[pb, j]
                    nrm = math.sqrt(nrm)
                    if nrm > 0:
                        for j in range(d):
                            w[pb, j] /= nrm
                if adam:
                    t = kk + 1.0
                    for j in range(d):
                        am[r, pb, j] = b1 * am[r, pb, j] + (1.0 - b1) * w[pb, j]
                        av[r, pb, j] = b2 * av[r, pb, j] + (1.0 - b2) * w[pb, j] * w[pb, j]
                        u[pb, j] = (am[r, pb, j] / (1.0 - b1**t)) / (math.sqrt(av[r, pb, j] / (1.0 - b2**t)) + adam_eps)
                else:
                    for j in range(d):
                        u[pb, j] = w[pb, j]
            # 4) step size per block
            for pb in range(P):
                e0 = eta0[r, pb]
                if sched == 0:
                    eta[pb] = e0
                elif sched == 1:
                    eta[pb] = e0 / math.sqrt(kk + 1.0)
                elif sched == 2:
                    base = 0.0
                    for q in range(blk_ptr[pb], blk_ptr[pb + 1]):
                        base += Phic[blk_ctx[q]]
                    e = e0
                    ok = False
                    dmb = 0.0  # first-order change; below the resolution of Phi the test is meaningless
                    for q in range(blk_ptr[pb], blk_ptr[pb + 1]):
                        for j in range(d):
                            dmb += u[pb, j] * gap[blk_ctx[q], j]
                    nh = max_halv + 1
                    if e0 * abs(dmb) <= 1e-12 * (1.0 + abs(base)):
                        ok = True
                        nh = 0  # skip the search: take eta0
                    for h in range(nh):
                        for j in range(d):
                            trial[j] = theta[r, pb, j] + e * u[pb, j]
                        tot = 0.0
                        for q in range(blk_ptr[pb], blk_ptr[pb + 1]):
                            tot += _logodds(featT, rew, blk_ctx[q], trial, cdf)
                        if tot > base:
                            ok = True
                            break
                        e *= 0.5
                        if e == 0.0:  # underflow: stop (a huge max_halvings must not hang)
                            break
                    eta[pb] = e if ok else 0.0
                else:
                    dsum, ksum, cnt, sdmax = 0.0, 0.0, 0, 0.0
                    for q in range(blk_ptr[pb], blk_ptr[pb + 1]):
                        c = blk_ctx[q]
                        if not sampled:
                            # population moments of x_a = u . phi(a) under pi, pi+ and pi-
                            mp_, mn_, m_ = 0.0, 0.0, 0.0
                            for a in range(K):
                                x = 0.0
                                for j in range(d):
                                    x += u[pb, j] * feat[c, a, j]
                                cdf[a] = x  # reuse as scratch
                                m_ += p_all[c, a] * x
                                if rew[c, a] > 0.5:
                                    mp_ += cw_all[c, a] * x
                                else:
                                    mn_ -= cw_all[c, a] * x
                            vp, vn, v_ = 0.0, 0.0, 0.0
                            for a in range(K):
                                v_ += p_all[c, a] * (cdf[a] - m_) ** 2
                                if rew[c, a] > 0.5:
                                    vp += cw_all[c, a] * (cdf[a] - mp_) ** 2
                                else:
                                    vn -= cw_all[c, a] * (cdf[a] - mn_) ** 2
                            sdmax = max(sdmax, math.sqrt(v_))
                            dsum += mp_ - mn_
                            ksum += vn - vp
                            cnt += 1
                        else:
                            n1, n0, s1, s0 = 0, 0, 0.0, 0.0
                            for i in range(G):
                                x = 0.0
                                a = idx[c, i]
                                for j in range(d):
                                    x += u[pb, j] * feat[c, a, j]
                                A[i] = x  # scratch
                                if rg[c, i] > 0.5:
                                    n1 += 1
                                    s1 += x
                                else:
                                    n0 += 1
                                    s0 += x
                            mall = (s1 + s0) / G
                            vall = 0.0
                            for i in range(G):
                                vall += (A[i] - mall) ** 2
                            sdmax = max(sdmax, math.sqrt(vall / (G - 1)))
                            if n1 == 0 or n0 == 0:
                                continue
                            m1, m0 = s1 / n1, s0 / n0
                            v1, v0 = 0.0, 0.0
                            for i in range(G):
                                if rg[c, i] > 0.5:
                                    v1 += (A[i] - m1) ** 2
                                else:
                                    v0 += (A[i] - m0) ** 2
                            v1 = v1 / (n1 - 1) if n1 >= 2 else 0.0
                            v0 = v0 / (n0 - 1) if n0 >= 2 else 0.0
                            dsum += m1 - m0
                            ksum += v0 - v1
                            cnt += 1
                    e = e0
                    if sdmax > 0.0:
                        e = min(e, tr_delta / sdmax)
                    if cnt > 0:
                        dh, kh = dsum / cnt, ksum / cnt
                        if dh <= 1e-12 * sdmax:  # no ascent (up to round-off: ties at 0 give 0 in any route)
                            e = 0.0
                        elif kh > 0.0:
                            e = min(e, ac * dh / kh)
                    eta[pb] = e
            # 5) records, cumulative alignment, update
            for c in range(C):
                pb = pmap[c]
                dm, nn = 0.0, 0.0
                for j in range(d):
                    dm += u[pb, j] * gap[c, j]
                    nn += u[pb, j] * u[pb, j]
                if rec:
                    o_dmu[r, ri, c] = dm
                    o_wn[r, ri, c] = math.sqrt(nn)
                if dm > 0:
                    M[r, c] += eta[pb] * dm
            for pb in range(P):
                if rec:
                    o_eta[r, ri, pb] = eta[pb]
                for j in range(d):
                    theta[r, pb, j] += eta[pb] * u[pb, j]


# small wrappers so that tests can compare the numba rules with gapdyn's
@njit(cache=True)
def _advantages_batch(method, r, bessel, eps, lam):
    out = np.empty_like(r)
    for b in range(r.shape[0]):
        _advantages(method, r[b], out[b], bessel, eps, lam)
    return out


def advantages_nb(method: str, rewards, *, std: str = "population", eps: float = 0.0, lam: float = 0.1) -> np.ndarray:
    """The numba advantage rule applied to groups rewards [B, G] (for tests against gapdyn)."""
    r = np.ascontiguousarray(np.asarray(rewards, dtype=np.float64).reshape(-1, np.shape(rewards)[-1]))
    return _advantages_batch(_CODE[method], r, std == "bessel", float(eps), float(lam)).reshape(np.shape(rewards))


def exact_scalar_nb(method: str, J: float, G: int, *, std: str = "population", eps: float = 0.0, lam: float = 0.1):
    """The numba expected scalar E[w] / Gap at success rate J (for tests against gapdyn)."""
    tab = _grpo_table(int(G), std == "bessel", float(eps))
    return _exact_scalar(_CODE[method], float(J), float(1.0 - J), int(G), tab, float(lam))


# ---------------------------------------------------------------------------------------------
# driver
# ---------------------------------------------------------------------------------------------


def _runs(bandit: ContextualBandit, eta, seed, theta0):
    P, d = bandit.n_params, bandit.dim
    eta_arr = np.asarray(eta, dtype=np.float64)
    if eta_arr.ndim > 2:
        raise ValueError(f"eta must be a scalar, [R] or [R, P], got shape {eta_arr.shape}")
    if eta_arr.size == 0 or not np.all(np.isfinite(eta_arr)) or np.any(eta_arr <= 0):
        raise ValueError("eta must be finite and > 0 (every entry)")
    seed_arr = np.atleast_1d(np.asarray(seed))
    if seed_arr.ndim != 1 or not np.issubdtype(seed_arr.dtype, np.integer) or np.any(seed_arr < 0):
        raise ValueError(f"seed must be a non-negative integer or a 1-D array of them, got {seed!r}")
    R = max(eta_arr.shape[0] if eta_arr.ndim >= 1 else 1, seed_arr.shape[0])
    if eta_arr.ndim == 2 and eta_arr.shape[1] != P:
        raise ValueError(f"eta of shape [R, P] needs P = {P} blocks, got {eta_arr.shape}")
    e = eta_arr.reshape(-1, 1) if eta_arr.ndim < 2 else eta_arr
    try:
        e = np.ascontiguousarray(np.broadcast_to(e, (R, P)), dtype=np.float64)
        s = np.broadcast_to(seed_arr, (R,)).astype(np.int64)
    except ValueError as exc:
        raise ValueError(f"eta {eta_arr.shape} and seed {seed_arr.shape} must broadcast to R runs") from exc
    if theta0 is None:
        th = np.zeros((R, P, d))
    else:
        th0 = np.asarray(theta0, dtype=np.float64)
        if th0.shape not in ((P, d), (R, P, d)) or not np.all(np.isfinite(th0)):
            raise ValueError(f"theta0 must be finite of shape {(P, d)} or {(R, P, d)}, got {th0.shape}")
        th = np.ascontiguousarray(np.broadcast_to(th0, (R, P, d)), dtype=np.float64).copy()
    return e, s, th


def simulate(bandit: ContextualBandit, dyn: Dynamics, *, eta, seed=0, theta0=None, chunk: int = 256) -> Trajectory:
    """Run R = len(eta) (or len(seed)) runs of ``dyn`` on ``bandit`` (see the module docstring).

    Args:
        bandit: the environment.
        dyn: the dynamics config.
        eta: eta0 per run: scalar, [R], or [R, P] (one per parameter block).
        seed: per-run seed (int or [R]); run r's group draws come from numpy.random.default_rng(seed[r]).
            Runs with equal seeds share their random stream (common random numbers across etas).
        theta0: start [P, d] or [R, P, d] (default 0).
        chunk: steps per kernel call (bounds the memory of the pre-drawn uniforms).
    """
    if not isinstance(bandit, ContextualBandit):
        raise ValueError(f"bandit must be a ContextualBandit, got {type(bandit).__name__}")
    if not isinstance(dyn, Dynamics):
        raise ValueError(f"dyn must be a Dynamics, got {type(dyn).__name__}")
    eta0, seeds, theta = _runs(bandit, eta, seed, theta0)
    R, P, d = theta.shape
    C, G, T, every = bandit.n_contexts, dyn.group_size, dyn.steps, dyn.record_every
    n_rec = (T - 1) // every + 1
    pmap = bandit.param_map
    fnorm = np.linalg.norm(bandit.features, axis=-1)  # ||phi(x, a)||, the scale of round-off in w
    featT = np.ascontiguousarray(np.swapaxes(bandit.features, 1, 2))  # [C, d, K]: logits vectorise over arms
    order = np.argsort(pmap, kind="stable")
    blk_ptr = np.searchsorted(pmap[order], np.arange(P + 1)).astype(np.int64)
    am, av = np.zeros((R, P, d)), np.zeros((R, P, d))
    M, phi_prev = np.zeros((R, C)), np.zeros((R, C))
    J_min, ndec = np.full((R, C), np.inf), np.zeros((R, C), np.int64)
    rec = {k: np.full((R, n_rec, C), np.nan) for k in ("J", "Phi", "dmu", "M", "wnorm", "dPhi", "entropy")}
    rec_eta = np.full((R, n_rec, P), np.nan)
    f_J, f_Phi = np.full((R, C), np.nan), np.full((R, C), np.nan)
    sched = dyn.schedule
    b1, b2 = dyn.adam_betas
    rngs = [np.random.default_rng(int(s)) for s in seeds] if dyn.mode == "sampled" else None
    chunk = max(1, int(chunk))
    for start in range(0, T, chunk):
        n = min(chunk, T - start)
        last = start + n == T
        if rngs is not None:
            unif = np.empty((R, n, C, G))
            for r in range(R):
                unif[r] = rngs[r].random((n, C, G))
        else:
            unif = np.empty((R, 0, C, G))
        _kernel(
            bandit.features, featT, bandit.rewards, fnorm, pmap, blk_ptr, order,
            theta, am, av, M, phi_prev, J_min, ndec,
            eta0, unif, start, n, int(last), T,
            _CODE[dyn.method], dyn.mode == "sampled", G, dyn.std == "bessel", float(dyn.adv_eps), float(dyn.lam),
            bool(dyn.normalize), _SCHED[sched.kind], float(sched.c), float(sched.delta), int(sched.max_halvings),
            dyn.optimizer == "adam", float(b1), float(b2), float(dyn.adam_eps), every,
            rec["J"], rec["Phi"], rec["dmu"], rec["M"], rec["wnorm"], rec["dPhi"], rec["entropy"], rec_eta,
            f_J, f_Phi,
        )  # fmt: skip
    return Trajectory(
        steps=np.arange(0, T, every),
        **rec,
        eta=rec_eta,
        J_final=f_J,
        Phi_final=f_Phi,
        M_final=M,
        J_min=J_min,
        n_decrease=ndec,
        theta_final=theta,
        eta0=eta0,
        seed=seeds,
        dynamics=dyn,
    )


def run_grid(bandit: ContextualBandit, dyn: Dynamics, *, etas, seeds, theta0=None, chunk: int = 256):
    """simulate() over the product etas x seeds; returns (Trajectory, eta per run, seed per run)."""
    try:
        e = np.asarray(etas, dtype=np.float64).ravel()
        s = np.asarray(seeds, dtype=np.int64).ravel()
    except (TypeError, ValueError) as exc:
        raise ValueError(f"etas must be real numbers and seeds non-negative integers, got {etas!r}, {seeds!r}") from exc
    E, S = np.meshgrid(e, s, indexing="ij")
    traj = simulate(bandit, dyn, eta=E.ravel(), seed=S.ravel(), theta0=theta0, chunk=chunk)
    return traj, E.ravel(), S.ravel()
