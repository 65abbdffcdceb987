"""Token-level sequence bandit (``bandits.sequence``): time per run-step as a function of the length T.

Models: the shared log-linear token policy with fixed length T ("shared") and with an end token
(variable length up to T, "shared+eos"), and the position-wise tabular policy ("tabular"). Directions:
"sampled" (one group of G per run and step, GRPO advantages) and "logodds" (exact log-odds ascent,
w = Gap from the closed forms). All R runs (etas) go through one batched call of
``bandits.sequence.simulate``; the reference is the same function called once per run (a plain loop over
runs), timed alternately. For the exact direction the batched and the per-run results must agree
(reported as max |J_final difference|); sampled runs draw from the same per-run seeds in both routes
(agreement is a test, tests/test_bandits_sequence.py), so only their time is compared.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bandits.sequence import SequenceDynamics, SharedSequenceBandit, TabularSequenceBandit, place_for_success_rate, simulate

from .timing import Stat, interleaved, ratio

__all__ = ["SEQ_MODELS", "make_env", "sequence_point", "SequencePoint"]

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
    dyn = SequenceDynamics(method="gap" if exact else "grpo", mode="exact" if exact else "sampled",
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
