"""Contextual-bandit simulation throughput: ``bandits.engine`` (numba, all runs in one kernel) against
``bandits.reference`` (plain numpy loop, one run and one step at a time), exact and sampled dynamics.

Throughput is counted in context-arm updates per second: R runs x T steps x C contexts x K arms divided
by the wall time. The reference loop's cost is linear in runs and steps (it loops over both), so it is
timed on a subset of the runs with fewer steps and normalised per run-step; the engine runs the full
grid. Engine and reference are timed alternately, repeat by repeat, and the per-repeat speed ratio is
reported as median [min, max].

Correctness is checked on the same workload: the engine and the reference are run on the reference's
runs (same seeds, etas, steps) and every recorded array (J, Phi, dmu, M, |u|, dPhi, entropy, eta, the
outcome statistics J_min, J_tail_min ... Jbar_tail_max, theta_final, ...) is compared; the maximal absolute
difference is reported with the speed.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np

from bandits.engine import Dynamics, Trajectory, simulate
from bandits.envs import make_bandit
from bandits.reference import simulate_reference

from .timing import Stat, interleaved, ratio, repeat

__all__ = ["Workload", "WORKLOAD", "grid", "compare_trajectories", "engine_vs_reference", "scaling"]


@dataclass(frozen=True)
class Workload:
    """The benchmarked problem: C contexts, K arms, d features, seeds x etas runs, group size G."""

    n_contexts: int = 32
    n_arms: int = 100
    dim: int = 16
    n_correct: int = 10
    n_seeds: int = 8
    n_etas: int = 8
    group_size: int = 8
    method: str = "grpo"
    steps: int = 200  # engine steps per timed call
    ref_runs: int = 4  # reference: runs timed (a spread of etas, distinct seeds)
    ref_steps: int = 40  # reference: steps per timed call (also the length of the correctness check)
    eta_range: tuple[float, float] = (0.01, 10.0)

    @property
    def runs(self) -> int:
        return self.n_seeds * self.n_etas

    def bandit(self):
        return make_bandit(n_contexts=self.n_contexts, n_arms=self.n_arms, dim=self.dim,
                           n_correct=min(self.n_correct, self.n_arms - 1), seed=0)

    def dynamics(self, mode: str, steps: int | None = None) -> Dynamics:
        return Dynamics(method=self.method, gradient=mode, group_size=self.group_size, steps=steps or self.steps)


WORKLOAD = Workload()


def grid(w: Workload) -> tuple[np.ndarray, np.ndarray]:
    """(eta [R], seed [R]) of the seeds x etas product, eta-major as in bandits.engine.run_grid."""
    e = np.geomspace(*w.eta_range, w.n_etas)
    s = np.arange(w.n_seeds, dtype=np.int64)
    E, S = np.meshgrid(e, s, indexing="ij")
    return E.ravel(), S.ravel()


def _ref_subset(w: Workload) -> np.ndarray:
    """Indices of the reference's runs: spread over the grid (different etas and seeds)."""
    R = w.runs
    n = min(w.ref_runs, R)
    return np.unique(np.linspace(0, R - 1, n).round().astype(int))


_COMPARED = ("J", "Phi", "dmu", "M", "wnorm", "dPhi", "entropy", "eta", "J_final", "Phi_final", "M_final",
             "J_min", "J_tail_min", "J_tail_max", "Jbar_min", "Jbar_tail_min", "Jbar_tail_max", "theta_final")


def compare_trajectories(a: Trajectory, b: Trajectory) -> dict[str, float]:
    """Max |a - b| per recorded array (NaN-aware: NaNs must coincide, else inf); n_decrease must be equal."""
    out = {}
    for k in _COMPARED:
        x, y = np.asarray(getattr(a, k), float), np.asarray(getattr(b, k), float)
        if x.shape != y.shape:
            out[k] = float("inf")
            continue
        nx, ny = np.isnan(x), np.isnan(y)
        if np.any(nx != ny):
            out[k] = float("inf")
            continue
        d = np.abs(x[~nx] - y[~ny])
        out[k] = float(d.max()) if d.size else 0.0
    out["n_decrease"] = float(np.max(np.abs(a.n_decrease - b.n_decrease))) if a.n_decrease.size else 0.0
    return out


@dataclass(frozen=True)
class BanditResult:
    mode: str
    workload: Workload
    engine_rate: Stat  # context-arm updates / s
    ref_rate: Stat
    speedup: Stat  # per-repeat engine rate / reference rate
    maxdiff: float  # max |engine - reference| over all compared arrays
    maxdiff_by: dict
    extra_rates: dict  # name -> Stat (context-arm updates / s) of the extra callables timed in the same rounds


def engine_vs_reference(w: Workload, mode: str, repeats: int = 5, extra: dict | None = None) -> BanditResult:
    """Throughput of engine and reference on ``w`` (module doc) and their max difference.

    extra: name -> (callable, context-arm updates per call), timed in the same interleaved rounds (e.g. the
    roofline kernels, so that the engine's fraction of the ceiling is a per-repeat ratio under equal load).
    """
    bandit = w.bandit()
    eta, seed = grid(w)
    sub = _ref_subset(w)
    dyn = w.dynamics(mode)
    dyn_ref = w.dynamics(mode, w.ref_steps)
    # correctness on the reference's runs, same steps
    ref = simulate_reference(bandit, dyn_ref, eta=eta[sub], seed=seed[sub])
    eng = simulate(bandit, dyn_ref, eta=eta[sub], seed=seed[sub])
    diffs = compare_trajectories(eng, ref)
    # the timed engine call covers the full grid; subset rows must equal the subset call (runs independent)
    work_eng = w.runs * w.steps * w.n_contexts * w.n_arms
    work_ref = len(sub) * w.ref_steps * w.n_contexts * w.n_arms
    fns = {
        "engine": lambda: simulate(bandit, dyn, eta=eta, seed=seed),
        "reference": lambda: simulate_reference(bandit, dyn_ref, eta=eta[sub], seed=seed[sub]),
    }
    extra = extra or {}
    fns.update({k: f for k, (f, _) in extra.items()})
    t = interleaved(fns, repeats=repeats, warmup=1)
    eng_rate, ref_rate = t["engine"].inverse(work_eng), t["reference"].inverse(work_ref)
    xr = {k: t[k].inverse(float(n)) for k, (_, n) in extra.items()}
    return BanditResult(mode, w, eng_rate, ref_rate, ratio(eng_rate, ref_rate), max(diffs.values()), diffs, xr)


def scaling(w: Workload, mode: str, axis: str, values, repeats: int = 3) -> list[tuple[int | str, Stat]]:
    """Engine time per run-step (seconds) as one axis of ``w`` varies.

    axis: "n_arms", "n_contexts", "runs" (n_etas = 1, the number of seeds varies), "group_size", "dim" or
    "method" (values are method names).
    """
    out = []
    for v in values:
        v = str(v) if axis == "method" else int(v)
        if axis == "runs":
            wv = replace(w, n_etas=1, n_seeds=v)
        elif axis in {f.name for f in fields(Workload)}:
            wv = replace(w, **{axis: v})
        else:
            raise ValueError(f"axis must be a Workload field or 'runs', got {axis!r}")
        bandit = wv.bandit()
        eta, seed = grid(wv)
        dyn = wv.dynamics(mode)
        t = repeat(lambda: simulate(bandit, dyn, eta=eta, seed=seed), repeats, warmup=1)
        out.append((v, t.scaled(1.0 / (wv.runs * wv.steps))))
    return out
