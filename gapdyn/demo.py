"""``gapdyn demo``: the gap, the step-size thresholds and the critical step on a 100-arm log-linear bandit.

Prints J, Phi, the Gap, each method's expected scalar, the step-size thresholds at the start and
what exact log-odds ascent does just below and just above the measured critical step. Its time per instance is
measured, not stated here: docs/quickstart.md ("Measured", by ``python -m benchmarks.documented_times``).

The instances run in a plain loop, not as folder cells of gapdyn.evidence.runner.run_cells: the demo's one
output is demo.json (a folder, a lock and a result file per instance would add to it), and an instance takes
seconds, so resuming one buys nothing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Annotated

import numpy as np

from ._validate import check_seed
from .cmdline import command, optional, output_dir, parse, say
from .io import output_folder
from .io import atomic_write_json, check_output_path


def ascent_run_stats(phi, r, etas, steps=200) -> RunStats:
    """Exact unit-norm log-odds ascent theta <- theta + eta gap/||gap|| from theta0 = 0, for every eta at once;
    returns the run statistics that decide each run's outcome over the horizon (gapdyn.RunStats). A run
    stops once its correct arms dominate by e^40, or its best wrong arm by e^700, as J no longer moves in
    float64; its later states repeat its last J."""
    from . import RunStats, gradient_gap_from_logits, loglinear_probs, success_rate

    etas = np.asarray(etas, dtype=float).reshape(-1)
    th = np.zeros((etas.size, phi.shape[1]))
    live = np.ones(etas.size, dtype=bool)
    J = np.empty((etas.size, steps + 1))
    for k in range(steps + 1):
        z = th @ phi.T  # [E, K]
        J[:, k] = success_rate(loglinear_probs(phi, th), r)
        zc, zw = z[:, r == 1], z[:, r == 0]
        live &= ~((zc - zw.max(axis=1, keepdims=True) > 40).all(axis=1) | (zw.max(axis=1) - zc.max(axis=1) > 700))
        if not live.any():
            J[:, k + 1:] = J[:, k:k + 1]
            break
        zl = z[live]
        gap = gradient_gap_from_logits(zl, r, np.broadcast_to(phi, zl.shape + phi.shape[-1:]))
        th[live] += etas[live, None] * gap / np.linalg.norm(gap, axis=1, keepdims=True)
    return RunStats.from_trajectory(np.clip(J, 0.0, 1.0))


def critical_eta(phi, r, lo=1e-2, hi=1e5, steps=200, islands=False) -> float:
    """eta* of exact unit gap ascent by the project's one estimator (gapdyn.find_eta_star: the first eta
    whose run ends collapsed, J < COLLAPSE_J over the last quarter of the horizon) on a 5 % grid, the first
    collapsing bracket refined to 0.1 %. islands=True adds the estimator's island scan (everything below the
    first collapse rescanned at 0.1 % for narrower islands of collapse): every eta below eta* at 0.1 % spacing
    instead of 5 % (97 % of the demo's time when it was the default); without it an island narrower than 5 % below
    eta* can be missed."""
    from . import find_eta_star

    res = find_eta_star(lambda etas: ascent_run_stats(phi, r, etas, steps), lo, hi, max_ratio=1.05,
                        island_scan=bool(islands))
    return float(res.eta_star) if res.status == "found" else float("inf")


@dataclass
class DemoConfig:
    """The theory on random 100-arm log-linear bandits: J, Phi, the gap, step-size thresholds, collapse."""

    seeds: int = 20
    """Instances to scan for a finite critical eta."""
    seed: int = 0
    """Seed of the first instance (instances use seed, seed + 1, ...)."""
    arms: int = 100
    """Arms of each instance."""
    dim: int = 16
    """Feature dimension d."""
    correct: int = 10
    """Correct arms (reward 1) per instance."""
    out: Annotated[str | None, optional("DIR", "./gapdyn_out/demo")] = None
    """Folder for demo.json."""
    islands: bool = False
    """Also rescan every step size below the first collapse at 0.1 % spacing for narrower islands of collapse
    (gapdyn.find_eta_star's full estimator; far slower)."""
    progress: bool = True
    """Show a progress bar over the instances."""

    def __post_init__(self):
        for name, value, low in (("seeds", self.seeds, 1), ("arms", self.arms, 2), ("dim", self.dim, 1)):
            if value < low:
                raise ValueError(f"--{name} must be >= {low}, got {value}")
        check_seed(self.seed, "--seed")
        check_seed(self.seed + self.seeds - 1, "--seed + --seeds - 1 (the last instance's seed)")
        if not 0 < self.correct < self.arms:
            raise ValueError(f"--correct must be in 1..arms-1 = 1..{self.arms - 1}, got {self.correct}")


@command("gapdyn demo")
def main(argv: list[str]) -> int:
    args = parse(DemoConfig, argv, prog="gapdyn demo")  # help and bad arguments before the theory's imports
    from . import (METHOD_NAMES, bandit_outcome, expected_scalar, gap_alignment, gradient_gap_from_logits,
                   local_step_threshold, log_odds_from_logits, loglinear_bound_constants, loglinear_logodds_fn,
                   loglinear_probs, loglinear_scores, logodds_hessian, sharp_step_threshold, success_rate,
                   theorem1_step_bound)

    out = output_dir("demo", args.out)
    check_output_path(out / "demo.json")  # refused before the work, not after
    with output_folder(out):  # a folder it cannot write is one line before the work (exit 1), none left behind
        pass
    print(f"{args.arms}-arm log-linear bandit, d = {args.dim}, {args.correct} correct arms, theta0 = 0\n")
    from tqdm.auto import tqdm

    found, record = 0, []
    for seed in tqdm(range(args.seed, args.seed + args.seeds), desc="instances", leave=False, disable=not args.progress):
        rng = np.random.default_rng(seed)
        phi = rng.normal(size=(args.arms, args.dim))
        r = np.zeros(args.arms)
        r[rng.choice(args.arms, args.correct, replace=False)] = 1.0
        th = np.zeros(args.dim)
        eta_c = critical_eta(phi, r, islands=args.islands)
        record.append({"seed": seed, "critical_eta": eta_c if np.isfinite(eta_c) else None})
        if seed == args.seed or (np.isfinite(eta_c) and found == 0):
            p, s = loglinear_probs(phi, th), loglinear_scores(phi, th)
            gap = gradient_gap_from_logits(phi @ th, r, phi)
            w = gap / np.linalg.norm(gap)
            dmu = float(gap_alignment(w, gap))
            J = float(success_rate(p, r))
            print(f"seed {seed}: J = {J:.4f}  Phi = {float(log_odds_from_logits(phi @ th, r)):+.4f}  ||gap|| = {np.linalg.norm(gap):.4f}")
            print("  expected direction E[w] = c * gap, G = 8:  " + "  ".join(
                f"{m} {float(expected_scalar(m, J, 8)):.4f}" for m in METHOD_NAMES))
            G_o, L_o = loglinear_bound_constants(phi)
            print(f"  thresholds for a unit gap step at theta0: sharp one-step {sharp_step_threshold(loglinear_logodds_fn(phi, r), th, w):.4g}"
                  f"  local {float(local_step_threshold(dmu, w, logodds_hessian(p, r, s))):.4g}"
                  f"  Theorem-1 bound {float(theorem1_step_bound(dmu, L_o=L_o, G_o=G_o)):.3g}")
            if np.isfinite(eta_c):
                below, above = (ascent_run_stats(phi, r, f * eta_c) for f in (0.999, 1.001))
                grid = ("0.1 % grid with islands" if args.islands else
                        "5 % grid, first collapse refined to 0.1 %; narrower islands below not searched: --islands")
                print(f"  measured critical eta (200 exact steps; the first eta whose run ends collapsed, {grid}): "
                      f"{eta_c:.4g};"
                      f" at 0.999 eta*: {bandit_outcome(below)[0]}, max J over the last quarter {below.J_tail_max[0]:.4f};"
                      f" at 1.001 eta*: {bandit_outcome(above)[0]}, max J over the last quarter {above.J_tail_max[0]:.2e}")
            else:
                print("  no finite critical eta up to 1e5: exact ascent converges for every step size tried")
        found += int(np.isfinite(eta_c))
    out.mkdir(parents=True, exist_ok=True)
    path = out / "demo.json"
    atomic_write_json(path, {"config": asdict(args), "instances": record}, indent=1)
    print(f"\ninstances with a finite critical eta: {found} of {args.seeds} "
          "(arXiv 2510.08539, Thm 2: a step above eta* collapses J; not every instance has a finite eta*)")
    say("demo", f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
