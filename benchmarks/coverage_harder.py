"""Coverage of the mean claims' interval on DGPs harder than the validity rule's (gapdyn.evidence.coverage.HARDER_MEAN_DGPS).

The rule (docs/coverage.md, gapdyn.evidence.coverage.valid_at) calls a method valid at n when its worst coverage over
DGPS[kind] is >= 0.93; the mean DGPs there are normal, lognormal (sigma 1) and correlated. This measures the
same 95 % intervals, with the same simulation (gapdyn.evidence.coverage.coverage_table's per-rep loop, common random
numbers across methods), on a bounded skewed share, a bimodal mixture of shares and rare +-0.8 swings, at the n
the claims use. Output: one row per (method, dgp, n) with coverage and its Monte Carlo SE.

    PYTHONPATH=. OMP_NUM_THREADS=1 python -m benchmarks.coverage_harder --ns 40 60 --reps 2000 --out rows.csv
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from typing import Annotated

import numpy as np
import pandas as pd

from gapdyn.evidence import coverage as cov
from gapdyn.cmdline import command, optional, parse


def harder_coverage(methods, ns, *, reps: int, n_resamples: int, seed: int, dgps=cov.HARDER_MEAN_DGPS) -> pd.DataFrame:
    """Coverage of each mean method on each DGP at each n: the share of reps whose two-sided interval (upper
    limit for an upper method) covers the DGP's true mean; one data set per (dgp, n, rep), shared by the methods.
    """
    ms = [cov.COVERAGE_METHODS[m] for m in methods]
    if any(m.kind != "mean" for m in ms):
        raise ValueError(f"methods must be mean intervals, got {[m.name for m in ms if m.kind != 'mean']}")
    rng = np.random.default_rng(seed)
    rows = []
    for dgp in dgps:
        for n in ns:
            values, clusters, truth = cov.draw_means(dgp, int(n), int(reps), rng)
            for m in ms:
                hit = np.empty(reps)
                for r in range(reps):
                    e = m.interval(values[r], clusters, rng, n_resamples)
                    hit[r] = (e.lo <= truth <= e.hi) if m.bound == "two-sided" else truth <= e.hi
                c = float(hit.mean())
                rows.append({"method": m.name, "dgp": dgp, "n": int(n), "coverage": c,
                             "mc_se": math.sqrt(c * (1 - c) / reps), "reps": int(reps), "n_resamples": n_resamples,
                             "seed": seed})
    return pd.DataFrame(rows)


@dataclass
class HarderArgs:
    """Coverage of mean intervals on harder DGPs (gapdyn.evidence.coverage.HARDER_MEAN_DGPS)."""

    methods: tuple[str, ...] = ("studentized_cluster_mean", "t_cluster_means")
    """Mean interval methods of gapdyn.evidence.coverage.COVERAGE_METHODS (the first: every mean claim's interval)."""
    ns: tuple[int, ...] = (40, 60)
    """Clusters (instances) per data set."""
    reps: int = 2000
    """Data sets per (dgp, n)."""
    n_resamples: int = 999
    """Bootstrap draws per interval."""
    seed: int = 0
    out: Annotated[str | None, optional("FILE")] = None
    """CSV of the rows."""


def main(argv=None) -> int:
    """``python -m benchmarks.coverage_harder [--ns 40 60] [--reps 2000] [--out FILE]``."""
    return _main(sys.argv[1:] if argv is None else argv)


@command("python -m benchmarks.coverage_harder")
def _main(argv: list[str]) -> int:
    a = parse(HarderArgs, argv, prog="python -m benchmarks.coverage_harder")
    if a.reps < 1 or not a.ns or min(a.ns) < 3:
        raise ValueError("need --reps >= 1 and every --ns >= 3")
    t0 = time.perf_counter()
    df = harder_coverage(list(a.methods), list(a.ns), reps=a.reps, n_resamples=a.n_resamples, seed=a.seed)
    print(df.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    print(f"({time.perf_counter() - t0:.0f} s)")
    if a.out:
        df.to_csv(a.out, index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
