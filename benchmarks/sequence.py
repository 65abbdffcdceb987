"""Token-level sequence bandit (``bandits.sequence``): time per run-step as a function of the length T.

Models: the shared log-linear token policy with fixed length T ("shared") and with an end token
(variable length up to T, "shared+eos"), and the position-wise tabular policy ("tabular"). Directions:
"sampled" (one group of G per run and step, GRPO advantages) and "logodds" (exact log-odds ascent,
w = Gap from the closed forms). All R runs (etas) go through one batched call of
``bandits.sequence.simulate``; the reference is the same function called once per run (a plain loop over
runs), timed alternately. For the exact direction the batched and the per-run results must agree
(reported as max |J_final difference|); sampled runs draw from the same per-run seeds in both routes
(agreement is a test, tests/test_bandits_sequence.py), so only their time is compared.

:func:`length_point` times the eta* searches of the length experiment with the numba kernels against the
numpy route of the same simulator (``backend=``), :func:`length_instance_time` one whole instance;
:func:`exact_point` exact runs of the shared and tabular models, numba (``shared_exact``, ``tabular_exact``) vs
numpy; ``python -m benchmarks.sequence`` prints all three (BENCHMARKS.md, "Sequence bandit").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bandits.sequence import SequenceDynamics, SharedSequenceBandit, TabularSequenceBandit, place_for_success_rate, simulate
from gapdyn.cmdline import command, parse

from .timing import Stat, interleaved, ratio

__all__ = ["SEQ_MODELS", "make_env", "sequence_point", "SequencePoint", "LengthPoint", "length_point",
           "ExactPoint", "exact_point", "length_instance_time", "main"]

SEQ_MODELS = ("shared", "shared+eos", "tabular")


def make_env(model: str, T: int, V: int = 10, d: int = 4, rule: str = "MAJ"):
    """The benchmarked environment (V = 10 tokens, token 0 correct) and a start with J = 0.5 placed along the
    Gap at zero parameters (0.2 or 0.05 where 0.5 is not reachable; else zero parameters)."""
    if model == "tabular":
        env = TabularSequenceBandit(V, T, rule)
        zero = np.zeros((T, V))
    elif model in ("shared", "shared+eos"):
        env = SharedSequenceBandit.random(V=V, d=d, T=T, rule=rule, seed=0, variable_length=model == "shared+eos")
        zero = np.zeros(d)
    else:
        raise ValueError(f"model must be one of {SEQ_MODELS}, got {model!r}")
    g = env.gap(zero)
    g = g / max(float(np.linalg.norm(g)), 1e-300)
    for J0 in (0.5, 0.2, 0.05):  # not every J0 is reachable along the Gap (e.g. with an end token)
        try:
            return env, place_for_success_rate(env, g, J0)
        except ValueError:
            continue
    return env, zero


@dataclass(frozen=True)
class SequencePoint:
    model: str
    direction: str
    T: int
    runs: int
    batched: Stat  # seconds per run-step, batched call
    looped: Stat  # seconds per run-step, one call per run
    speedup: Stat
    maxdiff: float  # exact direction: max |J_final batched - looped| (nan for sampled)


def sequence_point(model: str, direction: str, T: int, *, runs: int = 16, steps: int = 20, group_size: int = 8,
                   repeats: int = 3, loop_runs: int = 4) -> SequencePoint:
    """Batched vs per-run time (and agreement) of ``steps`` updates of ``runs`` runs at length T."""
    env, start = make_env(model, T)
    etas = np.geomspace(0.01, 0.3, runs)
    params = np.broadcast_to(start, (runs,) + start.shape).copy()
    nloop = min(loop_runs, runs)
    exact = direction != "sampled"  # "logodds": exact log-odds ascent, method "gap"
    dyn = SequenceDynamics(method="gap" if exact else "grpo", gradient="exact" if exact else "sampled",
                           group_size=group_size, steps=steps)

    def batched():
        return simulate(env, dyn, eta=etas, seed=np.arange(runs), theta0=params)

    def looped():
        return [simulate(env, dyn, eta=etas[i : i + 1], seed=i, theta0=params[i : i + 1]) for i in range(nloop)]

    maxdiff = float("nan")
    if exact:
        b = batched().J_final[:nloop]
        lo = np.concatenate([o.J_final for o in looped()])
        maxdiff = float(np.max(np.abs(b - lo)))
    t = interleaved({"batched": batched, "looped": looped}, repeats=repeats, warmup=0)
    tb = t["batched"].scaled(1.0 / (runs * steps))
    tl = t["looped"].scaled(1.0 / (nloop * steps))
    return SequencePoint(model, direction, T, runs, tb, tl, ratio(tl, tb), maxdiff)


# ---------------------------------------------------------------------------------------------
# the length experiment's hot path: numba kernels vs the numpy route of the same simulator


@dataclass(frozen=True)
class LengthPoint:
    mode: str  # "sampled" (the experiment's GRPO dynamics) or "exact"
    Ts: tuple[int, ...]
    numba: Stat  # seconds for the cells' eta* searches, backend="numba"
    numpy: Stat  # the same searches, backend="numpy"
    speedup: Stat
    same_eta_star: bool  # both backends found the same eta* (and status) in every cell


def length_point(mode: str = "sampled", *, instance: int = 0, rho: float = 0.5, J0: float = 0.1,
                 Ts: tuple[int, ...] = (1, 2, 4, 8, 16), repeats: int = 3, max_ratio: float | None = None
                 ) -> LengthPoint:
    """Time of the eta* searches of `gapdyn bandit run length --mode full` cells (one stream each:
    gapdyn.find_eta_star over ``simulate`` on the full configuration's scan, 1e-2..1e3 at ratio 1.01, or at
    ``max_ratio``: a coarser scan, for smoke tests) with backend="numba" vs "numpy", interleaved; the starts
    (placements) are made once, outside the timing."""
    import gapdyn
    from bandits.experiments import length as L
    from bandits.experiments._common import run_stats

    cfg = L.Config.full()
    dyn = SequenceDynamics(method=cfg.method, gradient=mode, group_size=cfg.group_size, steps=cfg.steps)
    starts, used = [], []
    for T in Ts:
        try:
            starts.append(L.start(instance, rho, T, J0, V=cfg.V, d=cfg.d, rule=cfg.rule))
            used.append(T)
        except ValueError:  # J0 not reachable at this T: the experiment has no run there either
            continue

    def searches(backend):
        def go():
            return [gapdyn.find_eta_star(
                lambda e, env=env, th=th: run_stats(simulate(env, dyn, eta=e, seed=0, theta0=th, backend=backend)),
                cfg.eta_lo, cfg.eta_hi, max_ratio=max_ratio or cfg.max_ratio) for env, th in starts]
        return go

    a, b = searches("numba")(), searches("numpy")()
    same = all(x.status == y.status and (x.eta_star == y.eta_star or (np.isnan(x.eta_star) and np.isnan(y.eta_star)))
               for x, y in zip(a, b))
    t = interleaved({"numba": searches("numba"), "numpy": searches("numpy")}, repeats=repeats, warmup=0)
    return LengthPoint(mode, tuple(used), t["numba"], t["numpy"], ratio(t["numpy"], t["numba"]), same)


@dataclass(frozen=True)
class ExactPoint:
    model: str  # one of SEQ_MODELS
    T: int
    numba: Stat  # seconds for one exact simulate call, backend="numba" (shared_exact / tabular_exact per step)
    numpy: Stat  # the same call, backend="numpy"
    speedup: Stat
    maxdiff: float  # max |J_final numba - numpy|


def exact_point(model: str, T: int, *, runs: int = 64, steps: int = 100, repeats: int = 3) -> ExactPoint:
    """Exact GRPO (G = 8) of ``runs`` etas 0.01..1 from :func:`make_env`'s start, numba vs numpy, interleaved."""
    env, start = make_env(model, T)
    dyn = SequenceDynamics(method="grpo", gradient="exact", group_size=8, steps=steps)
    etas = np.geomspace(0.01, 1.0, runs)

    def go(backend):
        return lambda: simulate(env, dyn, eta=etas, theta0=start, backend=backend)

    maxdiff = float(np.max(np.abs(go("numba")().J_final - go("numpy")().J_final)))
    t = interleaved({"numba": go("numba"), "numpy": go("numpy")}, repeats=repeats, warmup=0)
    return ExactPoint(model, T, t["numba"], t["numpy"], ratio(t["numpy"], t["numba"]), maxdiff)


def length_instance_time(instance: int = 0) -> tuple[float, float]:
    """(wall, CPU) seconds for every cell of one instance of `length --mode full` (run_cell as the experiment
    calls it; the CPU time is what a loaded machine does not inflate)."""
    import time

    from bandits.experiments import length as L

    cs = L.cells(L.Config.full(), [instance])
    L.run_cell(**cs[0])  # compiled and cached before timing
    t0, c0 = time.perf_counter(), time.process_time()
    for c in cs:
        L.run_cell(**c)
    return time.perf_counter() - t0, time.process_time() - c0


@dataclass
class SequenceConfig:
    """The length experiment's cells, numba vs numpy, and the time of one full-mode instance."""

    quick: bool = False
    """One repeat, T <= 8."""


@command("python -m benchmarks.sequence")
def main(argv: list[str]) -> int:
    """python -m benchmarks.sequence [--quick]: the length cells, numba vs numpy, and one full instance."""
    import os

    args = parse(SequenceConfig, argv, prog="python -m benchmarks.sequence")
    Ts = (1, 2, 4, 8) if args.quick else (1, 2, 4, 8, 16)
    reps = 1 if args.quick else 3
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    print("| mode | T | numba s | numpy s | numpy / numba | same eta* |\n|---|---|---|---|---|---|")
    for mode in ("sampled", "exact"):
        p = length_point(mode, Ts=Ts, repeats=reps)
        print(f"| {mode} | {','.join(map(str, p.Ts))} | {p.numba.median:.3f} {p.numba.spread()} | "
              f"{p.numpy.median:.3f} {p.numpy.spread()} | {p.speedup.median:.1f}x {p.speedup.spread()} | "
              f"{p.same_eta_star} |")
    print("\n| exact GRPO, 64 etas x 100 steps | T | numba s | numpy s | numpy / numba | max dJ |\n"
          "|---|---|---|---|---|---|")
    for model in SEQ_MODELS:
        for T in (4, 16) if not args.quick else (4,):
            p = exact_point(model, T, repeats=reps)
            print(f"| {model} | {T} | {p.numba.median:.3f} {p.numba.spread()} | {p.numpy.median:.3f} "
                  f"{p.numpy.spread()} | {p.speedup.median:.1f}x {p.speedup.spread()} | {p.maxdiff:.1e} |")
    for inst in (0, 1):
        wall, cpu = length_instance_time(inst)
        print(f"instance {inst} of `length --mode full` (60 cells x 2 streams, numba, 1 process): wall {wall:.1f} s, "
              f"CPU {cpu:.1f} s; 100 such instances on 2 workers: {100 * cpu / 2 / 60:.1f} min of CPU time")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
