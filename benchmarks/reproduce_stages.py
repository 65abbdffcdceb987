"""``python -m benchmarks.reproduce_stages [gapdyn reproduce options]``: where ``gapdyn reproduce``'s time goes.

Runs :func:`paper_figs.reproduce.main` in this process with ``Sources.claims`` (each bandit experiment and the
tiny-Qwen demo) and ``make_figures`` (each figure) wrapped by a timer, and prints one line per stage to stderr:
CPU seconds (user + system of this process and its children, ``resource.getrusage``), wall seconds and the
1-minute load average at its end; then the total. For a cold measurement run it from an empty folder with
``NUMBA_CACHE_DIR`` pointed at an empty folder (numba's first compile and the tiny-Qwen warm-up included).
"""

from __future__ import annotations

import os
import resource
import sys
import time


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and its waited-for children."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main(argv: list[str] | None = None) -> int:
    c_start, w_start = cpu_seconds(), time.time()
    import paper_figs.reproduce as reproduce
    from paper_figs.data import Sources

    claims, figures = Sources.claims, reproduce.make_figures

    def report(label: str, c0: float, w0: float) -> None:
        print(f"stage {label:18s} cpu {cpu_seconds() - c0:7.1f} s  wall {time.time() - w0:7.1f} s  "
              f"load {os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)

    def timed_claims(self, name):
        c0, w0 = cpu_seconds(), time.time()
        try:
            return claims(self, name)
        finally:
            report(name, c0, w0)

    def timed_figures(sources, names, **kwargs):
        c0, w0 = cpu_seconds(), time.time()
        try:
            return figures(sources, names, **kwargs)
        finally:
            report(",".join(names), c0, w0)

    Sources.claims, reproduce.make_figures = timed_claims, timed_figures
    try:
        rc = reproduce.main(["--no-progress"] if argv is None else argv)
    finally:
        Sources.claims, reproduce.make_figures = claims, figures
    print(f"total cpu {cpu_seconds() - c_start:.1f} s  wall {time.time() - w_start:.1f} s  "
          f"load {' '.join(f'{x:.1f}' for x in os.getloadavg())}  exit {rc}", file=sys.stderr, flush=True)
    return rc


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:] or None))
