"""``gapdyn bandit``: list and run the bandit experiments.

    gapdyn bandit list
    gapdyn bandit run <experiment> [--mode test|quick|full] [--out DIR] [--jobs N] [--seeds S ... | --seed S]
                                   [--backend serial|joblib|ray] [--ray-address ADDR] [--no-progress] [--strict]

``run`` builds the experiment's config for the mode (``Config.test()`` when the module has one,
else its smallest, ``Config.quick()``), runs its sweep through :func:`gapdyn.evidence.sweep.run_sweep`
(resumable: rerunning the same command after an interruption computes only the missing cells),
prints its claims (estimate, 95 % interval, n, criterion, verdict; docs/evidence.md) and writes into
``<out>/<experiment>-<mode>/`` (default out: ``./gapdyn_out/bandit``): ``results.parquet`` (all rows),
``claims.json`` / ``claims.csv`` / ``claims.md``; the sweep's cells live in ``<out>/<experiment>-<mode>-<block>/``.
Full mode adds the confirmation block and a replication table. Exit code 0; with ``--strict``, 1 if a claim
does not hold; 2 for bad input, 1 for a failing write, 130 / 143 on SIGINT / SIGTERM (the sweep's workers
stopped, one line saying where the completed cells are and the command that resumes; gapdyn.cmdline).
``--seeds`` / ``--seed`` replace the instance seeds of the discovery block (each draws one bandit; the runs on it
keep their own stream seeds; gapdyn.evidence.experiment.INSTANCE_SEEDS) and the run writes into
``<out>/<experiment>-<mode>-seeds-<label>/`` (gapdyn.evidence.runner.seeds_label) instead.
Every output is written atomically and never through a symlink below ``<out>`` (gapdyn.io).
The experiment may be given by an unambiguous prefix (``succ`` for ``success_rate``).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import tyro

import gapdyn

from gapdyn.cmdline import (Mode, UsageError, check_jobs, command, did_you_mean, on_interrupt, optional, output_dir,
                            parse, one_blas_thread, resolve_name, say)
from gapdyn.io import atomic_write_text, check_output_path, make_folder, write_parquet, write_with

__all__ = ["main", "claims_report", "RunConfig", "experiment_config", "SUBCOMMANDS"]

SUBCOMMANDS = ("list", "run")
"""The subcommands of ``gapdyn bandit``."""

_USAGE = """usage: gapdyn bandit {list,run} ...

  list   the registered experiments with their descriptions
  run    run one experiment and print its claims (gapdyn bandit run --help)"""


@dataclass
class RunConfig:
    """Run one bandit experiment (resumable sweep) and print its claims with intervals and verdicts."""

    experiment: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="EXPERIMENT")]
    """Experiment name or an unambiguous prefix of it (see `gapdyn bandit list`)."""
    mode: Mode = "quick"
    """Sizes: test (smallest, seconds), quick (seconds to minutes), full (the real run)."""
    out: Annotated[str | None, optional("DIR")] = None
    """Result store; the run writes into <out>/<experiment>-<mode>/ (default ./gapdyn_out/bandit)."""
    jobs: int = 1
    """Workers (joblib) / CPUs (local ray); -1 = all cores."""
    seeds: Annotated[tuple[int, ...] | None, optional("INT [INT ...]")] = None
    """Instance seeds of the discovery block (each draws one bandit; None: the mode's own seeds)."""
    seed: Annotated[int | None, optional("INT")] = None
    """One instance seed (the same as --seeds S)."""
    progress: bool = True
    """Show the sweep's progress bar."""
    backend: Literal["serial", "joblib", "ray"] = "joblib"
    """Where the cells run."""
    ray_address: Annotated[str | None, optional("ADDRESS")] = None
    """Ray cluster address (default: $RAY_ADDRESS or a local cluster)."""
    strict: bool = False
    """Exit 1 if any claim does not hold."""


def experiment_config(module, mode: str, seeds: tuple[int, ...] | None = None):
    """The module's config for ``mode`` ("test" falls back to ``Config.quick()`` when there is no
    ``Config.test()``), on ``seeds`` when given (:func:`gapdyn.evidence.runner.with_seeds`: the experiment's instance seeds).
    Returns (config, note) where note says when a fallback was used."""
    from gapdyn.evidence.runner import with_seeds

    cls = module.Config
    note = ""
    if mode == "test" and not hasattr(cls, "test"):
        note = "has no test sizes; --mode test runs its smallest config, Config.quick()"
        mode = "quick"
    config = getattr(cls, mode)()
    return (config if seeds is None else with_seeds(module.EXPERIMENT, config, seeds)), note


def _source_doc(module: str) -> str:
    """The docstring of ``module`` read from its source (ast), without importing it: listing the experiments loads
    none of their dependencies (numba, pandas, scipy)."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec(module)  # imports the parent package only (bandits.experiments: light)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise ImportError(f"no source for module {module!r}")
    try:
        tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError) as exc:
        raise ImportError(f"cannot read {spec.origin}: {exc}") from exc
    return ast.get_docstring(tree, clean=False) or ""


def _description(doc: str) -> str:
    """The first paragraph of an experiment's docstring, as one line (spec-file pointers dropped)."""
    para = (doc or "").strip().split("\n\n")[0]
    text = " ".join(para.split())
    text = re.sub(r"[;,]?\s*\b[A-Z]+\.md\b[^;)]*", "", text)
    return re.sub(r"\s*\(\s*\)", "", text)


def _list() -> int:
    from .experiments import EXPERIMENTS

    width = max(60, min(shutil.get_terminal_size((100, 20)).columns, 120))
    for name, module in EXPERIMENTS.items():
        try:
            doc = _description(_source_doc(module))
        except ImportError as exc:
            doc = f"(cannot be imported: {exc})"
        print(name)
        print(textwrap.fill(doc, width=width, initial_indent="    ", subsequent_indent="    "))
    return 0


def _run(args: RunConfig, argv: list[str]) -> int:
    from .experiments import EXPERIMENTS, load

    name = resolve_name(args.experiment, EXPERIMENTS, "experiment")
    check_jobs(args.jobs)
    mod = load(name)
    from gapdyn.evidence.runner import resolve_seeds, seeds_label

    seeds = resolve_seeds(args.seeds, args.seed)
    config, note = experiment_config(mod, args.mode, seeds)
    store = output_dir("bandit", args.out)
    out = store / (f"{name}-{args.mode}" + ("" if seeds is None else f"-seeds-{seeds_label(seeds)}"))
    outputs = [out / n for n in ("results.parquet", "claims.json", "claims.csv", "claims.md")]
    for p in outputs:  # a planted symlink is refused before the sweep runs, not after
        check_output_path(p, root=store)
    if note:
        say("bandit", f"{name} {note}")
    if args.ray_address:  # read by run_sweep (the experiment contract has no ray_address argument)
        os.environ["RAY_ADDRESS"] = args.ray_address
    on_interrupt(f"the completed cells are kept under {store.resolve()}/{name}-{args.mode}-*; rerun the same "
                 f"command to resume: {shlex.join(['gapdyn', 'bandit', 'run', *argv])}")
    with one_blas_thread():
        res = mod.run(config, store=store, backend=args.backend, n_jobs=args.jobs, progress=args.progress)
    make_folder(out)  # a file in the way or a read-only file system: one line naming the folder (gapdyn.io)
    md = claims_report(res)
    write_parquet(outputs[0], res.results, root=store)
    atomic_write_text(outputs[1], gapdyn.claims_to_json(res.claims), root=store)
    table = gapdyn.claims_table(res.claims)
    write_with(outputs[2], lambda tmp: table.to_csv(tmp, index=False), root=store)
    atomic_write_text(outputs[3], f"# {name} ({args.mode})\n\n{md}", root=store)
    print(md, end="")
    shown = res.block("confirmation") or res.block("discovery")
    n = gapdyn.count_verdicts(shown)
    counted = len(shown) - n["identity"] - n["derived"]
    say("bandit", f"{name} ({args.mode}): {n['holds']}/{counted} claims hold, {n['does not hold']} do not, "
                  f"{n['inconclusive']} inconclusive; {n['identity']} identity and {n['derived']} derived rows "
                  "(shown, not counted); "
                  f"{len(res.results)} result rows; criteria hash {res.criteria_hash}")
    if res.plan is not None:
        say("bandit", f"{name}: {res.plan.note}")
    if seeds is not None:
        say("bandit", f"{name}: instance seeds {list(seeds)} (--seeds: {mod.EXPERIMENT.seed_meaning})")
    say("bandit", f"wrote {out}/ (results.parquet, claims.json, claims.csv, claims.md)")
    if args.strict and n["does not hold"]:
        return 1
    return 0


def claims_report(res) -> str:
    """Markdown of an ExperimentResult: the deciding block's claims (with estimate, interval, n, criterion,
    verdict), and the replication table when a confirmation block ran; quick/test verdicts are indicative."""
    conf = res.block("confirmation")
    parts = []
    if not conf:
        parts.append("Discovery block only: these verdicts are indicative (the confirmation block runs in "
                     "--mode full; docs/evidence.md).\n")
    parts.append(gapdyn.claims_markdown(conf or res.block("discovery")) + "\n")
    if conf:
        rep = res.replication
        parts.append("\nReplication (discovery vs confirmation; a disagreement is flagged, not hidden):\n\n")
        parts.append(gapdyn.markdown_table(rep, ["id", "discovery", "confirmation", "flag"]) + "\n")
    return "".join(parts)


@command("gapdyn bandit")
def main(argv: list[str]) -> int:
    """Entry point of ``gapdyn bandit``; returns the exit code."""
    if not argv:
        raise UsageError("a subcommand is required: list, run (see gapdyn bandit --help)")
    if argv[0] in ("-h", "--help"):
        print(_USAGE)
        return 0
    sub, rest = argv[0], argv[1:]
    if sub == "list":
        if rest and rest[0] in ("-h", "--help"):
            print("usage: gapdyn bandit list\n\nThe registered experiments with their descriptions.")
            return 0
        if rest:
            raise UsageError(f"`gapdyn bandit list` takes no arguments, got {rest}")
        return _list()
    if sub == "run":
        return _run(parse(RunConfig, rest, prog="gapdyn bandit run"), rest)
    near = did_you_mean(sub, SUBCOMMANDS).strip()
    raise UsageError(f"invalid choice {sub!r}: the subcommands are {', '.join(SUBCOMMANDS)}"
                     + (f"; {near}" if near else ""))


if __name__ == "__main__":
    raise SystemExit(main())
