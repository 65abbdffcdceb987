"""One experiment protocol for the bandit experiments and the tiny-Qwen studies (docs/evidence.md).

An :class:`Experiment` is what the claim machinery needs of a study, frozen at import: its name, the
:class:`~gapdyn.evidence.claims.ClaimSpec` of every claim it can make (source, statement, form, criterion: written
before any run, hashed at construction), its sizes (a config class with ``test`` / ``quick`` / ``full``
constructors), and three functions: ``cells(config, instances) -> list[dict]`` (the sweep of one block as
plain JSON-serialisable dicts), ``run_cell(**cell) -> DataFrame`` (one cell's rows, deterministic given the
cell) and ``analyse(results, config, *, block) -> list[Claim]`` (a block's claims from its rows only).
Running it (blocks, the planner's confirmation size, Holm, the hash stamp, resumable and adaptive cells, the
seeds of ``--seeds`` / ``--seed``) is the runner's part (:mod:`gapdyn.evidence.runner`); the sweep backend is passed in
(``bandits.experiments._common.run_experiment``). ``seed_field`` names the config field that ``--seeds`` replaces
and ``seed_meaning`` states, once per study, what such a seed is (an instance seed that draws an environment, or the
stream seed of one training run). A study whose cells are run folders names them by ``cell_name(cell)`` and marks
one done by its ``result_file`` (:func:`gapdyn.evidence.runner.run_cells`); ``run_cell(**cell, out=folder)`` then writes it.

Packages register experiments through the entry-point group ``gapdyn.experiments`` of their
pyproject.toml (``name = "module:EXPERIMENT"``); :func:`registry` lists them for ``gapdyn claims`` and
``gapdyn reproduce``. gapdyn imports neither ``bandits`` nor ``llm_probe``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .claims import ClaimSpec, Criterion, criteria_hash
from ..cmdline import MODES

__all__ = ["Experiment", "claim_specs", "registry", "GROUP", "INSTANCE_SEEDS", "STREAM_SEEDS"]

GROUP = "gapdyn.experiments"
INSTANCE_SEEDS = ("instance seeds: each draws one environment of the block (a cluster of the claims' intervals); "
                  "the runs on it use their own stream seeds")
"""The meaning of a seed in the bandit experiments (Experiment.seed_meaning's default)."""
STREAM_SEEDS = ("stream seeds: each is one training run's seed (its prompt stream, sampling and evaluation draws); "
                "the starting model is the same for every seed")
"""The meaning of a seed in the tiny-Qwen studies and the testbed."""


def claim_specs(statements: Mapping[str, tuple[str, str]], criteria: Mapping[str, Criterion],
                forms: Mapping[str, str], *, primary: Sequence[str] = ()) -> dict[str, ClaimSpec]:
    """{claim id: ClaimSpec} from the three tables an experiment writes before any run: (source, statement),
    criterion and form by claim id (the same ids in each), and the ids of its primary comparisons."""
    ids = set(statements)
    if set(criteria) != ids or set(forms) != ids:
        raise ValueError(f"statements, criteria and forms must name the same claims; differ on "
                         f"{sorted(ids ^ set(criteria) | ids ^ set(forms))}")
    unknown = set(primary) - ids
    if unknown:
        raise ValueError(f"primary names claims that are not declared: {sorted(unknown)}")
    return {cid: ClaimSpec(source=statements[cid][0], statement=statements[cid][1], form=forms[cid],
                           criterion=criteria[cid], primary=cid in set(primary)) for cid in statements}


@dataclass(frozen=True)
class Experiment:
    """A study in the one protocol (module doc). ``claims`` is frozen (read-only) at construction and its
    criteria hashed there, before any run; ``criteria_hash`` is stamped on every claim the study makes."""

    name: str
    claims: Mapping[str, ClaimSpec]
    config: type
    cells: Callable[..., list]
    run_cell: Callable[..., Any]
    analyse: Callable[..., list]
    modes: tuple[str, ...] = MODES
    command: str = ""
    """the command line that runs it (e.g. ``gapdyn bandit run threshold``; default ``gapdyn bandit run <name>``)"""
    seed_field: str = "instances"
    """the config field (a tuple of seeds: the block every mode runs) that ``--seeds`` replaces"""
    seed_meaning: str = INSTANCE_SEEDS
    """what one of those seeds is, in one line (default :data:`INSTANCE_SEEDS`)"""
    cell_name: Callable[[dict], str] | None = None
    """run-folder studies: a cell's folder name (None: the cells' rows go to the sweep's store)"""
    result_file: str = ""
    """run-folder studies: the file whose presence marks a cell's folder done"""
    criteria_hash: str = field(init=False)

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"name must be an identifier-like string, got {self.name!r}")
        if not isinstance(self.claims, Mapping):
            raise ValueError("claims must be a mapping claim id -> ClaimSpec (empty: a study that makes no claims)")
        bad = [k for k, v in self.claims.items() if not isinstance(v, ClaimSpec)]
        if bad:
            raise ValueError(f"claims must map to ClaimSpec; not so for {bad}")
        for fn in ("cells", "run_cell", "analyse"):
            if not callable(getattr(self, fn)):
                raise ValueError(f"{fn} must be callable")
        missing = [m for m in self.modes if not callable(getattr(self.config, m, None))]
        if not self.modes or set(self.modes) - set(MODES) or missing:
            raise ValueError(f"modes must be a subset of {MODES}, each a constructor of config; missing {missing}")
        if not isinstance(self.command, str):
            raise ValueError(f"command must be a string, got {self.command!r}")
        import dataclasses

        if dataclasses.is_dataclass(self.config) and self.seed_field not in {f.name for f in
                                                                             dataclasses.fields(self.config)}:
            raise ValueError(f"seed_field {self.seed_field!r} is not a field of {self.config.__name__}")
        if not isinstance(self.seed_meaning, str) or not self.seed_meaning:
            raise ValueError("seed_meaning must say in one line what a seed of this study is")
        if (self.cell_name is None) != (not self.result_file) or (self.cell_name is not None
                                                                   and not callable(self.cell_name)):
            raise ValueError("cell_name (callable) and result_file go together (a study of run folders)")
        object.__setattr__(self, "command", self.command or f"gapdyn bandit run {self.name}")
        object.__setattr__(self, "claims", MappingProxyType(dict(self.claims)))
        object.__setattr__(self, "criteria_hash", criteria_hash(self.criteria))

    @property
    def criteria(self) -> dict[str, Criterion]:
        """{claim id: criterion}."""
        return {k: v.criterion for k, v in self.claims.items()}

    def spec(self, claim_id: str) -> ClaimSpec:
        """The ClaimSpec of ``claim_id`` (ValueError naming the experiment for an undeclared claim)."""
        if claim_id not in self.claims:
            raise ValueError(f"{self.name}: claim {claim_id!r} is not declared (declared: {sorted(self.claims)})")
        return self.claims[claim_id]

    def configure(self, mode: str):
        """The config of ``mode`` (one of ``modes``)."""
        if mode not in self.modes:
            raise ValueError(f"mode must be one of {self.modes}, got {mode!r}")
        return getattr(self.config, mode)()


def registry() -> dict[str, Any]:
    """The registered experiments by name (entry points of group ``gapdyn.experiments``, updated by the
    declaration of the source checkout when there is one), as entry points: ``.load()`` imports one."""
    from importlib.metadata import entry_points

    from ..cli import checkout_entry_points

    found = {ep.name: ep for ep in entry_points(group=GROUP)}
    found.update(checkout_entry_points(GROUP))
    return dict(found)
