"""bandits.engine against its speed references (benchmarks.references) and over threads, interleaved.

One round times, one after the other: the engine (exact and sampled, 1 thread; exact also recording
every ``sparse_every`` steps), the fused fast-math exact kernel on the same runs and steps, the plain
numpy sampled loop on a subset of the runs with fewer steps (its cost is linear in both: compared per
run-step), and the engine with each extra thread count. The sampled engine skips the work of a run-context
whose direction is 0 (a group with equal rewards under GRPO) and its next forward pass, so its time depends
on the share of such directions, which is reported; the same comparison with ``w_reinforce`` (advantages
lam / -1: no group gives a zero direction, and E_pi[phi] is needed at every step) shows the case without
skips. Ratios are per round (the calls of a round share the machine's load) and reported as median
[min, max] over the rounds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numba
import numpy as np

from bandits.engine import simulate

from . import bandit as bb
from .references import fused_exact, numpy_sampled
from .timing import Stat, interleaved, ratio

__all__ = ["SpeedResult", "speed_vs_references"]


@dataclass(frozen=True)
class SpeedResult:
    workload: bb.Workload
    threads: tuple  # thread counts timed (1 first)
    times: dict  # name -> Stat (seconds per call)
    exact_vs_fused: Stat  # fused time / engine time (same runs and steps, 1 thread)
    sampled_vs_numpy: Stat  # per run-step: numpy loop time / engine time (1 thread)
    sampled_zero_share: float  # share of (run, step, context) with direction u = 0 (work skipped) in that run
    dense_method: str  # a method without zero directions (w_reinforce)
    dense_vs_numpy: Stat  # the same ratio for dense_method
    dense_zero_share: float
    sparse_vs_dense: Stat  # engine exact recording every sparse_every steps / every step (time ratio)
    scaling: dict  # (mode, threads) -> Stat of time(1 thread) / time(threads)
    fused_maxdiff: float  # max |theta_final engine - fused| on the timed runs (relative to max |theta|)
    numpy_runs: int
    numpy_steps: int
    sparse_every: int


def speed_vs_references(w: bb.Workload, repeats: int = 5, threads=(1, 2), sparse_every: int = 50) -> SpeedResult:
    """Time the engine against the fused kernel and the numpy loop on ``w`` (module doc)."""
    bandit = w.bandit()
    eta, seed = bb.grid(w)
    sub = bb._ref_subset(w)
    top = numba.config.NUMBA_NUM_THREADS
    threads = tuple(t for t in dict.fromkeys((1,) + tuple(threads)) if t <= top)
    dex, dsa = w.dynamics("exact"), w.dynamics("sampled")
    dsparse = replace(dex, record_every=max(1, min(sparse_every, w.steps)))
    eng = simulate(bandit, dex, eta=eta, seed=seed, threads=1)
    dense = "w_reinforce"
    ddense = replace(dsa, method=dense)
    zero_share = {m: float(np.mean(simulate(bandit, dyn, eta=eta, seed=seed, threads=1).wnorm == 0.0))
                  for m, dyn in ((w.method, dsa), (dense, ddense))}
    fus = fused_exact(bandit, w.method, w.group_size, eta, w.steps)
    scale = max(1.0, float(np.abs(fus).max()))
    fused_maxdiff = float(np.abs(eng.theta_final - fus).max()) / scale
    fns = {
        "exact_fused": lambda: fused_exact(bandit, w.method, w.group_size, eta, w.steps),
        "numpy_sampled": lambda: numpy_sampled(bandit, w.method, w.group_size, eta[sub], seed[sub], w.ref_steps),
        "exact_sparse_1": lambda: simulate(bandit, dsparse, eta=eta, seed=seed, threads=1),
        "numpy_dense": lambda: numpy_sampled(bandit, dense, w.group_size, eta[sub], seed[sub], w.ref_steps),
        "dense_1": lambda: simulate(bandit, ddense, eta=eta, seed=seed, threads=1),
    }
    for t in threads:
        fns[f"exact_{t}"] = lambda t=t: simulate(bandit, dex, eta=eta, seed=seed, threads=t)
        fns[f"sampled_{t}"] = lambda t=t: simulate(bandit, dsa, eta=eta, seed=seed, threads=t)
    times = interleaved(fns, repeats=repeats, warmup=1)
    per_step = (w.runs * w.steps) / (len(sub) * w.ref_steps)  # engine work / numpy-loop work
    scaling = {(m, t): ratio(times[f"{m}_1"], times[f"{m}_{t}"]) for m in ("exact", "sampled") for t in threads}
    return SpeedResult(
        workload=w, threads=threads, times=times,
        exact_vs_fused=ratio(times["exact_fused"], times["exact_1"]),
        sampled_vs_numpy=ratio(times["numpy_sampled"], times["sampled_1"], per_step),
        sampled_zero_share=zero_share[w.method], dense_method=dense,
        dense_vs_numpy=ratio(times["numpy_dense"], times["dense_1"], per_step), dense_zero_share=zero_share[dense],
        sparse_vs_dense=ratio(times["exact_sparse_1"], times["exact_1"]),
        scaling=scaling, fused_maxdiff=fused_maxdiff, numpy_runs=len(sub), numpy_steps=w.ref_steps,
        sparse_every=dsparse.record_every,
    )  # fmt: skip
