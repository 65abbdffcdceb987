"""``gapdyn reproduce``: the one-command quick reproduction on a CPU.

    gapdyn reproduce              quick mode: every bandit experiment, the tiny-Qwen demo, all figures,
                                  ./gapdyn_out/reproduce/REPORT.md (or --out DIR)
    gapdyn reproduce --tiny       the smallest sizes (what the test suite runs)
    gapdyn reproduce --mode full  paper-scale sweeps (long; resumable through the sweep store)

Steps: (1) run each bandit experiment (``bandits.experiments.<name>.run``; cells already in the
sweep store are loaded, not recomputed), (2) the tiny-Qwen GRPO-vs-WAPO runs (``llm_probe``; on 2+ cores
in a second process started before (1), so that torch runs there while numba compiles and runs here),
(3) all figures (PNG + PDF), (4) ``REPORT.md`` rendering the claims of this run (every experiment's
``analyse`` and the tiny-Qwen claims; :mod:`paper_figs.report`), plus ``results/claims.json`` and
``results/claims.csv``. A missing data source is reported as "not available yet", never faked.
Exit codes: 0 everything produced, 3 some part not available, 1 an error.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

from tqdm.auto import tqdm

from . import report
from gapdyn.evidence.claims import listing
from gapdyn.cmdline import check_jobs, command, one_blas_thread, output_dir, parse, say
from gapdyn.io import atomic_write_text

from .cli import FIGURES, RunArgs, figure_module, make_figures, resolve_store
from .stage_eta import QUICK_STAGE_S, SERIAL_LLM_S, StageETA

__all__ = ["EXPERIMENT_ORDER", "reproduce", "main"]

EXPERIMENT_ORDER = ("threshold", "length", "success_rate", "stagnation", "logistic", "methods", "taxonomy")


def _experiment_names() -> tuple[str, ...]:
    """Every registered study (gapdyn.evidence.experiment.registry), EXPERIMENT_ORDER first."""
    from gapdyn.evidence.experiment import registry

    names = tuple(registry())
    return tuple(n for n in EXPERIMENT_ORDER if n in names) + tuple(n for n in names if n not in EXPERIMENT_ORDER)


def _runs_here(name: str) -> bool:
    """Whether the reproduction runs this study (the bandit experiments); the others have their own command."""
    try:
        from bandits.experiments import EXPERIMENTS
    except ImportError:
        return False
    return name in EXPERIMENTS


def reproduce(*, mode: str = "quick", out_dir=None, store=None, seed=None, n_jobs: int = 1, progress: bool = True,
              log=print, llm_beside: bool | None = None) -> dict:
    """Run everything and write the figures, ``REPORT.md`` and ``results/`` into ``out_dir`` (default
    ``./gapdyn_out/reproduce``); the sweep store is ``store`` or :func:`paper_figs.cli.resolve_store`'s default.
    ``llm_beside``: run the tiny-Qwen demo in a second process beside the bandit experiments
    (:meth:`paper_figs.data.Sources.start_llm`); None = when the machine has 2 or more cores.

    Returns a dict with keys report (path), figures (name -> paths or reason), claims (every gapdyn.Claim
    of the run), unavailable (name -> reason), seconds.
    """
    from .data import NotAvailable, SourceFailed, Sources  # pandas: here, so --help and bad arguments load none

    t0 = time.perf_counter()
    out = output_dir("reproduce", out_dir, announce=False)
    out.mkdir(parents=True, exist_ok=True)
    store = resolve_store(store, out_dir)
    sources = Sources(mode, store=store, n_jobs=n_jobs, seed=seed, progress=False)
    sources.llm_progress = progress  # the longest stage: show the demo's "demo runs" bar below ours
    if llm_beside is None:
        llm_beside = (os.cpu_count() or 1) >= 2
    if llm_beside:  # torch in one thread there while numba compiles and runs here (BENCHMARKS.md)
        sources.start_llm()
    experiments = _experiment_names()
    stages = [("experiment", n) for n in experiments] + [("llm", "llm_probe")] + [("figure", f) for f in FIGURES]
    unavailable: dict[str, str] = {}
    elsewhere: dict[str, str] = {}  # registered studies this run does not run -> their command
    claims: list = []
    figures: dict[str, object] = {}
    timed = {**QUICK_STAGE_S, **({} if llm_beside else {("llm", "llm_probe"): SERIAL_LLM_S})}
    clock = StageETA([s for s in stages if s[0] != "experiment" or _runs_here(s[1])],
                     timed if mode == "quick" else None)
    # counts, elapsed and a stage-aware time left (paper_figs.stage_eta), not tqdm's mean-rate extrapolation
    bar = tqdm(stages, desc="gapdyn reproduce", unit="stage", disable=not progress, file=sys.stderr,
               bar_format="{desc}: {n_fmt}/{total_fmt} stages done [{elapsed}]{postfix}")
    with one_blas_thread():  # the stages are serial and their matrices small
        prev = None  # (stage, its start)
        for kind, name in bar:
            now = time.perf_counter()
            if prev is not None:
                clock.done(prev[0], now - prev[1])
            prev = ((kind, name), now)
            bar.set_postfix_str(f"now {kind} {name}; {clock.text()}")
            if kind == "experiment" and not _runs_here(name):  # a study with its own command: not a failure
                from gapdyn.evidence.experiment import registry

                elsewhere[name] = registry()[name].load().command
            elif kind == "experiment":
                try:
                    claims += sources.claims(name)
                except SourceFailed as exc:
                    unavailable[f"experiment {name}"] = f"error: {exc}"
                except NotAvailable as exc:
                    unavailable[f"experiment {name}"] = f"not available yet: {exc}"
            elif kind == "llm":
                try:
                    claims += sources.claims("llm")
                except SourceFailed as exc:
                    unavailable["llm_probe demo"] = f"error: {exc}"
                except NotAvailable as exc:
                    unavailable["llm_probe demo"] = f"not available yet: {exc}"
            else:
                made = make_figures(sources, [name], out_dir=out, log=lambda s: None)
                figures.update(made)
                if isinstance(made[name], str):
                    unavailable[f"figure {name}"] = made[name]
    bar.close()

    report.write_results(out / "results", claims)
    seconds = time.perf_counter() - t0
    text = report.render_report(
        mode=mode, seconds=seconds, seed=seed, claims=claims, figures=figures,
        captions={n: figure_module(n).CAPTION for n in FIGURES}, unavailable=unavailable,
    )
    path = out / "REPORT.md"
    atomic_write_text(path, text)
    conf = any(c.block == "confirmation" for c in claims)  # the counted rows of REPORT.md (gapdyn.evidence.claims.listing)
    shown = [c for c in report.decided_claims(claims) if listing(c, confirmation_only=conf) == "counted"]
    held = sum(c.verdict == "holds" for c in shown)
    log(f"{len([f for f in figures.values() if not isinstance(f, str)])}/{len(FIGURES)} figures, "
        f"{held}/{len(shown)} claims hold, {seconds:.0f} s")
    for k, v in unavailable.items():
        log(f"{k}: {v.splitlines()[0]}")
    for k, v in elsewhere.items():
        log(f"study {k}: not part of this run (`{v}` runs it)")
    log(f"figures: {out}/fig*.png|pdf")
    log(f"report:  {path}")
    log(f"claims:  {out / 'results' / 'claims.json'}")
    return {"report": path, "figures": figures, "claims": claims,
            "unavailable": unavailable, "seconds": seconds}


@dataclass
class ReproduceConfig(RunArgs):
    """Quick CPU reproduction: every bandit experiment, the tiny-Qwen runs, all figures and REPORT.md."""

    tiny: bool = False
    """Same as --mode test."""
    llm_beside: bool = True
    """Run the tiny-Qwen demo in a second process beside the bandit experiments (on 2+ cores);
    --no-llm-beside runs every stage in this process, one after another."""


@command("gapdyn reproduce")
def main(argv: list[str]) -> int:
    args = parse(ReproduceConfig, argv, prog="gapdyn reproduce")
    check_jobs(args.jobs)
    out = output_dir("reproduce", args.out)
    store = resolve_store(args.store, args.out)
    say("reproduce", f"sweep store {store.resolve()}")
    mode = "test" if args.tiny else args.mode
    if mode == "quick":  # said up front: how long, and what it decides
        say("reproduce", f"quick mode: about {sum(QUICK_STAGE_S.values()) / 60:.0f} min of stages on a quiet 2-core "
                         "machine with numba's first compile (measured per stage, paper_figs/stage_eta.py; less with "
                         "the kernels cached, longer under load, the bar shows the "
                         "time left at this run's pace); it redraws the 7 figures and re-decides every claim at quick "
                         "sizes, where most rows end 'not measured' (too few instances): the verdicts of record are "
                         "the full runs under docs/verdicts")
    res = reproduce(mode=mode, out_dir=out, store=store, seed=args.seed,
                    n_jobs=args.jobs, progress=args.progress, log=lambda text: say("reproduce", text),
                    llm_beside=None if args.llm_beside else False)
    if any(isinstance(v, str) and v.startswith("error") for v in [*res["figures"].values(), *res["unavailable"].values()]):
        return 1
    return 3 if res["unavailable"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
