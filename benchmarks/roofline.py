"""What this machine allows for one exact bandit update, measured in the same run (single core, float64).

Two ceilings, in context-arm updates per second (one context-arm update = the work of one arm of one
context in one step):

- memory: a STREAM-like triad ``a = b + s c`` (and copy) over arrays far larger than the caches gives
  the sustained bandwidth BW; one exact update must read at least the arm's features and reward,
  ``8 (d + 1)`` bytes, so ``BW / (8 (d + 1))`` bounds a run whose features are streamed from memory.
- compute: :func:`fused_exact_ceiling` -- a numba kernel doing only the minimal arithmetic of one exact
  update per context and step (logits z = Phi theta, softmax split by reward class, J, Gap = g+ - g-,
  the scalar J (1 - J) and theta += eta s Gap), on ONE context's features [K, d] (12.8 kB at K = 100,
  d = 16: L1-resident), laid out for speed: features stored [d, K] so the logits loop runs
  elementwise over arms (vectorises and keeps each logit's IEEE summation order), arms sorted so the
  correct ones come first (the reward-class loops have no branches). No records, no entropy, no
  schedules. Strict (IEEE order, like bandits.engine) and ``fastmath=True`` (reassociated sums, so
  the reductions over arms vectorise too) variants; the higher one is the compute roofline.

The roofline of the workload is min(memory, compute); the engine's work is in cache at the benchmarked
sizes (C K d 8 bytes = 410 kB), so the compute ceiling binds. ``fastmath=True`` variants are measured
too (reassociated sums: what the machine allows when bitwise agreement with the reference is dropped).
:func:`exp_rate` (math.exp calls per second) bounds both: one exact update needs one exp per arm.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .timing import Stat, repeat

__all__ = ["stream_bandwidth", "fused_exact_ceiling", "ceiling_kernel_flops", "exp_rate", "ceiling_problem",
           "ceiling_run", "ceiling_callable"]


@njit(cache=True)
def _triad(a, b, c, s):
    for i in range(a.shape[0]):
        a[i] = b[i] + s * c[i]


@njit(cache=True)
def _copy(a, b):
    for i in range(a.shape[0]):
        a[i] = b[i]


def stream_bandwidth(n: int = 1 << 23, repeats: int = 5) -> dict[str, Stat]:
    """Bytes per second of copy (16 B/element) and triad (24 B/element) over float64 arrays of n elements."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    a, b, c = np.zeros(n), np.random.default_rng(0).random(n), np.random.default_rng(1).random(n)
    tri = repeat(lambda: _triad(a, b, c, 3.0), repeats)
    cp = repeat(lambda: _copy(a, b), repeats)
    return {"triad": tri.inverse(24.0 * n), "copy": cp.inverse(16.0 * n)}


@njit(cache=True)
def _exps(x, reps):
    acc = 0.0
    for _ in range(reps):
        for i in range(x.shape[0]):
            acc += math.exp(x[i])
    return acc


def exp_rate(n: int = 100, reps: int = 20000, repeats: int = 5) -> Stat:
    """math.exp calls per second in a numba loop (in cache): one exact update needs one per arm, so this
    alone bounds the throughput in context-arm updates per second."""
    x = -np.random.default_rng(0).random(n) * 10
    _exps(x, 1)
    return repeat(lambda: _exps(x, reps), repeats).inverse(float(n) * reps)


def _make_ceiling(fastmath: bool):
    @njit(cache=False, fastmath=fastmath)  # two variants of one closure: no on-disk cache (same qualname)
    def kernel(featT, npos, theta, eta, steps):
        # featT [d, K]: one context's features, transposed, arms sorted so the npos correct ones come first;
        # theta [R, C, d] (in/out), eta [R]
        d, K = featT.shape
        R, C = theta.shape[0], theta.shape[1]
        z = np.empty(K)
        gap = np.empty(d)
        acc = 0.0
        for r in range(R):
            for k in range(steps):
                for c in range(C):
                    th = theta[r, c]
                    for a in range(K):
                        z[a] = 0.0
                    for j in range(d):  # logits: elementwise over arms (IEEE order per arm kept)
                        tj = th[j]
                        for a in range(K):
                            z[a] += featT[j, a] * tj
                    zp = -np.inf
                    for a in range(npos):
                        zp = max(zp, z[a])
                    zn = -np.inf
                    for a in range(npos, K):
                        zn = max(zn, z[a])
                    sp = 0.0
                    for a in range(npos):  # one exp per arm, shifted by its class max
                        z[a] = math.exp(z[a] - zp)
                        sp += z[a]
                    sn = 0.0
                    for a in range(npos, K):
                        z[a] = math.exp(z[a] - zn)
                        sn += z[a]
                    ip, im = 1.0 / sp, -1.0 / sn
                    for a in range(npos):  # pi+ on correct arms, -pi- on incorrect ones
                        z[a] *= ip
                    for a in range(npos, K):
                        z[a] *= im
                    for j in range(d):  # Gap = sum_a w_a phi_a
                        s = 0.0
                        for a in range(K):
                            s += z[a] * featT[j, a]
                        gap[j] = s
                    phi = (zp + math.log(sp)) - (zn + math.log(sn))
                    J = 1.0 / (1.0 + math.exp(-phi))
                    sc = eta[r] * J * (1.0 - J)
                    for j in range(d):
                        th[j] += sc * gap[j]
                    acc += phi
        return acc

    return kernel


_ceiling_strict = _make_ceiling(False)
_ceiling_fast = _make_ceiling(True)


def ceiling_kernel_flops(K: int, d: int) -> int:
    """Floating-point operations of one context-step of the ceiling kernel (exp/log counted as one)."""
    return 2 * K * d + 2 * K * d + 4 * K + 3 * d + 12


def ceiling_problem(K: int, d: int, seed: int = 0):
    """(featT [d, K], npos): the ceiling kernel's context; arms 0..npos-1 are the correct ones."""
    featT = np.ascontiguousarray(np.random.default_rng(seed).normal(size=(d, K)))
    return featT, max(1, K // 10)


def ceiling_run(featT, npos: int, theta0, eta, steps: int, *, fastmath: bool = False) -> np.ndarray:
    """Final theta [R, C, d] of the ceiling kernel: exact ascent theta += eta J (1 - J) Gap per context
    (= bandits.engine's exact "reinforce" dynamics on C copies of the context; tests check that)."""
    th = np.array(theta0, dtype=np.float64, copy=True)
    (_ceiling_fast if fastmath else _ceiling_strict)(featT, int(npos), th, np.asarray(eta, np.float64), int(steps))
    return th


def ceiling_callable(K: int = 100, d: int = 16, C: int = 32, R: int = 8, steps: int = 200, *,
                     fastmath: bool = False, seed: int = 0):
    """(fn, context-arm updates per call) of the ceiling kernel, compiled (for interleaved timing)."""
    for name, v in (("K", K), ("d", d), ("C", C), ("R", R), ("steps", steps)):
        if v < 1 or (name == "K" and v < 2):
            raise ValueError(f"{name} must be a positive integer (K >= 2), got {v}")
    featT, npos = ceiling_problem(K, d, seed)
    theta0 = np.zeros((R, C, d))
    eta = np.geomspace(0.01, 1.0, R)
    kern = _ceiling_fast if fastmath else _ceiling_strict
    kern(featT, npos, theta0.copy(), eta, 1)  # compile
    return (lambda: kern(featT, npos, theta0.copy(), eta, steps)), float(R) * steps * C * K


def fused_exact_ceiling(K: int = 100, d: int = 16, C: int = 32, R: int = 8, steps: int = 200, *,
                        fastmath: bool = False, repeats: int = 5, seed: int = 0) -> Stat:
    """Context-arm updates per second of the minimal fused exact update (module doc), median of repeats."""
    fn, work = ceiling_callable(K, d, C, R, steps, fastmath=fastmath, seed=seed)
    return repeat(fn, repeats).inverse(work)
