"""The one runner of a study (docs/evidence.md): cells that resume, cells shared between processes, cells added
from earlier results, and the seeds of a study given on the command line.

- Seeds: ``--seeds A B ...`` / ``--seed S`` (:func:`resolve_seeds`) replace the seeds of the block every mode runs;
  what a seed is (an instance seed that draws an environment, or the stream seed of one training run) is stated once
  per study, by its :class:`~gapdyn.evidence.experiment.Experiment` (``seed_field``, ``seed_meaning``;
  :func:`with_seeds`).
- Folder cells (:func:`run_cells`): each cell is one folder ``root / name(cell)``, done when its result file
  exists (an interrupted study continues where it stopped; a folder without its result file is torn and rerun from
  its start). Several processes may share one study folder: a cell is claimed by an advisory lock
  (``<root>/<cell folder>.lock``, :func:`claim`; released by the OS however the process ends) and a claimed cell
  is skipped.
- Adaptive cells (:func:`run_adaptive`): ``more(results) -> cells`` adds cells computed from the finished results
  (bisections, dose-response grids, island scans), iterated until it returns no new cell.
- Blocks (:func:`run_experiment`): discovery, then a confirmation block sized by the planner from the discovery
  claims (:func:`plan_confirmation`), each block analysed on its own rows, Holm-adjusted and stamped with the
  criteria hash (:func:`stamp_claims`); the sweep backend is passed in (``gapdyn.evidence.sweep.run_sweep``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pandas is imported where a function needs it (``import gapdyn.evidence.runner`` stays light)
    import pandas as pd

__all__ = ["resolve_seeds", "with_seeds", "seeds_label", "claim", "run_cells", "run_adaptive", "read_json",
           "ExperimentResult", "BlockPlan", "CONFIRMATION_MIN", "experiment_blocks", "stamp_claims",
           "plan_confirmation", "run_experiment"]


# --- seeds ----------------------------------------------------------------------------------------------------
def resolve_seeds(seeds: Sequence[int] | None = None, seed: int | None = None) -> tuple[int, ...] | None:
    """The seeds asked for on a command line: ``--seeds`` (several) or ``--seed`` (one: the same as ``--seeds S``);
    None when neither is given (the study's own seeds). Each an integer in [0, 2^64 - 1]; both flags at once, no
    seed or a seed twice: ValueError."""
    from .._validate import check_seed

    if seeds is not None and seed is not None:
        raise ValueError("give --seeds or --seed, not both (--seed S is --seeds S)")
    if seed is not None:
        return (check_seed(seed, "--seed"),)
    if seeds is None:
        return None
    out = tuple(check_seed(s, "--seeds") for s in seeds)
    if not out or len(set(out)) != len(out):
        raise ValueError(f"--seeds must name at least one seed, none twice, got {list(out)}")
    return out


def with_seeds(experiment, config, seeds: Sequence[int] | None):
    """``config`` with ``seeds`` in the experiment's seed field (``experiment.seed_field``: the seeds of the block
    every mode runs; their meaning is ``experiment.seed_meaning``); ``config`` itself when ``seeds`` is None. The
    config's own checks apply (e.g. seeds shared with the confirmation block: ValueError)."""
    if seeds is None:
        return config
    field = experiment.seed_field
    if field not in {f.name for f in dataclasses.fields(config)}:
        raise ValueError(f"{experiment.name}: its config has no seed field {field!r}")
    confirmation = tuple(getattr(config, "confirmation", ()) or ())
    shared = sorted(set(seeds) & set(confirmation))
    if shared:
        raise ValueError(f"--seeds {shared} belong to {experiment.name}'s confirmation block; choose others")
    return dataclasses.replace(config, **{field: tuple(int(s) for s in seeds)})


def seeds_label(seeds: Sequence[int]) -> str:
    """A short folder-name label of a seed list: the seeds themselves up to four, else first-last, count and a
    hash of the list (two lists never share a label by accident)."""
    import hashlib

    s = [int(x) for x in seeds]
    if len(s) <= 4:
        return "-".join(map(str, s))
    digest = hashlib.sha1(",".join(map(str, s)).encode()).hexdigest()[:6]
    return f"{s[0]}-{s[-1]}-n{len(s)}-{digest}"


# --- folder cells: resumable, shared between processes ---------------------------------------------------------
@contextlib.contextmanager
def claim(lock: str | os.PathLike) -> Iterator[bool]:
    """Claim a cell by an advisory lock on the file ``lock`` (created if missing): yields True when this process
    holds it, False when another process does. The OS releases the lock however the process ends."""
    import fcntl

    fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another process runs this cell
            yield False
            return
        yield True
    finally:
        os.close(fd)


def read_json(path: Path) -> Any:
    """A result file read as JSON (the default loader of :func:`run_cells`)."""
    return json.loads(Path(path).read_text())


def run_cells(cells: Sequence[dict], root: str | os.PathLike, *, name: Callable[[dict], str],
              run: Callable[[dict, Path], Any], result_file: str, load: Callable[[Path], Any] = read_json,
              describe: Callable[[Any], str] = lambda result: "done", log=print) -> list:
    """Run every cell not done yet under ``root`` (in the order given); returns the results of the cells this call
    finished or found finished (in the order of ``cells``; a cell claimed by another process is left out).

    A cell's folder is ``root / name(cell)``; it is done when ``<folder>/<result_file>`` exists (``load`` reads
    it). Otherwise it is claimed (:func:`claim` on ``root / (name(cell) + ".lock")``; claimed elsewhere: skipped),
    checked again (it may have finished meanwhile), a torn folder removed, and ``run(cell, folder)`` called (it
    writes the result file last). Each finished cell logs one line: ``[i/n] <folder>: <describe(result)>``
    followed by the counts so far (computed here, found done, claimed elsewhere).
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    done, n_run, n_found, n_elsewhere = [], 0, 0, 0
    for i, cell in enumerate(cells):
        d = root / name(cell)
        if (d / result_file).is_file():
            done.append(load(d / result_file))
            n_found += 1
            continue
        with claim(root / f"{d.name}.lock") as mine:
            if not mine:
                n_elsewhere += 1
                continue
            if (d / result_file).is_file():  # finished while we waited for the lock
                done.append(load(d / result_file))
                n_found += 1
                continue
            if d.exists():  # a run torn by an interruption: start it again
                shutil.rmtree(d)
            result = run(cell, d)
        n_run += 1
        log(f"[{i + 1}/{len(cells)}] {d.name}: {describe(result)} "
            f"({n_run} run, {n_found} done before, {n_elsewhere} claimed elsewhere)", flush=True)
        done.append(result)
    return done


def run_adaptive(cells: Sequence[dict], run: Callable[[list[dict]], list], more: Callable[[list], list[dict]], *,
                 max_rounds: int = 100, log=print) -> tuple[list[dict], list]:
    """Run ``cells``, then the cells ``more(results)`` adds from the finished results, until it adds none.

    ``run(cells) -> results`` runs a list of cells (resumably: the cells of earlier rounds are found done, not
    rerun); ``more`` sees every result so far and returns the cells to add (a cell already planned is not added
    twice). Returns (every cell planned, every result). More than ``max_rounds`` rounds: RuntimeError (a ``more``
    that never settles)."""
    if isinstance(max_rounds, bool) or not isinstance(max_rounds, int) or max_rounds < 1:
        raise ValueError(f"max_rounds must be a positive integer, got {max_rounds!r}")
    planned = list(cells)
    seen = {json.dumps(c, sort_keys=True) for c in planned}
    results = run(planned)
    for rnd in range(1, max_rounds + 1):
        new = []
        for c in more(results) or ():
            key = json.dumps(c, sort_keys=True)
            if key not in seen:
                seen.add(key)
                new.append(c)
        if not new:
            return planned, results
        log(f"round {rnd}: {len(new)} cells added from {len(results)} results ({len(planned) + len(new)} planned)",
            flush=True)
        planned += new
        results = run(planned)
    raise RuntimeError(f"more() still added cells after {max_rounds} rounds")


# --- blocks: discovery, the planned confirmation block, stamped claims --------------------------------------------
@dataclass(frozen=True)
class ExperimentResult:
    """What an experiment run returns: its rows, its claims (both blocks) and the criteria hash.

    results: every row, with a ``block`` column ("discovery" / "confirmation");
    claims: :class:`gapdyn.Claim` records of every block, Holm-adjusted within a block where they are tests,
    each stamped with ``criteria_hash`` (the hash of the module's frozen ``CRITERIA``);
    replication: :func:`gapdyn.replication_table` of the two blocks (confirmation verdict, disagreement flagged);
    plan: the confirmation block's :class:`BlockPlan` (None without one).
    """

    name: str
    mode: str
    results: pd.DataFrame
    claims: tuple
    criteria_hash: str
    plan: BlockPlan | None = None

    def block(self, block: str) -> list:
        return [c for c in self.claims if c.block == block]

    @property
    def replication(self) -> pd.DataFrame:
        from .claims import replication_table

        return replication_table(self.block("discovery"), self.block("confirmation"))

    @property
    def verdict(self) -> pd.DataFrame:
        """The claims table of the block that decides: confirmation when it ran, else discovery."""
        from .claims import claims_table

        shown = self.block("confirmation") or self.block("discovery")
        return claims_table(shown)


def experiment_blocks(config) -> list[tuple[str, tuple[int, ...]]]:
    """[(block, instance seeds)]: discovery always, confirmation when the config has one (full mode)."""
    blocks = [("discovery", tuple(config.instances))]
    if tuple(getattr(config, "confirmation", ())):
        blocks.append(("confirmation", tuple(config.confirmation)))
    return blocks


def stamp_claims(experiment, claims) -> list:
    """Holm-adjust a block's test claims and stamp the hash of the experiment's frozen criteria."""
    from .claims import holm_adjust_claims

    claims = holm_adjust_claims(list(claims))
    return [dataclasses.replace(c, criteria_hash=experiment.criteria_hash) for c in claims]


CONFIRMATION_MIN = 40
"""The smallest confirmation block: at least 20 instances, and the n from which the mean interval's coverage
is nominal (MEAN_INTERVAL, docs/coverage.md)."""


@dataclass(frozen=True)
class BlockPlan:
    """The confirmation block's size, planned from the discovery block (gapdyn.evidence.planner via each claim's
    n_planned): n = min(max(planned, n_min), n_max), where planned is the largest n_planned of the counted
    primary claims (of every counted claim when no primary has one) and n_max the instances the experiment's
    budget allows (its config's confirmation seeds). note: one line for reports."""

    n: int
    planned: int | None
    n_min: int
    n_max: int
    note: str


def plan_confirmation(claims, *, n_min: int = CONFIRMATION_MIN, n_max: int) -> BlockPlan:
    """:class:`BlockPlan` from the discovery block's claims: gapdyn.evidence.planner.confirmation_size over the
    counted primary claims' n_planned (every counted claim's when no primary has one), floor ``n_min``, seed
    budget ``n_max``."""
    from .planner import confirmation_size

    if not (isinstance(n_max, int) and n_max >= 1):
        raise ValueError(f"n_max must be a positive integer, got {n_max!r}")
    counted = [c for c in claims if c.counts_as_evidence and c.n_planned is not None]
    primaries = [c for c in counted if c.primary]
    pool = primaries or counted
    planned = max((int(c.n_planned) for c in pool), default=None)
    lo = min(n_min, n_max)
    n = confirmation_size({i: int(c.n_planned) for i, c in enumerate(pool)}, n_min=n_min, n_max=n_max)
    who = "primary claims" if primaries else "counted claims"
    if planned is None:
        note = f"confirmation block: {n} instances (no {who[:-1]} has a planned n; the floor is {lo})"
    elif planned > n_max:
        note = (f"confirmation block: {n} instances, the budget (the planned n of the {who} is {planned}: "
                "those above the budget are not decidable within it)")
    else:
        note = f"confirmation block: {n} instances (planned n of the {who}: {planned}; floor {lo})"
    return BlockPlan(n=n, planned=planned, n_min=lo, n_max=n_max, note=note)


def run_experiment(experiment, config, *, sweep: Callable, store=None, backend="joblib", n_jobs=-1,
                   progress=True) -> ExperimentResult:
    """Run every block of a :class:`gapdyn.evidence.experiment.Experiment` through ``sweep`` (``gapdyn.evidence.sweep.run_sweep``:
    resumable) and judge it.

    The criteria were frozen and hashed when the experiment was constructed (at import, before any block
    runs); each block is analysed on its own instances only (``experiment.analyse(rows, config, block=...)``).
    The confirmation block runs the first :func:`plan_confirmation` (discovery claims) ``.n`` of the config's
    confirmation seeds (the seeds are the budget).
    """
    import pandas as pd

    frames, claims, plan = [], [], None
    for block, seeds in experiment_blocks(config):
        if block == "confirmation":
            plan = plan_confirmation([c for c in claims if c.block == "discovery"], n_max=len(seeds))
            seeds = seeds[:plan.n]
        res = sweep(
            experiment.run_cell,
            experiment.cells(config, seeds),
            name=f"{experiment.name}-{config.mode}-{block}",
            store=store,
            backend=backend,
            n_jobs=n_jobs,
            progress=progress,
        )
        res = res.assign(block=block)
        frames.append(res)
        claims += stamp_claims(experiment, experiment.analyse(res, config, block=block))
    return ExperimentResult(
        name=experiment.name,
        mode=config.mode,
        results=pd.concat(frames, ignore_index=True),
        claims=tuple(claims),
        criteria_hash=experiment.criteria_hash,
        plan=plan,
    )
