"""Where each figure's data comes from: cached sweep results, a fresh run, or gapdyn directly.

No science lives here: the bandit experiments (``bandits.experiments.<name>.run``) and the
tiny-Qwen trainer (``llm_probe``) produce the numbers; gapdyn's formulas are called, not re-written.
This module only chooses the configuration for a mode, reuses cached results (the sweep store
makes reruns free: completed cells are loaded, not recomputed) and tabulates gapdyn outputs.

Modes:
- ``"test"``: the smallest sizes (the test suite, seconds per experiment);
- ``"quick"``: the experiments' ``Config.quick()`` (CPU, minutes for everything);
- ``"full"``: ``Config.full()`` (the paper-scale sweeps; use a cluster).

When a package a figure needs is not built yet, :class:`NotAvailable` is raised with the reason,
and the figure is skipped with that message: data is never faked.
"""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Any

import pandas as pd

from ._common import MODES, NotAvailable, SourceFailed, _import, check_mode, default_store
from .llm import LLMResults, llm_demo_config, llm_headline, llm_verdict, load_llm, read_llm_results
from .taxonomy import BIN_DH_SIGN, taxonomy_summary, taxonomy_table, taxonomy_verdict
from .views import (
    PREDICTORS,
    ThresholdViews,
    critical_vs_length,
    final_frame,
    logistic_fit_rows,
    logistic_thm1_rows,
    methods_summary,
    methods_view,
    stagnation_parts,
    stagnation_trajectories,
    success_rate_phase,
    success_rate_view,
    threshold_views,
    trajectory_frame,
)

__all__ = [
    "MODES",
    "NotAvailable",
    "SourceFailed",
    "Sources",
    "TEST_OVERRIDES",
    "default_store",
    "experiment_config",
    # re-exported (figure scripts and notebooks import them from here)
    "BIN_DH_SIGN",
    "taxonomy_table",
    "taxonomy_summary",
    "taxonomy_verdict",
    "LLMResults",
    "llm_demo_config",
    "llm_headline",
    "llm_verdict",
    "read_llm_results",
    "PREDICTORS",
    "ThresholdViews",
    "threshold_views",
    "critical_vs_length",
    "success_rate_view",
    "success_rate_phase",
    "methods_view",
    "methods_summary",
    "stagnation_parts",
    "stagnation_trajectories",
    "logistic_fit_rows",
    "logistic_thm1_rows",
    "trajectory_frame",
    "final_frame",
]


TEST_OVERRIDES: dict[str, dict[str, Any]] = {
    "threshold": {"n_instances": 4, "n_seeds": 4},
    "length": {"Ts": (1, 2, 4, 8), "n_instances": 1, "runs": 8, "per_decade": 4, "ac_split_T": 2},
}
"""Mode "test" shrinks an experiment's ``Config.quick()`` further with these fields (the tiny
reproduction must finish in about a minute on two shared cores); unknown fields are ignored."""


def experiment_config(module, mode: str, *, seed: int | None = None):
    """``Config.quick()`` / ``Config.full()`` of an experiment module; mode "test" asks for
    ``Config.test()`` when the module has one, else ``Config.quick()`` shrunk by :data:`TEST_OVERRIDES`.
    ``seed`` overrides a ``seed`` / ``seed0`` / ``base_seed`` field when the config has one."""
    cfg_cls = getattr(module, "Config", None)
    if cfg_cls is None:
        raise NotAvailable(f"{module.__name__} has no Config (experiment contract not implemented yet)")
    ctor = {"test": "test", "quick": "quick", "full": "full"}[mode]
    if not hasattr(cfg_cls, ctor):
        ctor = "quick"
    config = getattr(cfg_cls, ctor)()
    fields = {f.name for f in dataclasses.fields(config)} if dataclasses.is_dataclass(config) else set()
    if mode == "test" and ctor == "quick":
        name = module.__name__.rsplit(".", 1)[-1]
        over = {k: v for k, v in TEST_OVERRIDES.get(name, {}).items() if k in fields}
        if over:
            config = dataclasses.replace(config, **over)
    if seed is not None and fields:
        for name in ("seed", "seed0", "base_seed"):
            if name in fields:
                config = dataclasses.replace(config, **{name: seed})
                break
    return config


class Sources:
    """The data of one figure run, computed at most once per experiment (shared by all figures
    and by the reproduction report).

    Args:
      mode: "test", "quick" or "full" (see the module doc).
      store: the sweep store (cached cells are reused); default :func:`default_store`.
      llm_dir: where the tiny-Qwen runs write/read their outputs; default ``<store>/llm_probe/<mode>``.
      n_jobs: local processes for sweeps (1 = serial, the default: the machine is shared).
      seed: overrides the experiments' base seed when set.
      progress: show the sweeps' progress bars.
    """

    def __init__(self, mode: str = "quick", *, store=None, llm_dir=None, n_jobs: int = 1, seed: int | None = None,
                 progress: bool = False):
        self.mode = check_mode(mode)
        self.store = Path(store) if store is not None else default_store()
        self.llm_dir = Path(llm_dir) if llm_dir is not None else self.store / "llm_probe" / self.mode
        if isinstance(n_jobs, bool) or not isinstance(n_jobs, int) or n_jobs == 0 or n_jobs < -1:
            raise ValueError(f"n_jobs must be a positive integer or -1 (all cores), got {n_jobs!r}")
        self.n_jobs = n_jobs
        self.seed = seed
        self.progress = progress
        self.llm_progress = progress  # the tiny-Qwen demo's own bar (reproduce shows it, not the sweeps')
        self._cache: dict[str, Any] = {}
        self.errors: dict[str, str] = {}

    # ---- gapdyn-only data
    def taxonomy(self) -> pd.DataFrame:
        if "taxonomy" not in self._cache:
            n = {"test": 4000, "quick": 40000, "full": 200000}[self.mode]
            self._cache["taxonomy"] = taxonomy_table(n, seed=0 if self.seed is None else self.seed)
        return self._cache["taxonomy"]

    # ---- bandit experiments
    def experiment(self, name: str) -> tuple[pd.DataFrame, pd.DataFrame]:
        """(results, verdict) of ``bandits.experiments.<name>``, run once (store-cached)."""
        key = f"exp:{name}"
        if key in self._cache:
            return self._cache[key]
        if key in self.errors:
            raise (SourceFailed if "failed:" in self.errors[key] else NotAvailable)(self.errors[key])
        try:
            registry = _import("bandits.experiments", f"the '{name}' experiment")
            if name not in getattr(registry, "EXPERIMENTS", {}):
                raise NotAvailable(f"experiment {name!r} is not registered in bandits.experiments")
            module = _import(registry.EXPERIMENTS[name], f"the '{name}' experiment")
            if not hasattr(module, "run"):
                raise NotAvailable(f"{module.__name__} has no run() yet")
            config = experiment_config(module, self.mode, seed=self.seed)
            kw: dict[str, Any] = {"store": str(self.store), "progress": self.progress}
            params = inspect.signature(module.run).parameters
            if "backend" in params:
                kw["backend"] = "serial" if self.n_jobs == 1 else "joblib"
            if "n_jobs" in params:
                kw["n_jobs"] = self.n_jobs
            results, verdict = module.run(config, **{k: v for k, v in kw.items() if k in params or _has_varkw(params)})
        except NotAvailable as exc:
            self.errors[key] = str(exc)
            raise
        except Exception as exc:  # noqa: BLE001 - recorded once, reported by every figure that needs it
            self.errors[key] = f"bandits.experiments.{name}.run failed: {type(exc).__name__}: {exc}"
            raise SourceFailed(self.errors[key]) from exc
        self._cache[key] = (results, verdict)
        self._cache[f"config:{name}"] = config
        return self._cache[key]

    def config(self, name: str):
        """The config an experiment ran with (after :meth:`experiment`)."""
        return self._cache.get(f"config:{name}")

    # ---- tiny-Qwen runs
    def llm(self):
        """The tiny-Qwen GRPO-vs-WAPO demo's outputs (see :mod:`llm_probe`), run once, cached on disk."""
        key = "llm"
        if key in self._cache:
            return self._cache[key]
        if key in self.errors:
            raise (SourceFailed if "failed:" in self.errors[key] else NotAvailable)(self.errors[key])
        try:
            out = load_llm(self.mode, self.llm_dir, seed=self.seed, progress=self.llm_progress, n_jobs=self.n_jobs)
        except NotAvailable as exc:
            self.errors[key] = str(exc)
            raise
        except Exception as exc:  # noqa: BLE001
            self.errors[key] = f"llm_probe.demo failed: {type(exc).__name__}: {exc}"
            raise SourceFailed(self.errors[key]) from exc
        self._cache[key] = out
        return out


def _has_varkw(params) -> bool:
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
