"""Experiment 4: stagnation at a fixed step size, and where a real plateau below J = 1 can appear
(THEORY.md §3 "stagnation strictly below 100%" [open]; SIMULATIONS.md "Stagnation").

Parts (one cell each per instance):
- ``single``: one context, exact REINFORCE and GRPO at fixed eta: fit 1 - J ~ a k^-b over the second half
  of the run (b = 1 and (1 - J) eta k ~ const expected: no plateau); sampled GRPO: final 1 - J.
- ``interference``: C contexts sharing one theta (log-linear, random correct arms), exact GRPO.
- ``tabular_shared``: C contexts sharing one tabular softmax with disjoint correct arms: the optimum is
  J* = (1/C) max_a #{x: a correct in x} < 1, an unreachable J = 1.
- ``unreachable``: d = 2 features with the correct arms strictly inside the convex hull of all arms: no
  direction makes a correct arm the argmax, so J* < 1 (computed by multi-start optimisation).
- ``adam``: GRPO (std-normalised advantages) with Adam, exact and sampled, fixed learning rates.
- ``controllers``: fresh instances, sampled GRPO over an eta grid: constant, decay, line search and the
  adaptive controller with trust regions delta in {1, 2, 4, 8}: collapse rate vs steps to J >= 0.9.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
from scipy.optimize import minimize
from scipy.special import expit
from scipy.spatial import ConvexHull

from bandits.engine import Dynamics, simulate
from bandits.envs import ContextualBandit, make_bandit
from bandits.schedules import Schedule

from ._common import COLLAPSE_J, fmt_range, run_experiment, steps_to, verdict, verdict_table

NAME = "stagnation"
PARTS = ("single", "interference", "tabular_shared", "unreachable", "adam", "controllers")


@dataclass(frozen=True)
class Config:
    """Experiment 4 settings."""

    mode: str = "full"
    n_instances: int = 6
    steps: int = 20000
    """long runs (single, interference, tabular_shared, unreachable, adam)."""
    etas: tuple[float, ...] = (0.3, 1.0, 3.0)
    """fixed step sizes (below the typical eta*) for the long runs."""
    n_contexts: int = 8
    """contexts sharing theta (interference, tabular_shared)."""
    adam_lrs: tuple[float, ...] = (0.01, 0.1, 1.0)
    n_seeds: int = 16
    controller_steps: int = 400
    controller_etas: tuple[float, ...] = (1.0, 10.0, 100.0, 1000.0, 10000.0)
    deltas: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0)

    @classmethod
    def quick(cls) -> "Config":
        return cls(mode="quick", n_instances=2, steps=1500, etas=(1.0,), n_contexts=4, adam_lrs=(0.1,), n_seeds=4,
                   controller_steps=100, controller_etas=(10.0, 1000.0), deltas=(2.0,))  # fmt: skip

    @classmethod
    def full(cls) -> "Config":
        return cls()


def cells(config: Config) -> list[dict]:
    common = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(config).items()
              if k not in ("mode", "n_instances")}  # fmt: skip
    return [{"part": p, "instance": i, **common} for p in PARTS for i in range(config.n_instances)]


def _record_every(steps: int) -> int:
    return max(1, steps // 400)


def _fit_tail(steps: np.ndarray, fail: np.ndarray) -> tuple[float, float]:
    """(b, a) of log(1-J) = log a - b log k over the second half of the run (k >= 1)."""
    sel = (steps >= steps[-1] / 2) & (steps >= 1) & (fail > 0)
    if sel.sum() < 3:
        return np.nan, np.nan
    b, loga = np.polyfit(np.log(steps[sel]), np.log(fail[sel]), 1)
    return float(-b), float(np.exp(loga))


def _interior_bandit(instance: int, K: int = 100, n_correct: int = 10) -> ContextualBandit:
    rng = np.random.default_rng(10_000 + instance)
    phi = rng.normal(size=(K, 2))
    hull = set(ConvexHull(phi).vertices.tolist())
    inner = np.array([a for a in np.argsort(np.linalg.norm(phi, axis=1)) if a not in hull])
    rew = np.zeros(K)
    rew[inner[:n_correct]] = 1.0  # the correct arms are the innermost points: never the argmax
    return ContextualBandit(phi[None], rew[None], seed=instance)


def _best_J(bandit: ContextualBandit, starts: int = 20) -> float:
    """max_theta of the mean J over contexts for a 1-block bandit, by multi-start BFGS (a lower estimate)."""
    rng = np.random.default_rng(0)

    shape = bandit.zeros().shape

    def negJ(th):
        th = th.reshape(shape)
        Phi = bandit.log_odds(th)
        J, Jb = expit(Phi), expit(-Phi)
        grad = (J * Jb)[:, None] * bandit.gap(th)  # grad J_x = J (1 - J) gap_x (THEORY.md §1)
        g = np.stack([grad[bandit.param_map == p].sum(0) for p in range(shape[0])]) / bandit.n_contexts
        return -float(np.mean(J)), -g.ravel()

    best = -negJ(np.zeros(shape).ravel())[0]
    for _ in range(starts):
        x0 = rng.normal(size=int(np.prod(shape))) * 2
        res = minimize(negJ, x0, jac=True, method="BFGS")
        best = max(best, -float(res.fun))
    return best


def _long_rows(part, bandit, dyn, etas, steps, extra=None, theta0=None, seeds=0):
    tr = simulate(bandit, dyn, eta=np.asarray(etas, float), seed=seeds, theta0=theta0)
    rows = []
    for r, eta in enumerate(np.broadcast_to(np.asarray(etas, float), (tr.J.shape[0],))):
        meanJ = tr.J[r].mean(axis=1)
        fail = 1 - meanJ
        b, a = _fit_tail(tr.steps, fail)
        k = np.array([steps // 10, steps // 2])
        idx = np.searchsorted(tr.steps, k)
        idx = np.minimum(idx, len(tr.steps) - 1)
        row = {"part": part, "method": dyn.method, "mode": dyn.mode, "optimizer": dyn.optimizer, "eta": float(eta),
               "seed": int(tr.seed[r]), "J_final": float(tr.J_final[r].mean()),
               "fail_final": float(np.mean(tr.failure_final[r])), "fail_10pct": float(fail[idx[0]]),
               "fail_half": float(fail[idx[1]]), "exponent": b, "coef": a, "coef_eta": a * eta,
               "J_min_ctx_final": float(tr.J_final[r].min()), "collapsed": bool(np.any(tr.J_final[r] < COLLAPSE_J))}  # fmt: skip
        if extra:
            row.update(extra)
        rows.append(row)
    return rows


def run_cell(
    *, part, instance, steps, etas, n_contexts, adam_lrs, n_seeds, controller_steps, controller_etas, deltas
) -> pd.DataFrame:
    every = _record_every(steps)
    rows: list[dict] = []
    if part == "single":
        b = make_bandit(n_contexts=1, seed=100 + instance)
        for m in ("reinforce", "grpo"):
            rows += _long_rows(part, b, Dynamics(method=m, steps=steps, record_every=every), etas, steps)
        rows += _long_rows(part, b, Dynamics(method="grpo", mode="sampled", steps=steps, record_every=every),
                           np.repeat(etas, n_seeds), steps, seeds=np.tile(np.arange(n_seeds), len(etas)))  # fmt: skip
    elif part == "interference":
        b = make_bandit(n_contexts=n_contexts, shared=True, seed=200 + instance)
        J_star = _best_J(b)  # multi-start BFGS on the mean J: a lower estimate of the optimum
        rows += _long_rows(part, b, Dynamics(method="grpo", steps=steps, record_every=every), etas, steps,
                           extra={"J_star": J_star})  # fmt: skip
        rows += _long_rows(part, b, Dynamics(method="gap", steps=steps, record_every=every), etas, steps,
                           extra={"J_star": J_star})  # fmt: skip
    elif part == "tabular_shared":
        base = make_bandit(n_contexts=n_contexts, n_arms=100, kind="tabular", seed=300 + instance, n_correct=10)
        rng = np.random.default_rng(300 + instance)
        perm = rng.permutation(100)
        rew = np.zeros((n_contexts, 100))
        for c in range(n_contexts):
            rew[c, perm[c * (100 // n_contexts) : c * (100 // n_contexts) + 100 // (2 * n_contexts)]] = 1.0
        b = ContextualBandit(base.features, rew, shared=True, kind="tabular", seed=300 + instance)
        J_star = float(rew.sum(axis=0).max() / n_contexts)
        rows += _long_rows(part, b, Dynamics(method="grpo", steps=steps, record_every=every), etas, steps,
                           extra={"J_star": J_star})  # fmt: skip
    elif part == "unreachable":
        b = _interior_bandit(instance)
        J_star = _best_J(b)
        for m in ("grpo", "reinforce"):
            rows += _long_rows(part, b, Dynamics(method=m, steps=steps, record_every=every), etas, steps,
                               extra={"J_star": J_star})  # fmt: skip
    elif part == "adam":
        b = make_bandit(n_contexts=1, seed=100 + instance)
        lrs = np.asarray(adam_lrs, float)
        rows += _long_rows(part, b, Dynamics(method="grpo", steps=steps, optimizer="adam", record_every=every), lrs, steps)
        rows += _long_rows(part, b, Dynamics(method="grpo", mode="sampled", steps=steps, optimizer="adam",
                                             record_every=every),
                           np.repeat(lrs, n_seeds), steps, seeds=np.tile(np.arange(n_seeds), len(lrs)))  # fmt: skip
    elif part == "controllers":
        b = make_bandit(n_contexts=1, seed=1000 + instance)
        E, S = np.meshgrid(np.asarray(controller_etas, float), np.arange(n_seeds), indexing="ij")
        scheds = [("constant", Schedule("constant")), ("decay", Schedule("decay")), ("linesearch", Schedule("linesearch"))]
        scheds += [(f"adaptive_d{d:g}", Schedule("adaptive", delta=d)) for d in deltas]
        for mode in ("exact", "sampled"):
            for name, sch in scheds:
                dyn = Dynamics(method="grpo", mode=mode, steps=controller_steps, schedule=sch)
                e, s = (E[:, 0], 0) if mode == "exact" else (E.ravel(), S.ravel())
                tr = simulate(b, dyn, eta=e, seed=s)
                t9 = steps_to(tr.J[:, :, 0], tr.steps, 0.9)
                t99 = steps_to(tr.J[:, :, 0], tr.steps, 0.99)
                for r in range(tr.J.shape[0]):
                    rows.append({"part": part, "mode": mode, "schedule": name, "eta": float(tr.eta0[r, 0]),
                                 "seed": int(tr.seed[r]), "J_final": float(tr.J_final[r, 0]),
                                 "collapsed": bool(tr.J_final[r, 0] < COLLAPSE_J), "steps_to_09": t9[r],
                                 "steps_to_099": t99[r]})  # fmt: skip
    else:
        raise ValueError(f"part must be one of {PARTS}, got {part!r}")
    return pd.DataFrame(rows)


def analyse(results: pd.DataFrame, config: Config) -> pd.DataFrame:
    rows = []
    R = results
    s = R[(R["part"] == "single") & (R["mode"] == "exact")]
    for m, g in s.groupby("method"):
        rows.append(verdict(
            f"single context, exact {m}, fixed eta: 1 - J ~ k^-b with b = 1 (no plateau)",
            f"etas {list(config.etas)}, {config.steps} steps, {config.n_instances} instances",
            f"b {fmt_range(g['exponent'])}; (1-J) eta k {fmt_range(g['coef_eta'])}; "
            f"1-J at k/2 -> end shrinks by {fmt_range(g['fail_half'] / g['fail_final'])}x",
            "b = 1; 0.16/(eta k) REINFORCE, 0.06/(eta k) GRPO (SIMULATIONS.md)",
            "holds" if np.all(np.abs(g["exponent"] - 1) < 0.15) else "does not hold",
        ))  # fmt: skip
    ss = R[(R["part"] == "single") & (R["mode"] == "sampled")]
    if len(ss):
        ok = ss[~ss["collapsed"]]
        rows.append(verdict(
            "single context, sampled GRPO: no plateau below J = 1 (runs collapse or freeze at 1-J ~ 0)",
            f"G=8, {config.n_seeds} seeds", f"collapsed {ss['collapsed'].mean():.3f}; final 1-J of the rest "
            f"{fmt_range(ok['fail_final'])}", "collapse early or 1-J < 1e-5, then freeze",
            "holds" if (ok["fail_final"] < 1e-3).all() else "does not hold",
        ))  # fmt: skip
    it = R[R["part"] == "interference"]
    if len(it):  # best known optimum: multi-start estimate or the best run on the same instance
        best = it.groupby("instance")["J_final"].transform("max")
        it = it.assign(J_star=np.maximum(it["J_star"], best))
    for m, g in it.groupby("method"):
        rows.append(verdict(
            f"{config.n_contexts} contexts sharing theta (log-linear), exact {m}: plateau below J = 1?",
            f"etas {list(config.etas)}, {config.steps} steps",
            f"final mean J {fmt_range(g['J_final'], 4)}; worst context J {fmt_range(g['J_min_ctx_final'], 3)}; "
            f"tail exponent b {fmt_range(g['exponent'])}; best known mean J (J*: multi-start BFGS or best run) {fmt_range(g['J_star'], 4)}; "
            f"J* - J_final {fmt_range(g['J_star'] - g['J_final'])}",
            "interference may cap J below 1 (untested before)",
            "plateau found" if (g["J_final"] < 0.99).any() and (g["exponent"].abs() < 0.2).any() else "no plateau: J -> 1",
        ))  # fmt: skip
    for part, label in (("tabular_shared", "shared tabular softmax, disjoint correct arms"),
                        ("unreachable", "correct arms inside the feature hull (d=2)")):  # fmt: skip
        g = R[R["part"] == part]
        if len(g):
            gap = g["J_star"] - g["J_final"]
            rows.append(verdict(
                f"{label}: J plateaus at the optimum J* < 1", f"etas {list(config.etas)}, {config.steps} steps",
                f"J* {fmt_range(g['J_star'], 4)}; J_final {fmt_range(g['J_final'], 4)}; J* - J_final {fmt_range(gap)}",
                "a plateau below 1 exists where J* < 1; it is the optimum, not stagnation",
                "holds" if np.all(g["J_star"] < 0.99) and np.all(np.abs(gap) < 0.02) else "does not hold",
            ))  # fmt: skip
    ad = R[R["part"] == "adam"]
    for mode, g in ad.groupby("mode"):
        ok = g[~g["collapsed"]]
        per_lr = ok.groupby("eta")["fail_final"].median()
        rows.append(verdict(
            f"GRPO (std-normalised) + Adam, {mode}: plateau below J = 1?", f"lr {list(config.adam_lrs)}",
            f"collapsed {g['collapsed'].mean():.3f}; median final 1-J by lr: "
            + "; ".join(f"{k:g}: {v:.2e}" for k, v in per_lr.items()),
            "updates that do not shrink with the failure signal might stall (untested before)",
            "plateau found" if (per_lr > 1e-2).any() else "no plateau: 1-J -> ~0",
        ))  # fmt: skip
    ct = R[R["part"] == "controllers"]
    for mode, g in ct.groupby("mode"):
        rate = g.groupby("schedule")["collapsed"].mean()
        piv = g.pivot_table(index=["instance", "eta", "seed"], columns="schedule", values="steps_to_09")
        parts = []
        for sname in rate.index:
            okk = np.isfinite(piv["constant"]) & np.isfinite(piv[sname])
            med = float(np.median(piv.loc[okk, sname])) if okk.any() else np.nan
            parts.append(f"{sname}: P(collapse) {rate[sname]:.3f}, median steps-to-0.9 {med:g}")
        adap = [n for n in rate.index if n.startswith("adaptive")]
        default = "adaptive_d2" if "adaptive_d2" in rate else (adap[0] if adap else None)
        okk = np.isfinite(piv["constant"]) & np.isfinite(piv[default]) if default else None
        slow = float(np.median(piv.loc[okk, default] / piv.loc[okk, "constant"])) if default and okk.any() else np.nan
        rows.append(verdict(
            f"controllers remove collapses without slowing convergence ({mode} GRPO, fresh instances)",
            f"etas {list(config.controller_etas)}, {config.controller_steps} steps", "; ".join(parts),
            "adaptive (no Phi needed) and line search: 0 collapses, steps-to-0.9 not larger than constant",
            ("holds" if rate.get(default, 1) == 0 and rate.get("linesearch", 1) == 0 and slow <= 1.0
             else "holds only for collapses (slower)" if rate.get(default, 1) == 0 else "does not hold"),
        ))  # fmt: skip
    return verdict_table(rows)


def run(config: Config, *, store=None, backend="joblib", n_jobs=-1, progress=True):
    """(results, verdict) through bandits.sweep.run_sweep."""
    import sys

    return run_experiment(sys.modules[__name__], config, store=store, backend=backend, n_jobs=n_jobs, progress=progress)
