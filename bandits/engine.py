"""Vectorised dynamics of policy-gradient updates on the contextual bandit (numba kernels, float64).

One call of :func:`simulate` runs R independent runs (seeds x step sizes) of

    theta_{k+1} = theta_k + eta_k u_k          (per parameter block; docs/theory.md)

where u_k is the update direction of one of gapdyn's methods (``gapdyn.METHOD_NAMES``) or the Gap itself
(``method="gap"``: log-odds ascent, grad Phi = g+ - g-), optionally unit-normalised and/or passed through
Adam, and eta_k follows a :class:`bandits.schedules.Schedule`. Directions:

- ``gradient="exact"``: the expected update E[w] = scalar(J, G) (g+ - g-) (gapdyn.expected_scalar: J(1-J),
  (1-1/G) J(1-J), c_G(J), ...), per context;
- ``gradient="sampled"``: one group of G arms per context drawn by inverse CDF from pre-drawn uniforms
  (``numpy.random.default_rng(seed).random((C, G))`` per step, in step order: the plain loop of
  :mod:`bandits.reference` reproduces the stream), w = (1/G) sum_i A_i s(o_i) with gapdyn's advantage
  rules (re-implemented in numba; tests check them equal to ``gapdyn.group_advantages``).

Contexts sharing a parameter block average their directions: w_p = mean_{x: p(x) = p} w_x.

Recorded per step k (every ``record_every`` steps) and context: J, Phi, entropy H at theta_k; the update's
Delta mu = <u_k, g+ - g->, ||u_k||, M(k) = sum_{j<k} eta_j [Delta mu_j]_+ (before step k, so that J(k) and
M(k) pair as in Theorem 1), and the realised change Phi(theta_{k+1}) - Phi(theta_k); eta_k per block.
Tracked at every state k = 0..T (final included, whatever record_every): J_min per context, and what decides a
run's outcome (collapse is J -> 0 at the end, Suk & Duan (arXiv 2510.08539), Thm 2): min and max of J over the
last quarter k >= T - T // 4 (gapdyn.evidence.collapse.tail_start) per context, and of Jbar = mean_x J(x) (contexts are
uniform) its min over all states and its min and max over the last quarter.
Speed: arms are sorted correct-first per context and padded with zero arms to a multiple of 8, so every pass
over arms is a branch-free loop that vectorises without a scalar tail (exp included: :func:`_exp_shifted`);
sums are re-associated (LLVM fast-math flags reassoc, contract, arcp); runs are done two at a time in lockstep
(the logits and the Gap of both in one pass over the features); sampled gradient needs no Gap: it carries the
logits from step to step as z + eta Phi u (Delta mu = <cw, Phi u>, one pass over the features per step) and
recomputes them from theta every 8 steps, so round-off does not accumulate; where a run's direction for a
context is exactly 0 (a group with equal rewards under GRPO) its logits do not move, and the work that would
repeat the same bits (the logit update, the next forward pass and cdf row) is skipped; the run kernel is
compiled without reference counting; pairs of runs are dealt round-robin to numba threads (``prange``;
``threads=`` per call). Each pair is done by one thread with fixed code that does the same operations for both
runs, so the same inputs give bitwise-identical outputs for any thread count and any partner run on a given
binary; results agree with the plain loop of :mod:`bandits.reference` to round-off (~1e-12 relative on J;
tests/test_engine_fast.py) over horizons where the dynamics do not amplify it (large sampled steps are
chaotic: ulp-level differences can grow until a draw flips).
The first call after an install compiles the kernels (numba's on-disk cache keeps them) and says so on stderr;
:func:`ensure_compiled` does it up front.
"""

from __future__ import annotations

import math
import numbers
import sys
from dataclasses import dataclass, field

import numba
import numpy as np
from numba import njit, prange, types
from numba.extending import intrinsic

import gapdyn
from gapdyn._validate import check_group_size, check_int, check_positive, check_seed
from gapdyn.evidence.collapse import tail_start
from gapdyn.theory.safe_step import NO_ASCENT_TOL

from .envs import ContextualBandit
from .schedules import SCHEDULES, Schedule

__all__ = ["DIRECTIONS", "GRADIENTS", "Dynamics", "Trajectory", "simulate", "run_grid", "advantages_nb", "exact_scalar_nb",
           "draws_nb", "cdf_rows_nb", "ensure_compiled", "kernels_cached"]

DIRECTIONS: tuple[str, ...] = tuple(gapdyn.METHOD_NAMES) + ("gap",)
GRADIENTS = ("exact", "sampled")
_CODE = {"reinforce": 0, "rloo": 1, "grpo": 2, "dr_grpo": 3, "wapo": 4, "psr": 5, "nsr": 6, "w_reinforce": 7, "gap": 8}
_SCHED = {name: i for i, name in enumerate(SCHEDULES)}  # constant 0, decay 1, linesearch 2, adaptive 3
# LLVM fast-math flags of the kernels: re-associated sums (reductions over arms vectorise), contractions
# (fused multiply-add) and reciprocals; no nnan / ninf, so -inf class maxima and NaN results stay valid.
# The code is fixed per binary, and every run is done by one thread, so results are deterministic.
_FASTMATH = {"reassoc", "contract", "arcp"}


def method_opts(method: str, *, std: str, adv_eps: float, lam: float) -> dict:
    """The options gapdyn.group_advantages / expected_scalar take for ``method`` (GRPO: std and eps;
    W-REINFORCE: lam; none otherwise). Shared by :class:`Dynamics` and the sequence bandit's dynamics."""
    if method == "grpo":
        return {"std": std, "eps": adv_eps}
    if method == "w_reinforce":
        return {"lam": lam}
    return {}


@dataclass(frozen=True)
class Dynamics:
    """What one simulation does (everything but eta, seed and theta0).

    Attributes:
        method: a gapdyn method name, or "gap" (w = g+ - g-, log-odds ascent; exact gradient only).
        gradient: "exact" (expected update) or "sampled" (one group of G per context per step).
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
    gradient: str = "exact"
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
        if self.gradient not in GRADIENTS:
            raise ValueError(f"gradient must be one of {GRADIENTS}, got {self.gradient!r}")
        if self.method == "gap" and self.gradient != "exact":
            raise ValueError("method 'gap' (log-odds ascent) needs gradient='exact'")
        check_group_size(self.group_size)
        for name in ("steps", "record_every"):
            check_int(getattr(self, name), name, minimum=1)
        if not isinstance(self.schedule, (Schedule, str)):
            raise ValueError(f"schedule must be a Schedule or one of {SCHEDULES}, got {self.schedule!r}")
        sched = self.schedule if isinstance(self.schedule, Schedule) else Schedule(self.schedule)
        object.__setattr__(self, "schedule", sched)
        if not isinstance(self.normalize, (bool, np.bool_)):
            raise ValueError(f"normalize must be a bool, got {self.normalize!r}")
        if self.optimizer not in ("sgd", "adam"):
            raise ValueError(f"optimizer must be 'sgd' or 'adam', got {self.optimizer!r}")
        if self.std not in ("population", "bessel"):
            raise ValueError(f"std must be 'population' or 'bessel', got {self.std!r}")
        for name in ("adv_eps", "lam"):
            v = getattr(self, name)
            if isinstance(v, bool) or not (isinstance(v, numbers.Real) and np.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be a finite real >= 0, got {v!r}")
        betas = self.adam_betas
        ok = isinstance(betas, (tuple, list)) and len(betas) == 2
        ok = ok and all(isinstance(b, numbers.Real) and not isinstance(b, bool) and 0 <= b < 1 for b in betas)
        if not ok:
            raise ValueError(f"adam_betas must be a pair of reals in [0, 1), got {betas!r}")
        object.__setattr__(self, "adam_betas", (float(betas[0]), float(betas[1])))
        if isinstance(self.adam_eps, bool):
            raise ValueError(f"adam_eps must be a real scalar, got {self.adam_eps!r}")
        check_positive(self.adam_eps, "adam_eps")

    @property
    def method_opts(self) -> dict:
        """Options for gapdyn.group_advantages / expected_scalar."""
        return method_opts(self.method, std=self.std, adv_eps=self.adv_eps, lam=self.lam)


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
    J_tail_min: np.ndarray  # [R, C] min of J over the last quarter of the states (gapdyn.evidence.collapse.tail_start)
    J_tail_max: np.ndarray  # [R, C] max of J over the last quarter of the states
    Jbar_min: np.ndarray  # [R] min over all states of Jbar = mean_x J(x) (contexts are uniform)
    Jbar_tail_min: np.ndarray  # [R] min of Jbar over the last quarter of the states
    Jbar_tail_max: np.ndarray  # [R] max of Jbar over the last quarter of the states
    n_decrease: np.ndarray  # [R, C] number of steps with a realised decrease of Phi
    theta_final: np.ndarray  # [R, P, d]
    eta0: np.ndarray  # [R, P]
    seed: np.ndarray  # [R] uint64 (numpy.random.default_rng(seed[r]) drew run r's groups)
    dynamics: Dynamics = field(repr=False, default=None)

    @property
    def failure_final(self) -> np.ndarray:
        """1 - J after the last step, accurate near J = 1 (= sigmoid(-Phi))."""
        from scipy.special import expit

        return expit(-self.Phi_final)


# ---------------------------------------------------------------------------------------------
# numba kernels
# ---------------------------------------------------------------------------------------------


# The rule functions below state fastmath=_FASTMATH although they gain nothing from it: numba compiles a function
# without its own fastmath setting with its first caller's, so the flags (and bits) of the kernels would depend on
# whether a test wrapper (exact_scalar_nb, advantages_nb) or the kernel compiled them first.
@njit(cache=True, fastmath=_FASTMATH)
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


@njit(cache=True, fastmath=_FASTMATH, _nrt=False)
def _exact_scalar(method, J, Jb, G, tab, lam):
    """E[w] / Gap for each method code (_CODE; gapdyn.theory.methods table); J and Jb = 1 - J computed separately;
    tab = _grpo_table(G, bessel, eps) (read by GRPO only). NaN for a code without a rule."""
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
    if method != 2:
        return math.nan  # no rule for this code: simulate() refuses it before a run (_method_code)
    # grpo: c_G(J) = sum_m Binom(m; G, J) x / (sqrt(k x) + eps), x = p_hat (1 - p_hat)
    if J <= 0.0 or Jb <= 0.0:
        return 0.0
    lJ, lJb = math.log(J), math.log(Jb)
    tot = 0.0
    for m in range(1, G):
        lp = tab[0, m] + m * lJ + (G - m) * lJb
        tot += math.exp(lp) * tab[1, m] / tab[2, m]
    return tot


@njit(cache=True, fastmath=_FASTMATH, _nrt=False)
def _advantages(method, r, A, bessel, eps, lam):
    """Group advantages A_i (gapdyn.theory.methods rules, method code as in _CODE) for binary rewards r [G], written
    into A; NaN for a code without a rule."""
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
    elif method == 7:
        for i in range(G):
            A[i] = lam if r[i] > 0 else -1.0
    else:  # no rule for this code (gap has none in sampled gradient): simulate() refuses it before a run
        for i in range(G):
            A[i] = math.nan


@njit(cache=True, _nrt=False)
def _logits(featST, c, th, z):
    """z_a = sum_j phi_j(c, a) th_j for one parameter vector th (the line search's trial point), summed in j
    order per arm as _logits_pair does; featST [C, d, Kp] makes the loop over arms elementwise, so it
    vectorises without fast-math. Four features per pass over the arms."""
    d, K = featST.shape[1], featST.shape[2]
    for a in range(K):
        z[a] = 0.0
    j = 0
    while j + 4 <= d:
        t0, t1, t2, t3 = th[j], th[j + 1], th[j + 2], th[j + 3]
        for a in range(K):
            x = (z[a] + featST[c, j, a] * t0) + featST[c, j + 1, a] * t1
            z[a] = (x + featST[c, j + 2, a] * t2) + featST[c, j + 3, a] * t3
        j += 4
    while j < d:
        tj = th[j]
        for a in range(K):
            z[a] += featST[c, j, a] * tj
        j += 1


# |sum_i A_i| <= this x G x sum_i |A_i| (two ulp of 1 per term: each advantage's rounding and the running
# sum's) is round-off of a sum that is 0 (grpo, rloo, dr_grpo: at most 0.22 ulp x G sum |A| for G <= 12); the
# E_pi[phi] term it multiplies is then below the direction's own round-off and is skipped
_ADV_SUM_TOL = 2.0 * 2.220446049250313e-16
_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01  # ln 2 split in two (Cody & Waite): n * _LN2_HI is exact for |n| < 2^11
_LN2_LO = 1.90821492927058770002e-10
_ROUND_MAGIC = 6755399441055744.0  # 1.5 * 2^52: (y + M) - M is y rounded to the nearest integer for |y| < 2^51
_EXP_FLOOR = -708.0  # exp(-708) is still a normal double; lower shifted logits add < 1e-307 to a class sum >= 1


@intrinsic
def _as_float(typingctx, k):
    """The float64 whose bits are the int64 k (an LLVM bitcast: no memory round trip, vectorises)."""
    if k != types.int64:
        return None
    return types.float64(types.int64), lambda ctx, builder, sig, args: builder.bitcast(args[0], ctx.get_value_type(sig.return_type))


@intrinsic
def _as_int(typingctx, x):
    """The int64 whose bits are the float64 x (an LLVM bitcast)."""
    if x != types.float64:
        return None
    return types.int64(types.float64), lambda ctx, builder, sig, args: builder.bitcast(args[0], ctx.get_value_type(sig.return_type))


@njit(cache=True, _nrt=False, inline="always")  # strict: inline only into strict functions (_exp_pair)
def _exp_shifted(z_all, c, zmp, zmn, npos, K, out):
    """out[a] = exp(z[a] - shift_a) for z = z_all[c], shift_a = zmp for a < npos else zmn (z[a] <= shift_a), as
    loops over all arms that vectorise (a loop over a sub-range of the arms does not); the padding arms
    a >= K (out has a multiple of _ARM_PAD entries, so the loops have no scalar tail) get out[a] = 0.

    exp(x) = 2^n exp(r), n = round(x / ln 2) (as (y + 1.5 2^52) - 1.5 2^52), r = x - n ln 2 in [-ln2/2, ln2/2]
    (two-part ln 2, Cody & Waite); exp(r) by its Taylor
    polynomial of degree 13 (truncation < 4e-18), times 2^n assembled from its exponent bits (an exact scaling:
    2^n is normal for x >= -708). Within a few ulp of math.exp; x < -708 gives exp(-708).
    """
    Kp = out.shape[0]
    for a in range(Kp):
        x = z_all[c, a] - (zmp if a < npos else zmn) if a < K else 0.0
        x = max(x, _EXP_FLOOR)
        n = (x * _LOG2E + _ROUND_MAGIC) - _ROUND_MAGIC  # round to nearest (ties to even) in two operations
        r = (x - n * _LN2_HI) - n * _LN2_LO
        q = 1.0 / 6227020800.0
        q = q * r + 1.0 / 479001600.0
        q = q * r + 1.0 / 39916800.0
        q = q * r + 1.0 / 3628800.0
        q = q * r + 1.0 / 362880.0
        q = q * r + 1.0 / 40320.0
        q = q * r + 1.0 / 5040.0
        q = q * r + 1.0 / 720.0
        q = q * r + 1.0 / 120.0
        q = q * r + 1.0 / 24.0
        q = q * r + 1.0 / 6.0
        q = q * r + 0.5
        q = q * r + 1.0
        out[a] = (q * r + 1.0) * _as_float((np.int64(n) + 1023) << 52) if a < K else 0.0


@njit(cache=True, _nrt=False)  # strict on purpose: re-association would undo the rounding and the range reduction
def _exp_pair(z2, c, zm, npos, K, e2, keep):
    """e2[s] = _exp_shifted of z2[s, c] with the class maxima zm[s] = (max over O+, max over O-), for both run
    slots s of a pair in one call (not for a slot with keep[s, c])."""
    for s in range(2):
        if not keep[s, c]:
            _exp_shifted(z2[s], c, zm[s, 0], zm[s, 1], npos, K, e2[s])


@njit(cache=True, _nrt=False)
def _logits_pair(featST, c, theta, r0, r1, pb, z2):
    """z2[s, c] = logits of context c at theta[r_s, pb] for the two runs r0, r1 of a pair, in one pass over the
    features (each feature is loaded once for both runs). Each logit is summed in feature order, with the same
    operations for both runs, so a run's logits do not depend on its partner or slot. Four features per pass
    over the arms (a quarter of the loads and stores of z)."""
    d, K = featST.shape[1], featST.shape[2]
    for a in range(K):
        z2[0, c, a] = 0.0
        z2[1, c, a] = 0.0
    j = 0
    while j + 4 <= d:
        t0, t1, t2, t3 = theta[r0, pb, j], theta[r0, pb, j + 1], theta[r0, pb, j + 2], theta[r0, pb, j + 3]
        u0, u1, u2, u3 = theta[r1, pb, j], theta[r1, pb, j + 1], theta[r1, pb, j + 2], theta[r1, pb, j + 3]
        for a in range(K):
            f0, f1, f2, f3 = featST[c, j, a], featST[c, j + 1, a], featST[c, j + 2, a], featST[c, j + 3, a]
            x = (z2[0, c, a] + f0 * t0) + f1 * t1
            z2[0, c, a] = (x + f2 * t2) + f3 * t3
            y = (z2[1, c, a] + f0 * u0) + f1 * u1
            z2[1, c, a] = (y + f2 * u2) + f3 * u3
        j += 4
    while j < d:
        tj, uj = theta[r0, pb, j], theta[r1, pb, j]
        for a in range(K):
            f0 = featST[c, j, a]
            z2[0, c, a] += f0 * tj
            z2[1, c, a] += f0 * uj
        j += 1


_I64_MAX = np.int64(0x7FFFFFFFFFFFFFFF)


@njit(cache=True, inline="always")
def _nonzero(v):
    """Whether any entry of the vector v is not 0."""
    for j in range(v.shape[0]):
        if v[j] != 0.0:
            return True
    return False


@njit(cache=True, inline="always")
def _range_max(z_all, c, lo, hi):
    """max(z_all[c, lo:hi]) (-inf if empty) as an integer max: with bits the int64 bits of a double,
    k = bits ^ ((bits >> 63) & (2^63 - 1)) orders finite doubles (and +-inf) as int64 orders k, so the maximum
    vectorises (a floating-point max reduction does not without no-NaN flags); the key maps back by the same
    xor. Exact: the result is one of the entries."""
    if hi <= lo:
        return -np.inf
    row = z_all[c, lo:hi]
    m = -_I64_MAX - 1
    for a in range(row.shape[0]):
        k = _as_int(row[a])
        m = max(m, k ^ ((k >> 63) & _I64_MAX))
    return _as_float(m ^ ((m >> 63) & _I64_MAX))


@njit(cache=True, fastmath=_FASTMATH, inline="always")
def _class_split(fnormS, npos_c, c, z_all, zmp, zmn, e, p_all, cw_all, want_p, want_gs):
    """J, 1-J, Phi, entropy and the Gap weights of context c from its logits z_all[c], on class-sorted arms.

    The rows hold the K arms of each context with its npos_c[c] correct arms first (arm a is correct iff
    a < npos), padded with zero arms to Kp, a multiple of _ARM_PAD, so every pass is a branch-free loop over
    all Kp arms that vectorises without a scalar tail (the padding has e = cw = pi = 0). Given the class maxima
    zmp, zmn and e_a = exp(z_a - max of its class) (_exp_pair): S+/- = class sums,
    Phi = log(S+ / S-) + zmp - zmn (the log-odds), J = sigmoid(Phi), pi_a = e_a J / S+ on O+ and
    e_a (1 - J) / S- on O-, cw = e/S+ on O+ and -e/S- on O- (Gap = sum_a cw_a phi_a = g+ - g-),
    H = -sum_a pi_a (z_a - lse). Three scalar transcendentals per context (two logs, one exp).
    Returns (J, Jbar, Phi, H, gs) with gs = sum_a |cw_a| ||phi_a||, the scale of the terms that cancel in
    Gap (0 unless want_gs); cw_all[c] is filled, and with want_p also p_all[c] = pi (sorted arm order).
    """
    Kp = z_all.shape[1]
    npos = npos_c[c]
    Sp, Sn = 0.0, 0.0
    for a in range(Kp):  # the class of arm a is a < npos (sorted arms): a select, no mask to load
        ea = e[a]
        Sp += ea if a < npos else 0.0
        Sn += 0.0 if a < npos else ea
    Ph = (zmp - zmn) + math.log(Sp / Sn)
    # J = sigmoid(Phi), 1 - J = sigmoid(-Phi) from t = exp(-|Phi|) <= 1; lse = log(S+ e^zmp + S- e^zmn), from
    # the larger class: lse = zmax + log(Smax (1 + t)) (three scalar transcendentals: log, exp, log)
    t = math.exp(-abs(Ph))
    q = 1.0 / (1.0 + t)
    J, Jb = (q, t * q) if Ph >= 0.0 else (t * q, q)
    lse = zmp + math.log(Sp * (1.0 + t)) if Ph >= 0.0 else zmn + math.log(Sn * (1.0 + t))
    ip, im = 1.0 / Sp, -1.0 / Sn
    fp, fn = J * ip, -Jb * im  # pi_a = e_a exp(shift - lse) = e_a J / S+ on O+, e_a (1 - J) / S- on O-
    H, gs = 0.0, 0.0
    if want_p and not want_gs:  # sampled gradient: pi, no gs
        for a in range(Kp):
            pos = a < npos
            cw_all[c, a] = e[a] * (ip if pos else im)
            pa = e[a] * (fp if pos else fn)
            p_all[c, a] = pa
            H -= pa * (z_all[c, a] - lse)
    elif want_p:
        for a in range(Kp):
            pos = a < npos
            wa = e[a] * (ip if pos else im)
            cw_all[c, a] = wa
            gs += abs(wa) * fnormS[c, a]
            pa = e[a] * (fp if pos else fn)
            p_all[c, a] = pa
            H -= pa * (z_all[c, a] - lse)
    else:
        for a in range(Kp):
            pos = a < npos
            wa = e[a] * (ip if pos else im)
            cw_all[c, a] = wa
            gs += abs(wa) * fnormS[c, a]
            H -= e[a] * (fp if pos else fn) * (z_all[c, a] - lse)
    return J, Jb, Ph, H, gs


@njit(cache=True, fastmath=_FASTMATH, inline="always")
def _forward_pair(featST, fnormS, npos_c, K, c, theta, r0, r1, pb, z2, zm, e2, gap2, p2, cw2, fw, want_p, want_gs, fresh,
                  keep):
    """The forward pass of context c for the runs r0, r1 of a pair (featST [C, d, Kp], sorted and padded arms):
    with fresh, the logits of both in one pass over the features (else z2 already holds them), _class_split per
    run and, with want_gs (exact gradient), Gap = sum_a cw_a phi_a of both in one pass. fw[s, :, c] = (J, Jbar, Phi,
    H, gs) of run slot s; cw2 (and with want_p p2, with want_gs gap2) are filled, except for a slot with
    keep[s, c], whose logits have not moved since they were last filled (sampled gradient; not fresh). The two slots
    run the same operations, so a run's results do not depend on its partner or slot."""
    if fresh:
        _logits_pair(featST, c, theta, r0, r1, pb, z2)
    npos = npos_c[c]
    for s in range(2):
        if not keep[s, c]:
            zm[s, 0] = _range_max(z2[s], c, 0, npos)
            zm[s, 1] = _range_max(z2[s], c, npos, K)
    _exp_pair(z2, c, zm, npos, K, e2, keep)
    for s in range(2):
        if keep[s, c]:
            continue
        J, Jb, Ph, H, gs = _class_split(fnormS, npos_c, c, z2[s], zm[s, 0], zm[s, 1], e2[s], p2[s], cw2[s], want_p,
                                        want_gs)
        fw[s, 0, c], fw[s, 1, c], fw[s, 2, c], fw[s, 3, c], fw[s, 4, c] = J, Jb, Ph, H, gs
    if want_gs:
        _matvec_pair(featST, c, cw2, gap2)


@njit(cache=True, fastmath=_FASTMATH, inline="always")
def _matvec_pair(featST, c, x2, out2):
    """out2[s, c, j] = sum_a x2[s, c, a] featST[c, j, a] for both slots s and j < d, in one pass over the
    features (four features per pass; each feature loaded once for both slots, same operations per slot)."""
    d, K = featST.shape[1], featST.shape[2]
    j = 0
    while j + 4 <= d:
        s0, s1, s2, s3 = 0.0, 0.0, 0.0, 0.0
        v0, v1, v2, v3 = 0.0, 0.0, 0.0, 0.0
        for a in range(K):
            xa, ya = x2[0, c, a], x2[1, c, a]
            f0, f1, f2, f3 = featST[c, j, a], featST[c, j + 1, a], featST[c, j + 2, a], featST[c, j + 3, a]
            s0 += xa * f0
            s1 += xa * f1
            s2 += xa * f2
            s3 += xa * f3
            v0 += ya * f0
            v1 += ya * f1
            v2 += ya * f2
            v3 += ya * f3
        out2[0, c, j], out2[0, c, j + 1], out2[0, c, j + 2], out2[0, c, j + 3] = s0, s1, s2, s3
        out2[1, c, j], out2[1, c, j + 1], out2[1, c, j + 2], out2[1, c, j + 3] = v0, v1, v2, v3
        j += 4
    while j < d:
        s0, v0 = 0.0, 0.0
        for a in range(K):
            f0 = featST[c, j, a]
            s0 += x2[0, c, a] * f0
            v0 += x2[1, c, a] * f0
        out2[0, c, j], out2[1, c, j] = s0, v0
        j += 1


@njit(cache=True, fastmath=_FASTMATH, inline="always")
def _mean_features_pair(featST, fnormS, c, p2, m2):
    """m2[s, c, :d] = E_pi[phi] = sum_a p_a phi_a and m2[s, c, d] = E_pi ||phi|| of context c for both run slots
    s (pi = p2[s, c], sorted arms), in one pass over the features. Always both slots, by the same code, so a
    run's bits do not depend on whether its partner needed them."""
    d, K = featST.shape[1], featST.shape[2]
    _matvec_pair(featST, c, p2, m2)
    s0, s1 = 0.0, 0.0
    for a in range(K):
        s0 += p2[0, c, a] * fnormS[c, a]
        s1 += p2[1, c, a] * fnormS[c, a]
    m2[0, c, d], m2[1, c, d] = s0, s1


@njit(cache=True, _nrt=False)
def _logodds(featST, npos_c, K, c, th, zl):
    """Phi of context c at th on the class-sorted arms, as _class_split forms it: log(S+ / S-) + zmp - zmn with
    S+/- = sum of exp(z_a - class max) over a < npos / npos <= a < K. Scratch: zl [1, Kp] (the logits)."""
    z = zl[0]
    _logits(featST, c, th, z)
    npos = npos_c[c]
    zmp = _range_max(zl, 0, 0, npos)
    zmn = _range_max(zl, 0, npos, K)
    Sp, Sn = 0.0, 0.0
    for a in range(K):
        if a < npos:
            Sp += math.exp(z[a] - zmp)
        else:
            Sn += math.exp(z[a] - zmn)
    return (zmp - zmn) + math.log(Sp / Sn)


_ARM_PAD = 8  # the class-sorted per-arm rows are padded with zero arms to a multiple of this (one AVX-512 vector)
_REFRESH = 8  # sampled gradient: the logits carried as z + eta Phi u are recomputed from theta every this many steps
_CDF_PAD = 32  # the cdf rows are padded with +inf to a multiple of this (the count loop has no scalar tail)


@njit(cache=True, _nrt=False)  # strict on purpose: the running sums and the shifts are added in the stated order
def _cdf_rows(p_all, rank, K, cdf_all, keep):
    """cdf_all[c, a] = pi(a_0) + ... + pi(a_a) for every context c, arms in the original order
    (pi(a_b) = p_all[c, rank[c, b]]): the arms are cut into four contiguous quarters summed as four
    independent running sums (a single running sum waits on each previous add), then every quarter is shifted
    by the total of those before it, off_{q+1} = off_q + S_q, the same addition that gives the quarter's last
    entry. Each row is therefore non-decreasing and a zero-probability arm repeats the entry before it, as in
    a serial cumulative sum; the entries differ from numpy.cumsum's by a few ulp. (Row and quarter views keep
    every index a loop counter from 0, so no negative-index fix-up is compiled into the loops.) Rows c with
    keep[c] are left as they are."""
    C = p_all.shape[0]
    L = (K + 3) // 4
    n1, n2, n3 = min(max(K - L, 0), L), min(max(K - 2 * L, 0), L), min(max(K - 3 * L, 0), L)
    for c in range(C):
        if keep[c]:  # pi of context c has not changed since its row was computed
            continue
        p, rk, out = p_all[c], rank[c, :K], cdf_all[c, :K]
        rk1, rk2, rk3 = rk[min(L, K):], rk[min(2 * L, K):], rk[min(3 * L, K):]
        o1, o2, o3 = out[min(L, K):], out[min(2 * L, K):], out[min(3 * L, K):]
        s0, s1, s2, s3 = 0.0, 0.0, 0.0, 0.0
        for j in range(n3):  # all four quarters
            s0 += p[rk[j]]
            out[j] = s0
            s1 += p[rk1[j]]
            o1[j] = s1
            s2 += p[rk2[j]]
            o2[j] = s2
            s3 += p[rk3[j]]
            o3[j] = s3
        for j in range(n3, min(L, K)):  # the first three quarters (the last is shorter or empty)
            s0 += p[rk[j]]
            out[j] = s0
            if j < n1:
                s1 += p[rk1[j]]
                o1[j] = s1
            if j < n2:
                s2 += p[rk2[j]]
                o2[j] = s2
        for q, seg, n in ((1, o1, n1), (2, o2, n2), (3, o3, n3)):  # shift quarter q by the cdf at the end of q - 1
            if n == 0:
                break
            off = out[q * L - 1]
            for a in range(n):
                seg[a] = off + seg[a]


@njit(cache=True)
def _padded(K):
    """K rounded up to a multiple of _CDF_PAD: the length of a cdf row."""
    return -(-K // _CDF_PAD) * _CDF_PAD


@njit(cache=True, inline="always")
def _search_right(cdf_all, c, x):
    """numpy.searchsorted(cdf, x, side='right') for the non-decreasing row cdf = cdf_all[c] (length a multiple of
    _CDF_PAD, +inf padding never counted as x is finite): the number of entries <= x, in two branch-free
    counts that vectorise: the blocks of _CDF_PAD entries whose last entry is <= x (all their entries are),
    then the entries <= x in the next block (every later entry is > x). A count costs less than a binary
    search, whose branches mispredict."""
    nblk = cdf_all.shape[1] // _CDF_PAD
    w = cdf_all.shape[1] // nblk  # = _CDF_PAD, as a run-time trip count: a constant one is unrolled to scalar code
    b = 0
    for i in range(nblk - 1):
        b += cdf_all[c, i * w + w - 1] <= x
    row = cdf_all[c, b * w:]
    n = 0
    for a in range(w):
        n += row[a] <= x
    return b * w + n


@njit(cache=True, inline="always")
def _draw(cdf_all, c, K, u, p_all, rank):
    """The arm drawn by uniform u from the cdf of pi in the original arm order (cdf_all[c, :K], padded with
    +inf; arm a has mass p_all[c, rank[c, a]]): min(searchsorted(cdf, u * total, 'right'), the last arm with positive mass),
    the numba twin of gapdyn.theory.sampling.inverse_cdf_draw (tests/test_engine_fast.py checks them equal). The cap
    (u = 1, or u * total rounding up to the total) walks back over zero-mass arms only, so a zero-probability
    arm is never drawn."""
    a = _search_right(cdf_all, c, u * cdf_all[c, K - 1])
    if a > K - 1:
        a = K - 1
        while a > 0 and p_all[c, rank[c, a]] == 0.0:
            a -= 1
    return a


@njit(cache=True, fastmath=_FASTMATH, _nrt=False)
def _group_safe_moments(x, r, G):
    """(dmu_hat, kappa_hat, sd_hat, mixed) of one sampled group x[:G], rewards r[:G] (> 0.5: success): the numba
    copy of gapdyn.safe_step_estimates for one group (docs/theory.md, section 11; tests/test_gapdyn_safe_step.py
    checks them equal). dmu_hat = kappa_hat = 0 and mixed = False without both rewards."""
    n1, n0, s1, s0 = 0, 0, 0.0, 0.0
    for i in range(G):
        if r[i] > 0.5:
            n1 += 1
            s1 += x[i]
        else:
            n0 += 1
            s0 += x[i]
    sd = 0.0
    if G >= 2:
        mall = (s1 + s0) / G
        vall = 0.0
        for i in range(G):
            vall += (x[i] - mall) ** 2
        sd = math.sqrt(vall / (G - 1))
    if n1 == 0 or n0 == 0:
        return 0.0, 0.0, sd, False
    m1, m0 = s1 / n1, s0 / n0
    v1, v0 = 0.0, 0.0
    for i in range(G):
        if r[i] > 0.5:
            v1 += (x[i] - m1) ** 2
        else:
            v0 += (x[i] - m0) ** 2
    v1 = v1 / (n1 - 1) if n1 >= 2 else 0.0
    v0 = v0 / (n0 - 1) if n0 >= 2 else 0.0
    return m1 - m0, v0 - v1, sd, True


@njit(cache=True, fastmath=_FASTMATH, _nrt=False)
def _safe_step_size(e0, dsum, ksum, cnt, sdmax, ac, tr_delta):
    """eta = min(e0, tr_delta / sdmax, ac dmu_hat / kappa_hat) with dmu_hat = dsum / cnt, kappa_hat = ksum / cnt over
    the cnt mixed groups: the numba copy of gapdyn.safe_step_size (mixed iff cnt > 0; edge cases as there; no
    ascent: dmu_hat <= NO_ASCENT_TOL sd_hat, gapdyn.theory.safe_step's constant, which numba freezes at compile time)."""
    e = e0
    if sdmax > 0.0:
        e = min(e, tr_delta / sdmax)
    if cnt > 0:
        dh, kh = dsum / cnt, ksum / cnt
        if dh <= NO_ASCENT_TOL * sdmax:  # no ascent (up to round-off: ties at 0 give 0 in any route)
            return 0.0
        if kh > 0.0:
            e = min(e, ac * dh / kh)
    return e


@njit(cache=True, fastmath=_FASTMATH, parallel=True)
def _kernel(
    feat, rew, fnorm, pmap, blk_ptr, blk_ctx,  # bandit
    featS, featST, fnormS, npos_c, rank,  # bandit, arms sorted correct-first per context
    theta, am, av, M, phi_prev, J_min, ndec, J_tail, Jbar,  # state (in/out)
    eta0, unif, k0, n_steps, do_final, pairs, tail0,  # run inputs
    method, sampled, G, bessel, aeps, lam, normalize, sched_kind, ac, tr_delta, max_halv, adam, b1, b2, adam_eps, rec_every,
    o_J, o_Phi, o_dmu, o_M, o_wn, o_dPhi, o_H, o_eta,  # records
    f_J, f_Phi,  # final values
):
    R, P, d = theta.shape
    C, K, Kp = feat.shape[0], feat.shape[1], featST.shape[2]
    tab = _grpo_table(G, bessel, aeps)
    for i in prange(pairs.shape[0]):  # runs 2q and 2q + 1 are done by one thread, in the same order for any count
        q = pairs[i]
        ws = _workspace(C, K, Kp, d, P, G)
        _one_pair(
            feat, rew, fnorm, pmap, blk_ptr, blk_ctx, featS, featST, fnormS, npos_c, rank,
            theta, am, av, M, phi_prev, J_min, ndec, J_tail, Jbar, eta0, unif, k0, n_steps, do_final, tail0, tab,
            2 * q, min(2 * q + 1, R - 1),
            method, sampled, G, bessel, aeps, lam, normalize, sched_kind, ac, tr_delta, max_halv, adam, b1, b2, adam_eps,
            rec_every, o_J, o_Phi, o_dmu, o_M, o_wn, o_dPhi, o_H, o_eta, f_J, f_Phi, ws,
        )


@njit(cache=True)
def _workspace(C, K, Kp, d, P, G):
    """The scratch arrays of one pair of runs (_one_pair's ws), allocated where reference counting is on; a
    leading axis of 2 holds what is kept per run slot between the phases of a step; the per-arm rows have
    Kp >= K columns (zero padding)."""
    z2 = np.zeros((2, C, Kp))
    return (
        z2, np.zeros((2, C, Kp)), np.zeros((2, C, Kp)),  # z2, p2, cw2: logits, pi, cw per context
        np.full((2, C, _padded(K)), np.inf),  # cdf2: sampled gradient, cumsum of pi per context (+inf padding)
        np.empty((2, C, d)), np.empty((2, 5, C)),  # gap2; fw: (J, Jbar, Phi, H, gs) per slot and context
        np.empty((2, C, d + 1)),  # mphi2: E_pi[phi] and E_pi ||phi|| per slot (sampled gradient)
        np.empty((P, d)), np.zeros((2, P, d)), np.empty((2, C, G)),  # w; u2: direction per slot; rg2: group rewards
        np.zeros((2, Kp)), np.empty(P), np.empty(P), np.empty(K), np.empty(G), np.empty(G), np.empty(d),
        # ex2: exp(z - class max) per slot; wabs, eta, cdf, rv, A, trial
        np.zeros((2, C, G), np.int64), np.empty((2, 2)),  # idx2: drawn arms; zm: class maxima per slot
        np.zeros((1, Kp)),  # zl: the line search's logits at the trial point
        np.zeros((2, C, Kp)), np.empty((2, C)),  # y2 = Phi u per slot (sampled gradient); dm2: Delta mu per context
        np.zeros((2, C), np.bool_),  # mv2: whether y2[s, c] holds Phi u (else u = 0: the logits do not move)
        np.zeros((2, C), np.bool_),  # kp2: the forward pass (and cdf row) of slot s, context c kept from the last step
        np.zeros((2, C, G)), np.zeros((2, C), np.bool_),  # A2: the groups' advantages; nd2: E_pi[phi] needed
    )


# _one_pair and the functions it calls are compiled without reference counting (_nrt=False): the arrays they
# index are owned by _kernel, and every array passed to a counted function costs two atomic operations per call
@njit(cache=True, fastmath=_FASTMATH, _nrt=False)
def _one_pair(
    feat, rew, fnorm, pmap, blk_ptr, blk_ctx, featS, featST, fnormS, npos_c, rank,
    theta, am, av, M, phi_prev, J_min, ndec, J_tail, Jbar, eta0, unif, k0, n_steps, do_final, tail0, tab, r0, r1,
    method, sampled, G, bessel, aeps, lam, normalize, sched, ac, tr_delta, max_halv, adam, b1, b2, adam_eps,
    rec_every, o_J, o_Phi, o_dmu, o_M, o_wn, o_dPhi, o_H, o_eta, f_J, f_Phi, ws,
):
    """Steps k0 .. k0 + n_steps (and the final state if do_final) of the runs r0 and r1 (the body of _kernel):
    the forward pass of both in lockstep (features loaded once for two runs), each run's direction, then
    Delta mu per context, then each run's step size and update. With r1 == r0 (the last run of an odd count) the
    second slot repeats the first's forward pass and is not used. ws is the pair's scratch (_workspace).

    Exact gradient: Delta mu = <u, Gap> with Gap from the forward pass. Sampled gradient needs no Gap: y = Phi u (one
    pass over the features, both runs), Delta mu = sum_a cw_a y_a and the next logits z + eta y, recomputed
    from theta at every step kk with kk % _REFRESH == 0 (and at a call's first step, which simulate() keeps
    on such a step), so round-off does not accumulate over more than _REFRESH steps."""
    C, K = feat.shape[0], feat.shape[1]
    (z2, p2, cw2, cdf2, gap2, fw, mphi2, w, u2, rg2, ex2, wabs, eta, cdf, rv, A, trial, idx2, zm, zl, y2, dm2, mv2,
     kp2, A2, nd2) = ws
    want_p = sampled or sched == 3
    ns = 1 if r1 == r0 else 2
    for k in range(n_steps + do_final):
        kk = k0 + k
        update = k < n_steps
        fresh = not sampled or k == 0 or kk % _REFRESH == 0
        # 1) forward pass at theta_kk, both runs; not for a run and context whose logits did not move (u = 0 at
        # step kk - 1 in this call): its forward pass would give the same bits
        for c in range(C):
            kp2[0, c], kp2[1, c] = not fresh and not mv2[0, c], not fresh and not mv2[1, c]
            _forward_pair(featST, fnormS, npos_c, K, c, theta, r0, r1, pmap[c], z2, zm, ex2, gap2, p2, cw2, fw,
                          want_p and update, not sampled, fresh, kp2)
        for s in range(ns):
            r = r0 if s == 0 else r1
            _track(r, kk, update, phi_prev, J_min, ndec, J_tail, Jbar, tail0, rec_every, o_J, o_Phi, o_M, o_dPhi,
                   o_H, f_J, f_Phi, M, fw[s, 0], fw[s, 2], fw[s, 3])
        if not update:
            continue
        # 2) direction of each run; sampled: the groups of both runs first, then E_pi[phi] for both in one pass
        # over the features where either run's advantages do not sum to 0
        if sampled:
            for s in range(ns):
                _groups(rew, pmap, blk_ptr, rank, unif, k, r0 if s == 0 else r1, method, G, bessel, aeps, lam,
                        p2[s], cdf2[s], kp2[s], idx2[s], rg2[s], A2[s], nd2[s], rv)
            for c in range(C):
                if nd2[0, c] or (ns == 2 and nd2[1, c]):
                    _mean_features_pair(featST, fnormS, c, p2, mphi2)
        for s in range(ns):
            r = r0 if s == 0 else r1
            _direction(
                feat, fnorm, pmap, blk_ptr, am, av, kk, tab, r, method, sampled, G, lam, normalize, adam, b1, b2,
                adam_eps, gap2[s], fw[s, 0], fw[s, 1], fw[s, 4], mphi2[s], w, u2[s], wabs, idx2[s], A2[s], nd2[s],
            )  # fmt: skip
        # 3) Delta mu = <u, Gap> per context
        if sampled:  # y = Phi u of both runs in one pass; none where u = 0 (e.g. a group with equal rewards)
            for c in range(C):
                pb = pmap[c]
                mv0, mv1 = _nonzero(u2[0, pb]), ns == 2 and _nonzero(u2[1, pb])
                if mv0 and mv1:
                    _logits_pair(featST, c, u2, 0, 1, pb, y2)
                elif mv0:
                    _logits(featST, c, u2[0, pb], y2[0, c])  # the same operations per run as _logits_pair
                elif mv1:
                    _logits(featST, c, u2[1, pb], y2[1, c])
                mv2[0, c], mv2[1, c] = mv0, mv1
            for s in range(ns):
                for c in range(C):
                    dm = 0.0
                    if mv2[s, c]:
                        for a in range(z2.shape[2]):
                            dm += cw2[s, c, a] * y2[s, c, a]
                    dm2[s, c] = dm
        else:
            for s in range(ns):
                for c in range(C):
                    dm = 0.0
                    for j in range(u2.shape[2]):
                        dm += u2[s, pmap[c], j] * gap2[s, c, j]
                    dm2[s, c] = dm
        # 4) step size and update of each run
        for s in range(ns):
            r = r0 if s == 0 else r1
            _step(
                feat, pmap, blk_ptr, blk_ctx, featS, featST, npos_c, theta, M, eta0, kk, r,
                sampled, G, sched, ac, tr_delta, max_halv, rec_every, o_dmu, o_wn, o_eta,
                p2[s], cw2[s], fw[s, 2], u2[s], dm2[s], rg2[s], idx2[s], z2[s], y2[s], mv2[s], eta, cdf, A, trial, zl,
            )  # fmt: skip


@njit(cache=True, fastmath=_FASTMATH, _nrt=False)
def _track(r, kk, update, phi_prev, J_min, ndec, J_tail, Jbar, tail0, rec_every, o_J, o_Phi, o_M, o_dPhi, o_H,
           f_J, f_Phi, M, Jc, Phic, Hc):
    """State kk of run r after its forward pass (J, Phi, H per context in Jc, Phic, Hc): the realised change of
    Phi since step kk - 1, decreases, J_min, the outcome statistics (J_tail: min, max per context over the
    states kk >= tail0; Jbar: min over all states, then min, max over kk >= tail0, of the mean over contexts),
    the records of step kk (the final values when not update)."""
    C = Jc.shape[0]
    tail = kk >= tail0
    Jsum = 0.0
    for c in range(C):
        J, Ph = Jc[c], Phic[c]
        Jsum += J
        if tail:
            if J < J_tail[r, 0, c]:
                J_tail[r, 0, c] = J
            if J > J_tail[r, 1, c]:
                J_tail[r, 1, c] = J
        if kk > 0:
            dph = Ph - phi_prev[r, c]
            if dph < -1e-12 * (1.0 + abs(Ph)):
                ndec[r, c] += 1
            if (kk - 1) % rec_every == 0:
                o_dPhi[r, (kk - 1) // rec_every, c] = dph
        phi_prev[r, c] = Ph
        if J < J_min[r, c]:
            J_min[r, c] = J
    Jm = Jsum / C
    if Jm < Jbar[r, 0]:
        Jbar[r, 0] = Jm
    if tail:
        if Jm < Jbar[r, 1]:
            Jbar[r, 1] = Jm
        if Jm > Jbar[r, 2]:
            Jbar[r, 2] = Jm
    if not update:
        for c in range(C):
            f_J[r, c] = Jc[c]
            f_Phi[r, c] = Phic[c]
    elif kk % rec_every == 0:
        ri = kk // rec_every
        for c in range(C):
            o_J[r, ri, c] = Jc[c]
            o_Phi[r, ri, c] = Phic[c]
            o_H[r, ri, c] = Hc[c]
            o_M[r, ri, c] = M[r, c]


@njit(cache=True, fastmath=_FASTMATH, _nrt=False)
def _groups(rew, pmap, blk_ptr, rank, unif, k, r, method, G, bessel, aeps, lam, p_all, cdf_all, keep, idx, rg, A_all,
            need, rv):
    """Sampled gradient, run r, step k of the call: the cdf rows of pi (rows with keep: pi unchanged, kept), the
    G draws per context (idx), their rewards (rg) and advantages (A_all), and whether E_pi[phi] is needed:
    need[c] unless the scaled advantages f_i = A_i / (G nb) sum to 0 up to their round-off,
    |sum_i f_i| <= _ADV_SUM_TOL G sum_i |f_i| (grpo, rloo, dr_grpo: E_pi[phi] would multiply 0)."""
    C, K = rew.shape[0], rew.shape[1]
    _cdf_rows(p_all, rank, K, cdf_all, keep)  # cumsum of pi in the original arm order (the order of the draws)
    for c in range(C):  # all draws first: the searches are independent (no load waits on a previous draw)
        for i in range(G):
            idx[c, i] = _draw(cdf_all, c, K, unif[r, k, c, i], p_all, rank)
    for c in range(C):
        pb = pmap[c]
        nb = blk_ptr[pb + 1] - blk_ptr[pb]
        for i in range(G):
            rv[i] = rew[c, idx[c, i]]
            rg[c, i] = rv[i]
        _advantages(method, rv, A_all[c], bessel, aeps, lam)
        sA, sabs = 0.0, 0.0
        for i in range(G):
            f = A_all[c, i] / G / nb
            sA += f
            sabs += abs(f)
        need[c] = abs(sA) > _ADV_SUM_TOL * G * sabs


@njit(cache=True, fastmath=_FASTMATH, _nrt=False)
def _direction(
    feat, fnorm, pmap, blk_ptr, am, av, kk, tab, r, method, sampled, G, lam, normalize, adam, b1, b2, adam_eps,
    gap, Jc, Jbc, gs_all, mphi, w, u, wabs, idx, A_all, need,
):
    """The direction u [P, d] of run r at step kk from its forward pass: per context the method's update (exact:
    its expected scalar times Gap; sampled: the drawn group's (idx) advantages (A_all) times its features'
    deviations from E_pi[phi] (mphi, where need)), averaged over each block's contexts, round-off cleaned,
    optionally normalised and passed through Adam."""
    P = u.shape[0]
    C, d = feat.shape[0], feat.shape[2]
    for pb in range(P):
        wabs[pb] = 0.0
        for j in range(d):
            w[pb, j] = 0.0
    for c in range(C):
        pb = pmap[c]
        nb = blk_ptr[pb + 1] - blk_ptr[pb]
        if not sampled:
            sc = _exact_scalar(method, Jc[c], Jbc[c], G, tab, lam) / nb
            for j in range(d):
                w[pb, j] += sc * gap[c, j]
            # gs_all[c]: scale of the terms that cancel in gap = sum_a cw_a phi_a (from _class_split)
            wabs[pb] += abs(sc) * gs_all[c]
        else:
            # w_x = (1/G) sum_i A_i phi(a_i) - (1/G) (sum_i A_i) E_pi[phi]
            sA = 0.0
            for i in range(G):
                f = A_all[c, i] / G / nb
                sA += f
                if f != 0.0:
                    a = idx[c, i]
                    wabs[pb] += abs(f) * fnorm[c, a]
                    for j in range(d):
                        w[pb, j] += f * feat[c, a, j]
            if need[c]:  # E_pi[phi] and E_pi ||phi|| (_groups: the advantages do not sum to 0 up to round-off)
                wabs[pb] += abs(sA) * mphi[c, d]
                for j in range(d):
                    w[pb, j] -= sA * mphi[c, j]
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


@njit(cache=True, fastmath=_FASTMATH, _nrt=False)
def _step(
    feat, pmap, blk_ptr, blk_ctx, featS, featST, npos_c, theta, M, eta0, kk, r,
    sampled, G, sched, ac, tr_delta, max_halv, rec_every, o_dmu, o_wn, o_eta,
    p_all, cw_all, Phic, u, dm_c, rg, idx, z_all, y_all, mv, eta, cdf, A, trial, zl,
):
    """Step size per block (the schedule), then the records of Delta mu = dm_c, ||u|| and eta, the cumulative
    alignment M += eta [Delta mu]_+ and the update theta += eta u of run r at step kk; sampled gradient also moves
    the logits: z += eta y (y = Phi u) where mv (else u = 0)."""
    P = theta.shape[1]
    C, K, d = feat.shape[0], feat.shape[1], feat.shape[2]
    for pb in range(P):
        e0 = eta0[r, pb]
        if sched == 0:
            eta[pb] = e0
        elif sched == 1:
            eta[pb] = e0 / math.sqrt(kk + 1.0)
        elif sched == 2:
            base = 0.0
            dmb = 0.0  # first-order change; below the resolution of Phi the test is meaningless
            for q in range(blk_ptr[pb], blk_ptr[pb + 1]):
                base += Phic[blk_ctx[q]]
                dmb += dm_c[blk_ctx[q]]
            e = e0
            ok = False
            nh = max_halv + 1
            if e0 * abs(dmb) <= 1e-12 * (1.0 + abs(base)):
                ok = True
                nh = 0  # skip the search: take eta0
            for h in range(nh):
                for j in range(d):
                    trial[j] = theta[r, pb, j] + e * u[pb, j]
                tot = 0.0
                for q in range(blk_ptr[pb], blk_ptr[pb + 1]):
                    tot += _logodds(featST, npos_c, K, blk_ctx[q], trial, zl)
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
                            x += u[pb, j] * featS[c, a, j]
                        cdf[a] = x  # reuse as scratch
                        m_ += p_all[c, a] * x
                        if a < npos_c[c]:
                            mp_ += cw_all[c, a] * x
                        else:
                            mn_ -= cw_all[c, a] * x
                    vp, vn, v_ = 0.0, 0.0, 0.0
                    for a in range(K):
                        v_ += p_all[c, a] * (cdf[a] - m_) ** 2
                        if a < npos_c[c]:
                            vp += cw_all[c, a] * (cdf[a] - mp_) ** 2
                        else:
                            vn -= cw_all[c, a] * (cdf[a] - mn_) ** 2
                    sdmax = max(sdmax, math.sqrt(v_))
                    dsum += mp_ - mn_
                    ksum += vn - vp
                    cnt += 1
                else:
                    for i in range(G):  # x_i = u . phi(o_i) of the sampled group, in scratch A
                        x = 0.0
                        a = idx[c, i]
                        for j in range(d):
                            x += u[pb, j] * feat[c, a, j]
                        A[i] = x
                    dg, kg, sg, mixed = _group_safe_moments(A, rg[c], G)
                    sdmax = max(sdmax, sg)
                    if mixed:
                        dsum += dg
                        ksum += kg
                        cnt += 1
            eta[pb] = _safe_step_size(e0, dsum, ksum, cnt, sdmax, ac, tr_delta)
    rec = kk % rec_every == 0
    ri = kk // rec_every
    for c in range(C):
        pb = pmap[c]
        dm = dm_c[c]
        if rec:
            nn = 0.0
            for j in range(d):
                nn += u[pb, j] * u[pb, j]
            o_dmu[r, ri, c] = dm
            o_wn[r, ri, c] = math.sqrt(nn)
        if dm > 0:
            M[r, c] += eta[pb] * dm
        if sampled and mv[c]:
            e = eta[pb]
            for a in range(z_all.shape[1]):
                z_all[c, a] += e * y_all[c, a]
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


@njit(cache=True)
def _draw_batch(probs, u):
    out = np.empty(u.shape, np.int64)
    K = probs.shape[1]
    cdf = np.full((1, _padded(K)), np.inf)
    rk = np.arange(K).reshape(1, K)
    for c in range(probs.shape[0]):
        acc = 0.0
        for a in range(K):
            acc += probs[c, a]
            cdf[0, a] = acc
        for i in range(u.shape[1]):
            out[c, i] = _draw(cdf, 0, K, u[c, i], probs[c:c + 1], rk)
    return out


@njit(cache=True)
def _cdf_batch(probs, rank):
    K = probs.shape[1]
    out = np.full((probs.shape[0], _padded(K)), np.inf)
    _cdf_rows(probs, rank, K, out, np.zeros(probs.shape[0], np.bool_))
    return out


def cdf_rows_nb(probs, rank=None) -> np.ndarray:
    """The sampled-gradient engine's cdf rows [C, K]: cdf[c, a] = sum_{b <= a} probs[c, rank[c, b]] by four blocked running
    sums (rank: identity by default; for tests against numpy.cumsum)."""
    p = np.ascontiguousarray(probs, dtype=np.float64)
    if p.ndim != 2 or p.shape[1] < 1 or not np.all(np.isfinite(p)) or np.any(p < 0):
        raise ValueError(f"probs must be finite, non-negative, of shape [C, K] with K >= 1, got shape {p.shape}")
    rk = np.broadcast_to(np.arange(p.shape[1]), p.shape) if rank is None else np.asarray(rank)
    if rk.shape != p.shape or not np.array_equal(np.sort(rk, axis=1), np.broadcast_to(np.arange(p.shape[1]), p.shape)):
        raise ValueError(f"rank must hold a permutation of 0..K-1 per row, of shape {p.shape}")  # indexes unchecked
    return _cdf_batch(p, np.ascontiguousarray(rk, dtype=np.uint32))[:, : p.shape[1]]


def draws_nb(probs, u) -> np.ndarray:
    """The engine's inverse-CDF draws [C, G] for probabilities [C, K] and uniforms [C, G] (for tests against
    bandits.reference.sample_arms)."""
    p = np.ascontiguousarray(probs, dtype=np.float64)
    uu = np.ascontiguousarray(u, dtype=np.float64)
    if p.ndim != 2 or p.shape[1] < 1 or not np.all(np.isfinite(p)) or np.any(p < 0) or np.any(p.sum(axis=1) <= 0):
        raise ValueError(f"probs must be finite, non-negative, [C, K] with positive rows, got shape {p.shape}")
    if uu.ndim != 2 or uu.shape[0] != p.shape[0] or np.any(~((uu >= 0) & (uu <= 1))):
        raise ValueError(f"u must hold uniforms in [0, 1] of shape [C, G] with C = {p.shape[0]}, got {uu.shape}")
    return _draw_batch(p, uu)


@njit(cache=True, fastmath=_FASTMATH)
def _dispatch_known(method, sampled):
    """Whether the kernels' dispatch has a rule for the method code: sampled gradient reads _advantages, exact gradient
    _exact_scalar, and both end in a branch that gives NaN for a code without one."""
    if sampled:
        A = np.empty(2)
        _advantages(method, np.array([0.0, 1.0]), A, False, 0.0, 0.1)
        return math.isfinite(A[0]) and math.isfinite(A[1])
    return math.isfinite(_exact_scalar(method, 0.5, 0.5, 2, _grpo_table(2, False, 0.0), 0.1))


def _method_code(method: str, sampled: bool) -> int:
    """The kernels' code of ``method`` (_CODE); ValueError naming the method when it has none or the kernels'
    dispatch has no rule for it for this gradient (_dispatch_known), so a run never takes another method's rule."""
    code = _CODE.get(method) if isinstance(method, str) else None
    if code is None or not _dispatch_known(code, bool(sampled)):
        kind = "sampled" if sampled else "exact"
        raise ValueError(f"method {method!r} has no rule in the engine's {kind}-gradient kernels (codes: {_CODE})")
    return code


def advantages_nb(method: str, rewards, *, std: str = "population", eps: float = 0.0, lam: float = 0.1) -> np.ndarray:
    """The numba advantage rule applied to groups rewards [B, G] (for tests against gapdyn)."""
    r = np.ascontiguousarray(np.asarray(rewards, dtype=np.float64).reshape(-1, np.shape(rewards)[-1]))
    A = _advantages_batch(_method_code(method, True), r, std == "bessel", float(eps), float(lam))
    return A.reshape(np.shape(rewards))


def exact_scalar_nb(method: str, J: float, G: int, *, std: str = "population", eps: float = 0.0, lam: float = 0.1):
    """The numba expected scalar E[w] / Gap at success rate J (for tests against gapdyn)."""
    tab = _grpo_table(int(G), std == "bessel", float(eps))
    return _exact_scalar(_method_code(method, False), float(J), float(1.0 - J), int(G), tab, float(lam))


# ---------------------------------------------------------------------------------------------
# driver
# ---------------------------------------------------------------------------------------------


def _seeds(seed, name: str = "seed", *, flat: bool = False) -> np.ndarray:
    """Seeds [R] as uint64, each checked by gapdyn._validate.check_seed (an integer in [0, 2^64 - 1], what
    numpy.random.default_rng takes; int64 would turn 2^63 into -2^63): a scalar or a 1-D array (any shape, raveled,
    with flat); ValueError naming ``name``."""
    arr = np.atleast_1d(np.asarray(seed, dtype=object))
    if arr.ndim != 1 and not flat:
        raise ValueError(f"{name} must be a non-negative integer or a 1-D array of them, got shape {arr.shape}")
    return np.array([check_seed(v, name) for v in arr.ravel()], dtype=np.uint64)


def _runs(bandit: ContextualBandit, eta, seed, theta0):
    P, d = bandit.n_params, bandit.dim
    eta_arr = np.asarray(eta, dtype=np.float64)
    if eta_arr.ndim > 2:
        raise ValueError(f"eta must be a scalar, [R] or [R, P], got shape {eta_arr.shape}")
    if eta_arr.size == 0 or not np.all(np.isfinite(eta_arr)) or np.any(eta_arr <= 0):
        raise ValueError("eta must be finite and > 0 (every entry)")
    seed_arr = _seeds(seed)
    R = max(eta_arr.shape[0] if eta_arr.ndim >= 1 else 1, seed_arr.shape[0])
    if eta_arr.ndim == 2 and eta_arr.shape[1] != P:
        raise ValueError(f"eta of shape [R, P] needs P = {P} blocks, got {eta_arr.shape}")
    e = eta_arr.reshape(-1, 1) if eta_arr.ndim < 2 else eta_arr
    try:
        e = np.ascontiguousarray(np.broadcast_to(e, (R, P)), dtype=np.float64)
        s = np.broadcast_to(seed_arr, (R,)).copy()
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


_LOGIT_LIMIT = 1e300  # |logit| bound below which differences of logits and their exps stay finite


def _check_eta_bound(eta0, theta, dyn: Dynamics, fnorm_max: float) -> None:
    """ValueError naming eta when the logits could overflow within the run.

    |z| <= (|theta0| + sum_k eta_k ||u_k||) max||phi|| <= (|theta0| + eta0 T U) max||phi||, with U a bound
    on ||u_k|| (eta_k <= eta0 for every schedule): SGD ||w|| <= 2 max||phi|| a, a = max(1, 1 + lam, sqrt G)
    bounds |A_i| and E[w] / Gap; unit steps ||w|| = 1; Adam |u_j| <= sqrt(sum_{i<T} (b1^2 / b2)^i / (1 - b2))
    (Cauchy-Schwarz on m_t, v_t). A sufficient condition: that bound stays below 1e300 (log scale).
    """
    T, d = dyn.steps, theta.shape[-1]
    if dyn.optimizer == "adam":
        b1, b2 = dyn.adam_betas
        q = b1 * b1 / b2 if b2 > 0 else math.inf
        if q < 1.0:
            log_geo = -math.log1p(-q) if q > 0 else 0.0
        else:
            log_geo = math.log(T) + (T - 1) * math.log(q) if math.isfinite(q) else math.inf
        log_u = 0.5 * (math.log(d) + log_geo - math.log1p(-b2))
    elif dyn.normalize:
        log_u = 0.0
    else:
        a = max(1.0, 1.0 + dyn.lam, math.sqrt(dyn.group_size))
        log_u = math.log(2.0 * a * max(fnorm_max, 1e-300))
    e = float(np.max(eta0))
    th = float(np.max(np.abs(theta))) if theta.size else 0.0
    log_z = math.log(max(fnorm_max, 1e-300)) + np.logaddexp(math.log(max(th, 1e-300)), math.log(e) + math.log(T) + log_u)
    if not log_z < math.log(_LOGIT_LIMIT):
        raise ValueError(
            f"eta = {e:.3g} is too large: eta0 * steps * max|u| * max|phi| ~ 1e{log_z / math.log(10):.0f} would "
            f"overflow the logits (limit {_LOGIT_LIMIT:.0e})"
        )


_announced = False


def kernels_cached() -> bool:
    """Whether numba's on-disk cache already holds the compiled simulation kernel (no compile on first use)."""
    if _kernel.signatures:
        return True
    try:
        return bool(_kernel._cache._cache_file._load_index())  # numba's cache index (empty if stale or absent)
    except Exception:  # noqa: BLE001 - private numba API: treat any change as "unknown, not cached"
        return False


def _announce_compile() -> None:
    """Say on stderr, once per process, that the first run compiles the kernels (numba cache missing)."""
    global _announced
    if not _announced:
        _announced = True
        if not kernels_cached():
            print("gapdyn: compiling kernels, first run only (about a minute on 2 cores; cached on disk afterwards) ...",
                  file=sys.stderr, flush=True)


def ensure_compiled(progress: bool = True) -> bool:
    """Compile (or load from numba's disk cache) the simulation kernels now; returns whether they were cached.

    With progress, a missing cache is announced on stderr ("compiling kernels, first run only ...").
    """
    global _announced
    cached = kernels_cached()
    if not progress:
        _announced = True
    from .envs import make_bandit

    b = make_bandit(n_contexts=2, n_arms=4, dim=2, n_correct=1, seed=0)
    for gradient in GRADIENTS:
        simulate(b, Dynamics(gradient=gradient, steps=2, group_size=2), eta=0.1, seed=0, threads=1)
    return cached


def _thread_count(threads) -> int | None:
    if threads is None:
        return None
    top = numba.config.NUMBA_NUM_THREADS
    if isinstance(threads, bool) or not isinstance(threads, numbers.Integral) or not 1 <= threads <= top:
        raise ValueError(f"threads must be an integer in [1, {top}] (NUMBA_NUM_THREADS), got {threads!r}")
    return int(threads)


def simulate(bandit: ContextualBandit, dyn: Dynamics, *, eta, seed=0, theta0=None, chunk: int = 256,
             threads: int | None = None) -> Trajectory:
    """Run R = len(eta) (or len(seed)) runs of ``dyn`` on ``bandit`` (see the module docstring).

    Args:
        bandit: the environment.
        dyn: the dynamics config.
        eta: eta0 per run: scalar, [R], or [R, P] (one per parameter block).
        seed: per-run seed (an integer in [0, 2^64 - 1] or [R] of them; kept as uint64 in Trajectory.seed); run r's
            group draws come from numpy.random.default_rng(seed[r]).
            Runs with equal seeds share their random stream (common random numbers across etas).
        theta0: start [P, d] or [R, P, d] (default 0).
        chunk: steps per kernel call (bounds the memory of the pre-drawn uniforms), rounded up to a multiple of
            8 (sampled gradient recomputes its carried logits every 8 steps and at a call's start: results do not
            depend on the chunk).
        threads: numba threads over runs for this call (default: numba's current setting); results are
            bitwise identical for every thread count (each pair of runs is done by one thread).
    """
    if not isinstance(bandit, ContextualBandit):
        raise ValueError(f"bandit must be a ContextualBandit, got {type(bandit).__name__}")
    if not isinstance(dyn, Dynamics):
        raise ValueError(f"dyn must be a Dynamics, got {type(dyn).__name__}")
    nthreads = _thread_count(threads)
    code = _method_code(dyn.method, dyn.gradient == "sampled")
    eta0, seeds, theta = _runs(bandit, eta, seed, theta0)
    R, P, d = theta.shape
    C, G, T, every = bandit.n_contexts, dyn.group_size, dyn.steps, dyn.record_every
    n_rec = (T - 1) // every + 1
    pmap = bandit.param_map
    fnorm = np.linalg.norm(bandit.features, axis=-1)  # ||phi(x, a)||, the scale of round-off in w
    _check_eta_bound(eta0, theta, dyn, float(fnorm.max()))
    perm = np.ascontiguousarray(np.argsort(-bandit.rewards, axis=1, kind="stable"))  # correct arms first
    featS = np.ascontiguousarray(np.take_along_axis(bandit.features, perm[..., None], axis=1))
    K = bandit.n_arms
    Kp = -(-K // _ARM_PAD) * _ARM_PAD  # sorted arms padded with zero arms: the per-arm loops have no scalar tail
    featST = np.zeros((C, d, Kp))
    featST[:, :, :K] = np.swapaxes(featS, 1, 2)
    fnormS = np.zeros((C, Kp))
    fnormS[:, :K] = np.take_along_axis(fnorm, perm, axis=1)
    npos = bandit.rewards.sum(axis=1).astype(np.int64)
    # position of each original arm among the sorted; unsigned, so indexing with it skips the negative-index fix
    rank = np.ascontiguousarray(np.argsort(perm, axis=1).astype(np.uint32))
    order = np.argsort(pmap, kind="stable")
    blk_ptr = np.searchsorted(pmap[order], np.arange(P + 1)).astype(np.int64)
    am, av = np.zeros((R, P, d)), np.zeros((R, P, d))
    M, phi_prev = np.zeros((R, C)), np.zeros((R, C))
    J_min, ndec = np.full((R, C), np.inf), np.zeros((R, C), np.int64)
    J_tail = np.stack([np.full((R, C), np.inf), np.full((R, C), -np.inf)], axis=1)  # [R, 2, C]: tail min, max
    Jbar = np.stack([np.full(R, np.inf), np.full(R, np.inf), np.full(R, -np.inf)], axis=1)  # [R, 3]: min, tail min, max
    names = ("J", "Phi", "dmu", "M", "wnorm", "dPhi", "entropy")
    # one block (views per record): above numpy's 4 MB it is backed by huge pages where the OS allows, so the first
    # writes fault far less often than into seven separate arrays
    rec = dict(zip(names, np.full((len(names), R, n_rec, C), np.nan)))
    rec_eta = np.full((R, n_rec, P), np.nan)
    f_J, f_Phi = np.full((R, C), np.nan), np.full((R, C), np.nan)
    sched = dyn.schedule
    b1, b2 = dyn.adam_betas
    rngs = [np.random.default_rng(int(s)) for s in seeds] if dyn.gradient == "sampled" else None
    chunk = -(-max(1, int(chunk)) // _REFRESH) * _REFRESH  # calls start on a step where the logits are recomputed
    # pairs of runs in round-robin order over the threads: prange hands each thread a contiguous block of this
    # list, so runs next to each other in the grid (similar step sizes, similar work) go to different threads
    nt = nthreads or numba.get_num_threads()
    pairs = np.concatenate([np.arange(t, (R + 1) // 2, nt) for t in range(nt)]).astype(np.int64)
    before = numba.get_num_threads()
    if nthreads is not None:
        numba.set_num_threads(nthreads)
    try:
        for start in range(0, T, chunk):
            n = min(chunk, T - start)
            last = start + n == T
            if rngs is not None:
                unif = np.empty((R, n, C, G))
                for r in range(R):
                    rngs[r].random(out=unif[r])  # in place: no temporary (the same stream as random((n, C, G)))
            else:
                unif = np.empty((R, 0, C, G))
            _announce_compile()
            _kernel(
                bandit.features, bandit.rewards, fnorm, pmap, blk_ptr, order, featS, featST, fnormS, npos, rank,
                theta, am, av, M, phi_prev, J_min, ndec, J_tail, Jbar,
                eta0, unif, start, n, int(last), pairs, tail_start(T),
                code, dyn.gradient == "sampled", G, dyn.std == "bessel", float(dyn.adv_eps), float(dyn.lam),
                bool(dyn.normalize), _SCHED[sched.kind], float(sched.c), float(sched.delta), int(sched.max_halvings),
                dyn.optimizer == "adam", float(b1), float(b2), float(dyn.adam_eps), every,
                rec["J"], rec["Phi"], rec["dmu"], rec["M"], rec["wnorm"], rec["dPhi"], rec["entropy"], rec_eta,
                f_J, f_Phi,
            )  # fmt: skip
    finally:
        numba.set_num_threads(before)
    return Trajectory(
        steps=np.arange(0, T, every),
        **rec,
        eta=rec_eta,
        J_final=f_J,
        Phi_final=f_Phi,
        M_final=M,
        J_min=J_min,
        J_tail_min=np.ascontiguousarray(J_tail[:, 0]),
        J_tail_max=np.ascontiguousarray(J_tail[:, 1]),
        Jbar_min=np.ascontiguousarray(Jbar[:, 0]),
        Jbar_tail_min=np.ascontiguousarray(Jbar[:, 1]),
        Jbar_tail_max=np.ascontiguousarray(Jbar[:, 2]),
        n_decrease=ndec,
        theta_final=theta,
        eta0=eta0,
        seed=seeds,
        dynamics=dyn,
    )


def run_grid(bandit: ContextualBandit, dyn: Dynamics, *, etas, seeds, theta0=None, chunk: int = 256,
             threads: int | None = None):
    """simulate() over the product etas x seeds; returns (Trajectory, eta per run, seed per run)."""
    try:
        e = np.asarray(etas, dtype=np.float64).ravel()
    except (TypeError, ValueError) as exc:
        raise ValueError(f"etas must be real numbers, got {etas!r}") from exc
    s = _seeds(seeds, "seeds", flat=True)
    E, S = np.meshgrid(e, s, indexing="ij")
    traj = simulate(bandit, dyn, eta=E.ravel(), seed=S.ravel(), theta0=theta0, chunk=chunk, threads=threads)
    return traj, E.ravel(), S.ravel()
