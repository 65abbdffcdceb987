"""Testbed studies: a grid of settings x seeds, each cell one run folder, resumable, and its dose-response table.

A study is a list of cells ``{"setting": {...TestbedSetting fields...}, "seed": s}``; a cell's folder is named by
its setting and seed (:func:`cell_name`) and counts as done when its summary.json exists, so an interrupted
study continues where it stopped (a torn run folder is rerun from its start). The table (:func:`dose_response`)
gives, per setting, the runs, the learned / collapsed counts with Wilson intervals (Wilson, 1927) and the mean
held-out accuracy before -> after.
"""

from __future__ import annotations

import itertools
import math
import json
import shutil
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Annotated, Literal

import tyro

from gapdyn.evidence.experiment import STREAM_SEEDS, Experiment

from .run import SUMMARY, TestbedSetting, read_head_log, run_testbed

__all__ = ["cell_name", "cell_folder_name", "run_cell", "cells", "analyse", "StudyConfig", "STUDIES",
           "study_cells", "EXPERIMENT", "grid", "run_study", "load_summaries", "dose_response", "PILOT_SEEDS", "ACCEPTANCE_SEEDS",
           "pilot_cells", "pilot_extension_cells", "pilot_short_cells", "pilot_edge_cells",
           "acceptance_cells", "export_study", "DOSE_SEEDS", "DOSE_HELDOUT_SEEDS", "DOSE_LRS", "dose_cells",
           "DOSE_CALIBRATION_SEEDS", "dose_heldout_cells", "SETTINGS_METHODS", "SETTINGS_SEEDS", "settings_grid",
           "settings_pilot_cells", "dose_settings_cells", "run_settings_study", "SAFE_STEP_SEEDS",
           "SAFE_STEP_LRS", "safe_step_cells"]

PILOT_SEEDS = tuple(range(900, 910))
"""Seeds of the pilot and of tuning: never in a confirmation block."""


def cell_name(setting: TestbedSetting, seed: int) -> str:
    """A folder name that fixes the cell: every field that differs from the default, then the seed."""
    base = TestbedSetting()
    parts = [f"{f.name}={getattr(setting, f.name)}" for f in fields(setting)
             if getattr(setting, f.name) != getattr(base, f.name) or f.name in ("method", "lr")]
    return "_".join(parts).replace("/", "-") + f"_seed={int(seed)}"


def grid(seeds, **axes) -> list[dict]:
    """Cells of the product of ``axes`` (TestbedSetting field -> values) x ``seeds``."""
    names = list(axes)
    out = []
    for values in itertools.product(*(axes[n] for n in names)):
        setting = TestbedSetting(**dict(zip(names, values)))
        out.extend({"setting": asdict(setting), "seed": int(s)} for s in seeds)
    return out


def run_study(cells: list[dict], root: str | Path, *, log=print, warm_dir=None) -> list[dict]:
    """Run every cell not done yet under ``root`` (in the order given); returns the summaries of the cells this
    call finished or found finished. Several processes may work on one study: each cell is claimed by an
    advisory lock (``<cell>.lock``, released by the OS however the process ends), a claimed cell is skipped
    (:func:`gapdyn.evidence.runner.run_cells`: a cell is done when its summary.json exists; a torn folder is rerun)."""
    from gapdyn.evidence.runner import run_cells

    return run_cells(cells, root, name=cell_folder_name, result_file=SUMMARY, describe=_describe, log=log,
                     run=lambda cell, d: run_cell(**cell, out=d, warm_dir=warm_dir))


def cell_folder_name(cell: dict) -> str:
    """:func:`cell_name` of a cell ``{"setting": {...}, "seed": s}`` (the setting checked on the way)."""
    return cell_name(TestbedSetting(**cell["setting"]), cell["seed"])


def run_cell(*, setting: dict, seed: int, out, warm_dir=None) -> dict:
    """One cell: :func:`~llm_probe.testbed.run.run_testbed` of the setting on ``seed`` into ``out``; its summary."""
    return run_testbed(TestbedSetting(**setting), seed, out, warm_dir=warm_dir)


def _describe(s: dict) -> str:
    return (f"{s['heldout_acc_before']:.3f} -> {s['heldout_acc_after']:.3f} ({s['outcome']}, {s['wall_s']:.0f} s, "
            f"{s['completion_tokens_median']:g} tokens)")


def load_summaries(root: str | Path) -> list[dict]:
    """Every finished run's summary under ``root``."""
    return [json.loads(p.read_text()) for p in sorted(Path(root).glob(f"*/{SUMMARY}"))]


def dose_response(summaries: list[dict]):
    """One row per setting: n, learned and collapsed counts with Wilson 95 % intervals, mean held-out accuracy
    before and after, median completion tokens (a pandas DataFrame, sorted by setting and lr)."""
    import pandas as pd

    from gapdyn.evidence.stats import wilson_interval

    rows = []
    for s in summaries:
        st = s["setting"]
        rows.append({**{k: st[k] for k in ("method", "length", "size", "control", "lr")}, "seed": s["seed"],
                     "outcome": s["outcome"], "before": s["heldout_acc_before"], "after": s["heldout_acc_after"],
                     "tokens": s["completion_tokens_median"]})
    if not rows:
        return pd.DataFrame()
    df = pd.DataFrame(rows)
    out = []
    for key, g in df.groupby(["method", "length", "size", "control", "lr"], sort=True):
        n = len(g)
        row = dict(zip(["method", "length", "size", "control", "lr"], key), n=n)
        for label in ("learned", "collapsed"):
            k = int((g["outcome"] == label).sum())
            ci = wilson_interval(k, n)
            row.update({label: k, f"P_{label}": k / n, f"P_{label}_lo": ci.lo, f"P_{label}_hi": ci.hi})
        row.update(degraded=int((g["outcome"] == "degraded").sum()), failed=int((g["outcome"] == "failed").sum()),
                   acc_before=g["before"].mean(), acc_after=g["after"].mean(), tokens=g["tokens"].median())
        out.append(row)
    return pd.DataFrame(out)


EXPORT_STATISTICS = ("frac_reward_zero_std", "grad_norm", "update_norm", "gap/headroom", "gap/headroom_lr",
                     "gap/dmu_update_mean", "gap/cos_update_mean", "gap/M_batch", "warn/curv_gap", "warn/cov_logp_adv")
"""The per-step statistics an exported record keeps besides reward, entropy, length and lr (the alarm's inputs;
gap/* only on probed steps), with the LM head's gradient and update norms of lm_head.jsonl."""


def export_study(root: str | Path, dest: str | Path, *, command: str = "", merge: bool = False) -> dict:
    """Write a study's committed record into ``dest``: runs.csv (one row per finished run: setting, seed, outcome,
    held-out accuracy before / after, greedy before / after, reward before, collapse step, median completion
    tokens, wall seconds, warm sha256), evaluations.csv (run, step, held-out accuracy), steps.csv (run, step,
    reward, entropy, mean completion length, lr and :data:`EXPORT_STATISTICS`) and run.json (command, runs, wall
    seconds, load). Returns run.json's dict.

    ``merge``: add this study's runs to the record already in ``dest`` (another block of the same study run on
    another machine): the existing lines are kept byte for byte except those of a run exported again, which are
    replaced; the three files' columns must agree; run.json lists each block."""
    import os

    import pandas as pd

    root, dest = Path(root), Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    runs, evals, steps = [], [], []
    for p in sorted(root.glob(f"*/{SUMMARY}")):
        s = json.loads(p.read_text())
        name = p.parent.name
        runs.append({"run": name, **{k: s["setting"][k] for k in ("method", "lr", "length", "size", "control",
                                                                   "steps", "lr_warmup_steps")},
                     "seed": s["seed"], "outcome": s["outcome"], "acc_before": s["heldout_acc_before"],
                     "acc_after": s["heldout_acc_after"], "greedy_before": s["heldout_greedy_before"],
                     "greedy_after": s["heldout_greedy_after"], "reward_before": s["reward_before"],
                     "collapse_step": s["outcome_detail"]["collapse_step"],
                     "tokens_median": s["completion_tokens_median"],
                     "tokens_median_before": s["completion_tokens_median_before"], "wall_s": round(s["wall_s"], 1),
                     "warm_sha256": s["warm_sha256"]})
        evals.extend({"run": name, "step": e["step"], "acc": e["acc"], "tokens_median": e["tokens_median"]}
                     for e in s["evaluations"])
        head = read_head_log(p.parent)
        for ln in (p.parent / "metrics.jsonl").read_text().splitlines():
            r = json.loads(ln)
            steps.append({"run": name, "step": r["step"], "reward": r.get("reward"), "entropy": r.get("entropy"),
                          "mean_length": r.get("completions/mean_length"), "lr": r.get("lr_step", r.get("lr")),
                          **{k: r.get(k) for k in EXPORT_STATISTICS}, **head.get(r["step"], {})})
    texts = {"runs.csv": pd.DataFrame(runs).to_csv(index=False),
             "evaluations.csv": pd.DataFrame(evals).to_csv(index=False),
             "steps.csv": pd.DataFrame(steps).to_csv(index=False, float_format="%.10g")}
    info = {"command": command, "runs": len(runs), "wall_s_sum": round(sum(r["wall_s"] for r in runs), 1),
            "load_average_at_export": os.getloadavg()[0]}
    if merge and (dest / "runs.csv").is_file():
        names = {r["run"] for r in runs}
        texts = {f: _merge_csv((dest / f).read_text(), t, names, dest / f) for f, t in texts.items()}
        old = json.loads((dest / "run.json").read_text())
        blocks = [b for b in old.get("blocks", [old]) if b.get("command") != command] + [info]
        info = {"blocks": blocks, "runs": texts["runs.csv"].count("\n") - 1}
    for f, t in texts.items():
        (dest / f).write_text(t)
    (dest / "run.json").write_text(json.dumps(info, indent=1))
    return info


def _merge_csv(old: str, new: str, replaced: set[str], path: Path) -> str:
    """``old``'s lines (header first) without the runs in ``replaced``, then ``new``'s data lines; the headers must
    agree. Each line starts with its run's folder name (no comma in it)."""
    (h_old, *rows_old), (h_new, *rows_new) = old.splitlines(), new.splitlines()
    if h_old != h_new:
        raise ValueError(f"{path}: its columns differ from this study's export; merge refused")
    kept = [r for r in rows_old if r.split(",", 1)[0] not in replaced]
    return "\n".join([h_old, *kept, *rows_new]) + "\n"


PILOT_LRS = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3)
"""The pilot's lr grid (Adam, GRPO, long scratchpad, small model): a decade and a half either side of the
feasibility check's learning lr 1e-4."""


def pilot_cells(seeds=PILOT_SEEDS[:2]) -> list[dict]:
    """The pilot, fixed before it ran: GRPO on the lr grid x 2 pilot seeds, and the random-advantage control at
    the two largest lrs (where collapse was expected); the order puts the cells that locate the regimes first
    (the feasibility check's learning lr 1e-4, then 1e-3 with its control)."""
    order = (1e-4, 1e-3, "control 1e-3", 3e-4, 3e-3, 3e-5, 1e-5, "control 3e-3")
    return [c for lr in order for c in (grid(seeds, lr=(float(lr.split()[1]),), control=(True,))
                                        if isinstance(lr, str) else grid(seeds, lr=(lr,)))]


def pilot_extension_cells(part: int = 1, seeds=PILOT_SEEDS[:2]) -> list[dict]:
    """Added after the pilot ran, on the same pilot seeds. Part 1 (after the 3e-4 cells split, one healthy, one
    collapsed): the random-advantage control at 3e-4, to tell an RL-specific collapse at the edge from optimiser
    damage. Part 2 (after that control collapsed on both seeds): the control at the learning lrs 3e-5 and 1e-4,
    to find where the control itself starts to collapse."""
    if part == 1:
        return grid(seeds, lr=(3e-4,), control=(True,))
    return grid(seeds, lr=(3e-5, 1e-4), control=(True,))


def pilot_short_cells(seeds=PILOT_SEEDS[:2]) -> list[dict]:
    """The length knob's pilot: the short scratchpad (23-token completions) at the long form's learning lr, its edge
    and its collapse lr, on the pilot seeds."""
    return grid(seeds, lr=(1e-4, 3e-4, 1e-3), length=("short",))


def pilot_edge_cells(seeds=PILOT_SEEDS[2:5]) -> list[dict]:
    """Locating the edge for the dose-response design (tuning seeds 902-904, never confirmation): GRPO, long
    scratchpad, lr between the learning 1e-4 and the collapse 1e-3."""
    return grid(seeds, lr=(1.5e-4, 2e-4, 3e-4, 4e-4, 6e-4))


ACCEPTANCE_SEEDS = tuple(range(2000, 2010))
"""Ten seeds never used before the acceptance measurement (pilot seeds: :data:`PILOT_SEEDS`)."""


def acceptance_cells(learn_lr: float, collapse_lr: float, seeds=ACCEPTANCE_SEEDS) -> list[dict]:
    """The acceptance measurement: the default setting at its documented learning lr and at its documented
    collapse lr, on :data:`ACCEPTANCE_SEEDS`."""
    return grid(seeds, lr=(learn_lr, collapse_lr))


DOSE_SEEDS = tuple(range(3000, 3040))
"""The dose-response study's calibration block (40 seeds): thresholds and predictor constants are fixed on it; the
held-out block (:data:`DOSE_HELDOUT_SEEDS`) never shares a seed with it."""
DOSE_HELDOUT_SEEDS = tuple(range(4000, 4040))
"""The held-out block, run only after the detectors' thresholds and the predictor's constants are fixed."""
DOSE_LRS = {"long": (1e-4, 2e-4, 2.5e-4, 3e-4, 3.5e-4, 4e-4, 5e-4),
            "short": (5e-5, 1e-4, 1.5e-4, 2e-4, 2.5e-4, 3e-4)}
"""Per scratchpad length, the lr grid (Adam, GRPO, small model), fixed from the pilots: each spans the learning lr
1e-4 and the lr where the pilot collapsed every run (long 4e-4, short 3e-4), densest where the pilots split."""
DOSE_PROBE_EVERY = 5
"""The dose-response runs probe every 5th step (gap, alignment, headroom; warn/* every step): the evidence of the
alarm, at a resolution finer than the evaluation cadence (10 steps) that bounds the lead time."""


def dose_cells(seeds=DOSE_SEEDS, *, methods=("grpo",), lengths=("long", "short"), control_seeds: int = 5) -> list[dict]:
    """The dose-response study (fixed before it ran): per seed, every method x length x lr of :data:`DOSE_LRS`,
    then the random-advantage control (optimiser damage without a learning signal) at 1e-4 and 3e-4 on the first
    ``control_seeds`` seeds. Seed-major order: a study stopped anywhere has about as many seeds at every lr."""
    cells = []
    for i, seed in enumerate(seeds):
        for method in methods:
            for length in lengths:
                cells += grid((seed,), method=(method,), length=(length,), lr=DOSE_LRS[length],
                              probe_every=(DOSE_PROBE_EVERY,))
        if i < control_seeds:
            cells += grid((seed,), lr=(1e-4, 3e-4), control=(True,), probe_every=(DOSE_PROBE_EVERY,))
    return cells


DOSE_CALIBRATION_SEEDS = (3000, 3001, 3002, 3003, 3036, 3037, 3038, 3039)
"""The calibration block as run: the first four and last four seeds of :data:`DOSE_SEEDS` (two workers took the
seed-major cells from both ends). Cut at 8 seeds (104 GRPO runs, 48-56 per setting) for cost, at the scale the
design planned from (about 40 calibration runs per setting), before the held-out block ran; not chosen from the
results."""
DOSE_HELDOUT_SHIFT = 1.1
"""The held-out block runs the long setting on the calibration grid times 1.1 (0.041 decade): lr10 is a property of
the run, not of the grid, only if a shifted grid reproduces it."""
DOSE_TRL_DEFAULT_LR = 1e-6
"""TRL's default GRPOConfig learning rate: the held-out block measures learning there (a baseline of the lr number)."""


def dose_heldout_cells(seeds=DOSE_HELDOUT_SEEDS[:8], *, control_seeds: int = 4, default_lr_seeds: int = 4) -> list[dict]:
    """The dose-response study's held-out block (fixed with the alarm's cutoffs and the predictor's rule before it
    ran): per seed, GRPO long on the calibration grid times :data:`DOSE_HELDOUT_SHIFT` (its lowest lr kept at
    1e-4, the predictor's probe lr, inside the learning regime either way) and GRPO short on the calibration grid; on the first ``default_lr_seeds`` seeds both lengths at TRL's default lr
    (:data:`DOSE_TRL_DEFAULT_LR`); on the first ``control_seeds`` the random-advantage control at 1e-4 and 3e-4.
    Seed-major, as :func:`dose_cells`."""
    cells = []
    long_lrs = (DOSE_LRS["long"][0],) + tuple(float(f"{lr * DOSE_HELDOUT_SHIFT:.4g}") for lr in DOSE_LRS["long"][1:])
    for i, seed in enumerate(seeds):
        cells += grid((seed,), method=("grpo",), length=("long",), lr=long_lrs, probe_every=(DOSE_PROBE_EVERY,))
        cells += grid((seed,), method=("grpo",), length=("short",), lr=DOSE_LRS["short"],
                      probe_every=(DOSE_PROBE_EVERY,))
        if i < default_lr_seeds:
            cells += grid((seed,), method=("grpo",), length=("long", "short"), lr=(DOSE_TRL_DEFAULT_LR,),
                          probe_every=(DOSE_PROBE_EVERY,))
        if i < control_seeds:
            cells += grid((seed,), lr=(1e-4, 3e-4), control=(True,), probe_every=(DOSE_PROBE_EVERY,))
    return cells


SETTINGS_METHODS = ("wapo", "dr_grpo")
"""The held-out settings of the lr number and the alarm: losses the calibration block never ran (WAPO's winners-only
loss, arXiv 2606.16154; Dr. GRPO's unnormalised advantages and sum / (G L) aggregation), long scratchpad, small
model."""
SETTINGS_PILOT_SEEDS = PILOT_SEEDS[:2]
"""The held-out settings' pilot (it places the grid): tuning seeds, never in a confirmation block."""
SETTINGS_PILOT_LRS = tuple(float(f"{1e-4 * 1.5 ** k:.3g}") for k in range(7))
"""The pilot's lr ladder: 1e-4 (the predictor's probe lr) to 1.14e-3 by factors of 1.5."""
SETTINGS_SEEDS = tuple(range(5000, 5006))
"""The held-out settings' runs: seeds no other block uses."""
SETTINGS_GRID_STEPS = 6
"""The grid below the pilot's top lr: lr_top / 1.25^k, k = 0..5 (a factor 3.05), plus the probe lr 1e-4."""


def settings_grid(pilot: list[dict], method: str) -> tuple[float, ...]:
    """The held-out grid of ``method`` from its pilot summaries, by a rule fixed before any pilot ran: lr_top = the
    smallest pilot lr at which every pilot seed's run ended collapsed (none: the pilot's largest lr x 1.5); the
    grid is lr_top / 1.25^k for k = 0..SETTINGS_GRID_STEPS - 1 (3 significant digits) and 1e-4, sorted."""
    runs = [s for s in pilot if s["setting"]["method"] == method and s["seed"] in SETTINGS_PILOT_SEEDS]
    top = None
    for lr in SETTINGS_PILOT_LRS:
        at = [s for s in runs if math.isclose(s["setting"]["lr"], lr, rel_tol=1e-9)]
        if len(at) < len(SETTINGS_PILOT_SEEDS):
            raise ValueError(f"the {method} pilot is not complete at lr {lr:g} ({len(at)} of "
                             f"{len(SETTINGS_PILOT_SEEDS)} runs): finish it before placing the grid")
        if top is None and all(s["outcome"] == "collapsed" for s in at):
            top = lr
    top = SETTINGS_PILOT_LRS[-1] * 1.5 if top is None else top
    lrs = {float(f"{top / 1.25 ** k:.3g}") for k in range(SETTINGS_GRID_STEPS)} | {DOSE_LRS["long"][0]}
    return tuple(sorted(lrs))


def settings_pilot_cells(seeds=SETTINGS_PILOT_SEEDS) -> list[dict]:
    """The held-out settings' pilot: every method of :data:`SETTINGS_METHODS` on :data:`SETTINGS_PILOT_LRS`."""
    return grid(tuple(seeds), method=SETTINGS_METHODS, length=("long",), lr=SETTINGS_PILOT_LRS,
                probe_every=(DOSE_PROBE_EVERY,))


def dose_settings_cells(grids: dict[str, tuple[float, ...]], seeds=SETTINGS_SEEDS) -> list[dict]:
    """The held-out settings' block: per seed (seed-major, as :func:`dose_cells`), each method on its grid
    (:func:`settings_grid`)."""
    cells = []
    for seed in seeds:
        for method in SETTINGS_METHODS:
            cells += grid((seed,), method=(method,), length=("long",), lr=grids[method],
                          probe_every=(DOSE_PROBE_EVERY,))
    return cells


def run_settings_study(root: str | Path, *, reverse: bool = False, seeds=SETTINGS_SEEDS, poll_s: float = 30.0,
                       log=print) -> list[dict]:
    """The held-out settings study in one resumable command: the pilot (:func:`settings_pilot_cells`), a wait
    until every pilot run is finished (another worker may hold some), the grids (:func:`settings_grid`, written to
    ``grids.json``), then :func:`dose_settings_cells`."""
    import time

    pilot = settings_pilot_cells()
    names = {cell_folder_name(c) for c in pilot}
    while True:
        run_study(pilot[::-1] if reverse else pilot, root, log=log)
        done = [s for s in load_summaries(root) if cell_name(TestbedSetting(**s["setting"]), s["seed"]) in names]
        if len(done) == len(pilot):
            break
        log(f"waiting for {len(pilot) - len(done)} pilot run(s) held by another worker")
        time.sleep(poll_s)
    grids = {m: settings_grid(done, m) for m in SETTINGS_METHODS}
    from gapdyn.io import atomic_write_text

    atomic_write_text(Path(root) / "grids.json", json.dumps(grids, indent=1))
    log("grids: " + "; ".join(f"{m} {', '.join(f'{x:g}' for x in g)}" for m, g in grids.items()))
    cells = dose_settings_cells(grids, seeds)
    return run_study(cells[::-1] if reverse else cells, root, log=log)


SAFE_STEP_SEEDS = tuple(range(6000, 6008))
"""The testbed safe step study's seeds: no other block uses them."""
SAFE_STEP_LRS = (1e-4, 4e-4)
"""The safe step study's lrs (long scratchpad): the documented learning lr, and the lowest calibration lr at which
every constant-step run collapsed (8 of 8)."""


def safe_step_cells(seeds=SAFE_STEP_SEEDS) -> list[dict]:
    """The safe step rule against the constant step on the testbed, fixed before it ran: per seed (seed-major),
    GRPO long at each lr of :data:`SAFE_STEP_LRS`, the constant step and the safe step (paired on the seed's
    stream). Primaries (docs/testbed.md, "Safe step on the testbed"): at 4e-4 fewer runs end collapsed with the
    safe step (paired exact McNemar, one-sided 0.05); at 1e-4 the held-out accuracy after RL is not lower by more
    than 0.05 (paired mean difference, its 95 % lower end above -0.05)."""
    return [c for seed in seeds for lr in SAFE_STEP_LRS
            for c in grid((seed,), method=("grpo",), length=("long",), lr=(lr,), safe_step=(False, True),
                          probe_every=(DOSE_PROBE_EVERY,))]


STUDIES = ("pilot", "pilot-extension", "pilot-extension-2", "pilot-short", "pilot-edge", "acceptance", "dose",
           "dose-heldout", "dose-settings-pilot", "safe-step")
"""The studies by name (:func:`study_cells`)."""


def study_cells(study: str, seeds=None, lrs=None) -> list[dict]:
    """The cells of a study by name (:data:`STUDIES`) on its own seeds, or on ``seeds`` when given (``lrs``: the
    acceptance measurement's learning and collapse lrs)."""
    if study not in STUDIES:
        raise ValueError(f"study must be one of {STUDIES}, got {study!r}")
    if study == "acceptance" and not lrs:
        raise ValueError("acceptance needs --lrs LEARN COLLAPSE")
    kw = {} if seeds is None else {"seeds": tuple(int(x) for x in seeds)}
    return {"pilot": lambda: pilot_cells(**kw), "pilot-extension": lambda: pilot_extension_cells(1, **kw),
            "pilot-extension-2": lambda: pilot_extension_cells(2, **kw), "pilot-short": lambda: pilot_short_cells(**kw),
            "pilot-edge": lambda: pilot_edge_cells(**kw), "acceptance": lambda: acceptance_cells(*lrs, **kw),
            "dose": lambda: dose_cells(**kw), "dose-heldout": lambda: dose_heldout_cells(**kw),
            "dose-settings-pilot": lambda: settings_pilot_cells(**kw), "safe-step": lambda: safe_step_cells(**kw)}[study]()


@dataclass(frozen=True)
class StudyConfig:
    """A testbed study in the one protocol: which study, its seeds (empty: the study's own; the meaning is
    :data:`gapdyn.evidence.experiment.STREAM_SEEDS`) and, for the acceptance measurement, its two lrs."""

    study: str = "dose"
    seeds: tuple[int, ...] = ()
    lrs: tuple[float, float] | None = None
    mode: str = "full"

    def __post_init__(self):
        if self.study not in STUDIES:
            raise ValueError(f"study must be one of {STUDIES}, got {self.study!r}")
        if self.mode != "full":
            raise ValueError(f"a testbed study runs in mode 'full' only, got {self.mode!r}")

    @classmethod
    def full(cls) -> StudyConfig:
        return cls()


def cells(config: StudyConfig, instances=None) -> list[dict]:
    """The study's cells (:func:`study_cells`) on ``instances`` (run seeds), else on the config's seeds, else on the
    study's own."""
    seeds = tuple(instances) if instances is not None else (tuple(config.seeds) or None)
    return study_cells(config.study, seeds, config.lrs)


def analyse(results, config: StudyConfig, *, block: str = "discovery") -> list:
    """No claims yet: a testbed study's record is its dose-response table (:func:`dose_response`)."""
    return []


EXPERIMENT = Experiment(name="testbed", claims={}, config=StudyConfig, cells=cells, run_cell=run_cell,
                        analyse=analyse, modes=("full",), command="python -m llm_probe.testbed.study",
                        seed_field="seeds", seed_meaning=STREAM_SEEDS, cell_name=cell_folder_name, result_file=SUMMARY)
"""The testbed studies in the one protocol (gapdyn.evidence.experiment.Experiment); its cells are run folders."""


@dataclass
class StudyArgs:
    """Run (or continue) a testbed study into --out and print its dose-response table. Several processes may share
    one --out (each cell is claimed by a lock)."""

    study: tyro.conf.Positional[Literal["pilot", "pilot-extension", "pilot-extension-2", "pilot-short", "pilot-edge",
                                        "acceptance", "dose", "dose-heldout", "dose-settings-pilot",
                                        "dose-settings", "safe-step"]]
    """Which cells: the pilot, its two extensions, the short-scratchpad pilot, the edge pilot, or the acceptance
    measurement (needs --lrs), or the dose-response study's calibration block (GRPO, both lengths), its held-out
    block, or its held-out settings (WAPO and Dr. GRPO: the pilot alone, or pilot, grid and block in one go), or the
    safe step rule against the constant step."""
    out_dir: Annotated[str, tyro.conf.arg(name="out")]
    """The study folder (one sub-folder per run)."""
    lrs: tuple[float, float] | None = None
    """acceptance: the documented learning and collapse lrs."""
    reverse: bool = False
    """Take the cells in reverse order (a second worker)."""
    seeds: tuple[int, ...] | None = None
    """Run seeds (the stream seed of each run; the pinned warm start is shared) instead of the study's own."""
    seed: int | None = None
    """One run seed (the same as --seeds S)."""


def main(argv: list[str] | None = None) -> int:
    """``python -m llm_probe.testbed.study pilot|...|dose|dose-heldout|dose-settings-pilot|dose-settings --out DIR
    [--lrs LEARN COLLAPSE] [--reverse] [--seeds S ... | --seed S]``."""
    import sys

    from gapdyn.cmdline import command, parse

    @command("python -m llm_probe.testbed.study")
    def run(argv: list[str]) -> int:
        a = parse(StudyArgs, argv, prog="python -m llm_probe.testbed.study")
        from gapdyn.evidence.runner import resolve_seeds, with_seeds

        import pandas as pd
        import torch

        if a.study == "dose-settings":
            if a.seeds is not None or a.seed is not None:
                raise ValueError("dose-settings runs its own seeds (the pilot's and SETTINGS_SEEDS): --seeds does "
                                 "not apply")
            torch.set_num_threads(1)
            run_settings_study(a.out_dir, reverse=a.reverse)
        else:
            config = with_seeds(EXPERIMENT, StudyConfig(study=a.study, lrs=a.lrs), resolve_seeds(a.seeds, a.seed))
            cells = EXPERIMENT.cells(config)
            torch.set_num_threads(1)
            run_study(cells[::-1] if a.reverse else cells, a.out_dir)
        with pd.option_context("display.width", 200, "display.max_columns", 30):
            print(dose_response(load_summaries(a.out_dir)).to_string(index=False))
        return 0

    return run(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    raise SystemExit(main())
