"""Does a threshold of exact GRPO-type dynamics reproduce? Spread over grid offsets and change with the horizon.

``python -m benchmarks.threshold_reproducibility [--instances 7001 7002 7003] [--methods grpo reinforce]
[--offsets 4] [--horizon 1000] [--out rows.csv]``

For each (instance, method) of the threshold experiment's setting (single-context log-linear bandit, K = 100,
d = 16, 10 correct arms, G = 8, exact expected updates from theta0 = 0, eta in [0.1, 1e5] on a 1 % grid, 0.1 %
fine scans; bandits.experiments.threshold.Config), gapdyn.find_eta_star is run on ``offsets`` base grids shifted
by k / offsets of a 1 % step (k = 0 .. offsets-1) at the horizons H, 2H and 4H. One run of 4H steps per eta gives
all three horizons (the first H states of a constant-step exact run are the run of horizon H; checked here
against a direct H-step simulation). Per search it records the candidate thresholds (the first collapsed eta,
eta_safe, eta_50, eta_dip) and, from the 4H trajectory, the excursion of J below 1e-3 (gapdyn.excursion_lengths)
at the first collapsed eta of horizon H.

Instances: make_bandit seeds 7001 on, which no experiment of the project uses (their blocks are 0-19 and
1000-1099), so the choice of a quantity is made apart from any verification set. Run it alone, with
OMP_NUM_THREADS=1: it is one process over the engine's compiled kernels.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from typing import Annotated

import numpy as np
import pandas as pd

import gapdyn
from bandits.engine import Dynamics, simulate
from bandits.experiments import mechanisms as mech
from bandits.experiments.threshold import Config
from gapdyn.cmdline import command, optional, parse

QUANTITIES = ("eta_star", "eta_safe", "eta_50", "eta_dip")
"""The candidates: first collapsed eta, what the scan certifies, the window threshold, the first dip."""


class HorizonCache:
    """run_stats for the horizons H, 2H, 4H of one (bandit, method) from one 4H run per eta (cached)."""

    def __init__(self, bandit, method: str, horizon: int, *, group_size: int = 8, chunk: int = 256):
        self.bandit, self.H, self.chunk = bandit, int(horizon), int(chunk)
        self.horizons = (self.H, 2 * self.H, 4 * self.H)
        self.dyn = Dynamics(method=method, gradient="exact", group_size=group_size, steps=4 * self.H, record_every=1)
        self.theta0 = bandit.zeros()
        self.rows: dict[float, tuple] = {}
        self.simulated = 0

    def _fill(self, etas: np.ndarray) -> None:
        new = np.array([e for e in etas.tolist() if e not in self.rows])
        for i in range(0, new.size, self.chunk):
            part = new[i:i + self.chunk]
            tr = simulate(self.bandit, self.dyn, eta=part, theta0=self.theta0)
            J = np.clip(np.concatenate([tr.J[:, :, 0], tr.J_final[:, :1]], axis=1), 0.0, 1.0)  # states 0..4H
            per_h = [gapdyn.RunStats.from_trajectory(J[:, : h + 1]) for h in self.horizons]
            longest, final = gapdyn.excursion_lengths(J)
            for r, e in enumerate(part.tolist()):
                self.rows[e] = (tuple((s.J_min[r], s.J_tail_min[r], s.J_tail_max[r]) for s in per_h),
                                int(longest[r]), int(final[r]))
            self.simulated += part.size

    def run_stats(self, horizon_index: int):
        def fn(etas):
            self._fill(etas)
            vals = np.array([self.rows[e][0][horizon_index] for e in etas.tolist()])
            return gapdyn.RunStats(vals[:, 0], vals[:, 1], vals[:, 2])

        return fn

    def excursion(self, eta: float) -> dict:
        """The excursion below 1e-3 of the run at eta over 4H states: its longest stretch, whether it is still
        under way at 4H, and the first state after its start where J is back above 1e-3."""
        tr = simulate(self.bandit, self.dyn, eta=np.array([eta]), theta0=self.theta0)
        J = np.clip(np.concatenate([tr.J[0, :, 0], tr.J_final[0, :1]]), 0.0, 1.0)
        longest, final = (int(v) for v in gapdyn.excursion_lengths(J))
        below = np.flatnonzero(J < gapdyn.COLLAPSE_J)
        back = math.nan
        if below.size:
            after = np.flatnonzero(J[below[0]:] >= gapdyn.COLLAPSE_J)
            back = float(below[0] + after[0]) if after.size else math.inf
        return {"exc_longest": longest, "exc_censored": final > 0, "exc_start": float(below[0]) if below.size else
                math.nan, "exc_back": back, "J_at_H": float(J[self.H]), "J_at_2H": float(J[2 * self.H]),
                "J_at_4H": float(J[4 * self.H])}


def check_prefix(bandit, method: str, horizon: int, etas) -> float:
    """Largest |J_H(direct H-step run) - J at state H of the 4H run| over etas (0 when the prefix is exact)."""
    a = simulate(bandit, Dynamics(method=method, gradient="exact", steps=horizon, record_every=horizon),
                 eta=np.asarray(etas, float), theta0=bandit.zeros()).J_final[:, 0]
    b = simulate(bandit, Dynamics(method=method, gradient="exact", steps=4 * horizon, record_every=1),
                 eta=np.asarray(etas, float), theta0=bandit.zeros()).J[:, horizon, 0]
    return float(np.max(np.abs(a - b)))


def measure(instance: int, method: str, *, offsets: int, horizon: int, config: Config) -> list[dict]:
    bandit = mech.instance_bandit(instance, n_arms=config.n_arms, dim=config.dim, n_correct=config.n_correct)
    cache = HorizonCache(bandit, method, horizon, group_size=config.group_size)
    rows = []
    for k in range(offsets):
        shift = config.max_ratio ** (k / offsets)
        for hi_idx, h in enumerate(cache.horizons):
            t0 = time.perf_counter()
            res = gapdyn.find_eta_star(cache.run_stats(hi_idx), config.eta_lo * shift, config.eta_hi * shift,
                                       max_ratio=config.max_ratio, rtol=config.rtol)
            row = {"instance": instance, "method": method, "offset": k / offsets, "horizon": h,
                   "status": res.status, "eta_star": res.eta_star if res.status == "found" else math.nan,
                   "eta_safe": res.eta_safe, "safe_resolution": res.safe_resolution,
                   "eta_50": res.eta_50 if res.eta_50_status == "found" else math.nan,
                   "eta_dip": res.eta_dip if res.dip_status == "found" else math.nan,
                   "n_islands": res.n_islands, "reconverge_share": res.reconverge_share,
                   "dip_recover_share": res.dip_recover_share, "n_evaluations": res.n_evaluations,
                   "per_decade": ";".join(f"{a:.3g}-{b:.3g}:{f:.3f}" for a, b, f in res.collapse_per_decade if f > 0),
                   "seconds": time.perf_counter() - t0}
            if hi_idx == 0 and res.status == "found":
                row.update(cache.excursion(res.eta_star))
            rows.append(row)
    for r in rows:
        r["simulated"] = cache.simulated
    return rows


def excursion_curve(instance: int, method: str, eta_star: float, *, horizon: int, config: Config,
                    steps_factor: int = 16, n: int = 24) -> dict:
    """Exact dynamics' excursion below 1e-3 against eta: runs of steps_factor x H steps on
    geomspace(eta_star / 1.3, eta_star x 1.5, n). Returns the rows and the log-log slope of the excursion's
    length L on 1 / min J over the runs whose excursion ended (L >= 10) and the smallest eta from which
    every run of the curve is still below 1e-3 at the end (NaN if none)."""
    bandit = mech.instance_bandit(instance, n_arms=config.n_arms, dim=config.dim, n_correct=config.n_correct)
    T = steps_factor * horizon
    etas = np.geomspace(eta_star / 1.3, eta_star * 1.5, n)
    tr = simulate(bandit, Dynamics(method=method, gradient="exact", group_size=config.group_size, steps=T,
                                   record_every=1), eta=etas, theta0=bandit.zeros())
    J = np.clip(np.concatenate([tr.J[:, :, 0], tr.J_final[:, :1]], axis=1), 0.0, 1.0)
    longest, final = gapdyn.excursion_lengths(J)
    jmin = J.min(axis=1)
    done = (final == 0) & (longest >= 10) & (jmin > 0)
    slope = math.nan
    if done.sum() >= 3:
        slope = float(np.polyfit(np.log(1 / jmin[done]), np.log(longest[done]), 1)[0])
    cens = final > 0
    tail_all = np.flatnonzero(~cens)
    absorb = float(etas[tail_all[-1] + 1]) if tail_all.size and tail_all[-1] + 1 < n else (
        float(etas[0]) if not tail_all.size else math.nan)
    return {"instance": instance, "method": method, "steps": T, "etas": etas.tolist(),
            "L": longest.tolist(), "censored": cens.tolist(), "J_min": jmin.tolist(), "slope_L_on_invJmin": slope,
            "eta_all_censored": absorb, "eta_all_censored_over_eta_star_H": absorb / eta_star}


def sampled_absorption(instances, *, config: Config, factor: int = 4) -> dict:
    """Sampled GRPO (one group of G per step, the threshold experiment's sampled cells): of the runs collapsed at
    the horizon H = config.sampled_steps (J < 1e-3 over its last quarter), how many are back at J >= 1e-3 at some
    state up to factor x H, and how many are not collapsed by the same rule at factor x H."""
    H = config.sampled_steps
    E, S = np.meshgrid(np.asarray(config.sampled_etas, float), np.arange(config.n_seeds), indexing="ij")
    n_col = n_back = n_not_col = 0
    for inst in instances:
        bandit = mech.instance_bandit(inst, n_arms=config.n_arms, dim=config.dim, n_correct=config.n_correct)
        dyn = Dynamics(method="grpo", gradient="sampled", group_size=config.group_size, steps=factor * H,
                       record_every=1)
        tr = simulate(bandit, dyn, eta=E.ravel(), seed=S.ravel())
        J = np.clip(np.concatenate([tr.J[:, :, 0], tr.J_final[:, :1]], axis=1), 0.0, 1.0)
        at_H = gapdyn.is_collapsed(gapdyn.RunStats.from_trajectory(J[:, : H + 1]))
        at_end = gapdyn.is_collapsed(gapdyn.RunStats.from_trajectory(J))
        back = (J[:, H + 1:] >= gapdyn.COLLAPSE_J).any(axis=1)
        n_col += int(at_H.sum())
        n_back += int((at_H & back).sum())
        n_not_col += int((at_H & ~at_end).sum())
    return {"runs": int(E.size * len(instances)), "collapsed_at_H": n_col, "back_above_later": n_back,
            "not_collapsed_at_end": n_not_col, "H": H, "end": factor * H}


def spreads(df: pd.DataFrame) -> pd.DataFrame:
    """Per (instance, method, quantity): spread over offsets (max / min - 1, worst horizon) and the change
    from H to 2H and to 4H (|q(hH) / q(H) - 1|, worst offset)."""
    out = []
    for (inst, meth), g in df.groupby(["instance", "method"]):
        for q in QUANTITIES:
            piv = g.pivot(index="offset", columns="horizon", values=q)
            hs = sorted(piv.columns)
            vals = piv.to_numpy(float)
            fin = np.isfinite(vals)
            row = {"instance": inst, "method": meth, "quantity": q, "n_finite": int(fin.sum()),
                   "median_H": float(np.nanmedian(vals[:, 0])) if fin[:, 0].any() else math.nan}
            if fin.all():
                row["offset_spread"] = float(np.max(vals.max(axis=0) / vals.min(axis=0) - 1))
                row["H_to_2H"] = float(np.max(np.abs(vals[:, 1] / vals[:, 0] - 1)))
                row["H_to_4H"] = float(np.max(np.abs(vals[:, 2] / vals[:, 0] - 1)))
            else:
                row.update(offset_spread=math.nan, H_to_2H=math.nan, H_to_4H=math.nan)
            out.append(row)
    return pd.DataFrame(out)


@dataclass
class ReproducibilityArgs:
    """Spread of the collapse-threshold quantities over grid offsets and horizons (docs/evidence.md, section 6)."""

    instances: tuple[int, ...] = (7001, 7002, 7003)
    """make_bandit seeds, outside the project's blocks (0-19, 1000-1099)."""
    methods: tuple[str, ...] = ("grpo", "reinforce")
    """Methods searched on each instance."""
    offsets: int = 4
    """Grid offsets (fractions of one base-grid step)."""
    horizon: int = Config().steps
    """H; each search also runs 2H and 4H."""
    sampled_only: bool = False
    """Only the sampled check: collapsed runs of sampled GRPO at H, back above 1e-3 by 4H?"""
    out: Annotated[str | None, optional("FILE")] = None
    """CSV of every search (one row per instance, method, offset, horizon)."""


def main(argv=None) -> int:
    """``python -m benchmarks.threshold_reproducibility [--instances ...] [--out FILE]``."""
    return _main(sys.argv[1:] if argv is None else argv)


@command("python -m benchmarks.threshold_reproducibility")
def _main(argv: list[str]) -> int:
    a = parse(ReproducibilityArgs, argv, prog="python -m benchmarks.threshold_reproducibility")
    a.instances, a.methods = list(a.instances), list(a.methods)
    if a.offsets < 1 or a.horizon < 4 or any(i in range(0, 20) or i in range(1000, 1100) for i in a.instances):
        raise ValueError("need --offsets >= 1, --horizon >= 4 and --instances outside the project's blocks "
                         "(0-19, 1000-1099)")
    config = Config()
    if a.sampled_only:
        t0 = time.perf_counter()
        r = sampled_absorption(a.instances, config=config)
        print(f"sampled GRPO, G = {config.group_size}, {config.n_seeds} seeds x {len(config.sampled_etas)} etas in "
              f"[{min(config.sampled_etas):g}, {max(config.sampled_etas):g}], instances {a.instances}: {r['runs']} runs; "
              f"{r['collapsed_at_H']} collapsed at H = {r['H']}; of these {r['back_above_later']} back at J >= 1e-3 "
              f"at some state up to {r['end']}, {r['not_collapsed_at_end']} not collapsed at {r['end']} "
              f"({time.perf_counter() - t0:.0f} s)")
        return 0
    b0 = mech.instance_bandit(a.instances[0])
    print(f"prefix check (direct H-step run vs state H of the 4H run): max |dJ| = "
          f"{check_prefix(b0, a.methods[0], a.horizon, np.geomspace(1.0, 300.0, 16)):.3g}", flush=True)
    rows, curves = [], []
    t0 = time.perf_counter()
    for inst in a.instances:
        for m in a.methods:
            t = time.perf_counter()
            got = measure(inst, m, offsets=a.offsets, horizon=a.horizon, config=config)
            rows += got
            print(f"instance {inst} {m}: {got[-1]['simulated']} runs of {4 * a.horizon} steps, "
                  f"{time.perf_counter() - t:.0f} s", flush=True)
            if a.out:
                pd.DataFrame(rows).to_csv(a.out, index=False)
            first = [r["eta_star"] for r in got if r["horizon"] == a.horizon and np.isfinite(r["eta_star"])]
            if first:
                c = excursion_curve(inst, m, float(np.median(first)), horizon=a.horizon, config=config)
                curves.append(c)
                print(f"  excursion over {c['steps']} steps on eta in [{c['etas'][0]:.4g}, {c['etas'][-1]:.4g}]: "
                      f"L = {c['L']}; slope of log L on log 1/J_min {c['slope_L_on_invJmin']:.3f}; every run still "
                      f"below 1e-3 at the end from eta = {c['eta_all_censored']:.4g} "
                      f"({c['eta_all_censored_over_eta_star_H']:.3f} x the first collapsed eta at H)", flush=True)
    df = pd.DataFrame(rows)
    print(f"total {time.perf_counter() - t0:.0f} s")
    cols = ["instance", "method", "offset", "horizon", "status", "eta_star", "eta_safe", "safe_resolution", "eta_50",
            "eta_dip", "n_islands", "reconverge_share"]
    print(df[cols].to_string(index=False, float_format=lambda x: f"{x:.5g}"))
    exc = df[df["horizon"] == a.horizon].dropna(subset=["exc_back"]) if "exc_back" in df else df.iloc[:0]
    if len(exc):
        print("\nexcursion below 1e-3 at the first collapsed eta of horizon H (from the 4H run):")
        print(exc[["instance", "method", "offset", "eta_star", "exc_start", "exc_back", "exc_longest", "exc_censored",
                   "J_at_2H", "J_at_4H"]].to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    sp = spreads(df)
    print("\nspread over offsets (max/min - 1, worst horizon) and change with the horizon (worst offset):")
    print(sp.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    print("\nper quantity, worst over (instance, method) [median]:")
    for q, g in sp.groupby("quantity", sort=False):
        print(f"  {q:9s} offset spread {g['offset_spread'].max():.4g} [{g['offset_spread'].median():.4g}]  "
              f"H->2H {g['H_to_2H'].max():.4g} [{g['H_to_2H'].median():.4g}]  "
              f"H->4H {g['H_to_4H'].max():.4g} [{g['H_to_4H'].median():.4g}]  finite {int(g['n_finite'].sum())}")
    if curves:
        print("\nexcursion curves (exact dynamics): slope of log L on log 1/J_min, eta from which every run is still "
              "below 1e-3 after 16 H (/ first collapsed eta at H):")
        for c in curves:
            print(f"  {c['instance']} {c['method']}: slope {c['slope_L_on_invJmin']:.3f}, "
                  f"{c['eta_all_censored']:.5g} ({c['eta_all_censored_over_eta_star_H']:.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
