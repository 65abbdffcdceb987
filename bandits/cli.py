"""``gapdyn bandit ...``: list and run the bandit experiments.

    gapdyn bandit list
    gapdyn bandit run <experiment> [--mode quick|full] [--store DIR] [--backend joblib|ray|serial]
                                   [--n-jobs N] [--ray-address ADDR] [--no-progress] [--strict]

``run`` builds ``Config.quick()`` / ``Config.full()`` of ``bandits.experiments.<experiment>``, runs
its sweep through :func:`bandits.sweep.run_sweep` (resumable: rerunning the same command after an
interruption computes only the missing cells), prints the verdict table and writes into
``<store>/<experiment>-<mode>/``: ``results.parquet`` (all rows), ``cells/`` (one parquet per
cell), ``verdict.csv`` and ``verdict.md``. Exit code 0; with ``--strict``, 1 if a claim does not hold.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pandas as pd

__all__ = ["main", "verdict_markdown"]


def _first_line(doc: str | None) -> str:
    return (doc or "").strip().splitlines()[0] if (doc or "").strip() else ""


def verdict_markdown(verdict: pd.DataFrame) -> str:
    """A GitHub-markdown table of a verdict DataFrame (no tabulate dependency)."""
    cols = [str(c) for c in verdict.columns]

    def cell(v) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in verdict.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def _holds(value) -> bool:
    if isinstance(value, str):
        return value.startswith("holds")
    return bool(value)


def _parser() -> argparse.ArgumentParser:
    from .sweep import BACKENDS

    p = argparse.ArgumentParser(prog="gapdyn bandit", description="Bandit sweeps and experiments.")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list the registered experiments")
    r = sub.add_parser("run", help="run one experiment and print its verdict table")
    r.add_argument("experiment", help="registry name (see `gapdyn bandit list`)")
    r.add_argument("--mode", choices=("quick", "full"), default="quick", help="quick = seconds, full = the real run")
    r.add_argument("--store", default="bandit_results", help="result store directory (default: ./bandit_results)")
    r.add_argument("--backend", choices=BACKENDS, default="joblib", help="where cells run (default: joblib)")
    r.add_argument("--n-jobs", type=_n_jobs, default=-1, help="workers (joblib) / CPUs (local ray); -1 = all cores")
    r.add_argument("--ray-address", default=None, help="Ray cluster address (default: $RAY_ADDRESS or local)")
    r.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    r.add_argument("--strict", action="store_true", help="exit 1 if any claim does not hold")
    return p


def _n_jobs(text: str) -> int:
    """argparse type for --n-jobs: a positive integer or -1 (all cores)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if value == 0 or value < -1:
        raise argparse.ArgumentTypeError(f"must be a positive integer or -1 (all cores), got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``gapdyn bandit``; returns the exit code."""
    from .experiments import EXPERIMENTS, load

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits on --help / errors; turn it into a return code
        return int(exc.code or 0)

    if args.command == "list":
        for name in EXPERIMENTS:
            try:
                doc = _first_line(load(name).__doc__)
            except ImportError:
                doc = "(not available yet)"
            print(f"{name:<14} {doc}")
        return 0

    if args.experiment not in EXPERIMENTS:
        print(f"gapdyn bandit: unknown experiment {args.experiment!r}; choose from {sorted(EXPERIMENTS)}", file=sys.stderr)
        return 2
    try:
        mod = load(args.experiment)
    except ImportError as exc:
        print(f"gapdyn bandit: experiment {args.experiment!r} cannot be imported ({exc})", file=sys.stderr)
        return 2
    config = mod.Config.quick() if args.mode == "quick" else mod.Config.full()
    store = Path(args.store)
    kwargs = dict(store=store, backend=args.backend, n_jobs=args.n_jobs, progress=not args.no_progress)
    if args.ray_address:  # read by run_sweep (the experiment contract has no ray_address argument)
        os.environ["RAY_ADDRESS"] = args.ray_address
    results, verdict = mod.run(config, **kwargs)
    out = store / f"{args.experiment}-{args.mode}"
    out.mkdir(parents=True, exist_ok=True)
    if not (out / "results.parquet").exists():  # the experiment stored under another name
        results.to_parquet(out / "results.parquet", index=False)
    verdict.to_csv(out / "verdict.csv", index=False)
    md = verdict_markdown(verdict)
    (out / "verdict.md").write_text(f"# {args.experiment} ({args.mode})\n\n{md}")
    print(md, end="")
    print(f"\n{len(results)} result rows; written to {out}/ (results.parquet, verdict.csv, verdict.md)")
    if args.strict and "holds" in verdict.columns and not all(_holds(v) for v in verdict["holds"]):
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
