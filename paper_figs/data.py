"""Where each figure's data comes from: the experiments' ExperimentResult (results + claims) or the tiny-Qwen runs.

No science lives here: the experiments (``bandits.experiments.<name>.run``: rows, claims with intervals
and verdicts) and the tiny-Qwen trainer (``llm_probe``) produce the numbers. This module only asks an
experiment for the configuration of a mode and caches what ran (the sweep store makes reruns free:
completed cells are loaded, not recomputed).

Modes (the experiments' own classmethods):
- ``"test"``: ``Config.test()`` (the smallest sizes: what the test suite runs);
- ``"quick"``: the experiments' ``Config.quick()`` (sized for a CPU);
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
from .llm import LLMResults, llm_claims, llm_demo_config, llm_headline, load_llm, read_llm_results
from .views import (
    PREDICTORS,
    ThresholdViews,
    critical_vs_length,
    final_frame,
    logistic_fit_rows,
    logistic_slopes,
    logistic_thm1_rows,
    methods_summary,
    methods_view,
    stagnation_parts,
    stagnation_trajectories,
    success_rate_view,
    taxonomy_summary,
    taxonomy_table,
    threshold_views,
    trajectory_frame,
)

__all__ = [
    "MODES",
    "NotAvailable",
    "SourceFailed",
    "Sources",
    "default_store",
    "experiment_config",
    # re-exported (figure scripts and notebooks import them from here)
    "taxonomy_table",
    "taxonomy_summary",
    "LLMResults",
    "llm_demo_config",
    "llm_headline",
    "llm_claims",
    "read_llm_results",
    "PREDICTORS",
    "ThresholdViews",
    "threshold_views",
    "critical_vs_length",
    "success_rate_view",
    "methods_view",
    "methods_summary",
    "stagnation_parts",
    "stagnation_trajectories",
    "logistic_fit_rows",
    "logistic_slopes",
    "logistic_thm1_rows",
    "trajectory_frame",
    "final_frame",
]


def experiment_config(module, mode: str):
    """The experiment's own ``Config.test()`` / ``Config.quick()`` / ``Config.full()`` (nothing overridden:
    sizes and seeds belong to the experiment)."""
    cfg_cls = getattr(module, "Config", None)
    if cfg_cls is None or not hasattr(cfg_cls, check_mode(mode)):
        raise NotAvailable(f"{module.__name__} has no Config.{mode}() (experiment contract not implemented yet)")
    return getattr(cfg_cls, mode)()


class Sources:
    """The data of one figure run, computed at most once per experiment (shared by all figures
    and by the reproduction report).

    Args:
      mode: "test", "quick" or "full" (see the module doc).
      store: the sweep store (cached cells are reused); default :func:`default_store`.
      llm_dir: where the tiny-Qwen runs write/read their outputs; default ``<store>/llm_probe/<mode>``.
      n_jobs: local processes for sweeps (1 = serial, the default: the machine is shared).
      seed: the tiny-Qwen runs' base seed (the experiments use their own instance seeds).
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
        self._llm_job = None  # (pool, future) of start_llm

    def taxonomy(self) -> pd.DataFrame:
        """The rows of the ``taxonomy`` experiment (one row per sampled token and sign of A)."""
        return self.experiment("taxonomy").results

    # ---- bandit experiments
    def experiment(self, name: str):
        """The ExperimentResult (results, claims) of ``bandits.experiments.<name>``, run once (store-cached)."""
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
            config = experiment_config(module, self.mode)
            kw: dict[str, Any] = {"store": str(self.store), "progress": self.progress}
            params = inspect.signature(module.run).parameters
            if "backend" in params:
                kw["backend"] = "serial" if self.n_jobs == 1 else "joblib"
            if "n_jobs" in params:
                kw["n_jobs"] = self.n_jobs
            result = module.run(config, **{k: v for k, v in kw.items() if k in params or _has_varkw(params)})
            if not hasattr(result, "claims") or not hasattr(result, "results"):
                raise NotAvailable(f"{module.__name__}.run does not return an ExperimentResult yet")
        except NotAvailable as exc:
            self.errors[key] = str(exc)
            raise
        except Exception as exc:  # noqa: BLE001 - recorded once, reported by every figure that needs it
            self.errors[key] = f"bandits.experiments.{name}.run failed: {type(exc).__name__}: {exc}"
            raise SourceFailed(self.errors[key]) from exc
        self._cache[key] = result
        self._cache[f"config:{name}"] = config
        return self._cache[key]

    def claims(self, name: str) -> list:
        """The claims of one source: a bandit experiment's name, or "llm" for the tiny-Qwen runs. Claim ids
        are qualified by the source ("<name>.<id>", unless they already start so), so that ids stay unique
        across experiments (each claim names its statement by its own key, gapdyn.evidence.claims.STATEMENTS)."""
        if name == "llm":
            if "claims:llm" not in self._cache:
                self._cache["claims:llm"] = llm_claims(self.llm())
            return self._cache["claims:llm"]
        return [c if c.id.startswith(f"{name}.") else dataclasses.replace(c, id=f"{name}.{c.id}")
                for c in self.experiment(name).claims]

    def config(self, name: str):
        """The config an experiment ran with (after :meth:`experiment`)."""
        return self._cache.get(f"config:{name}")

    # ---- tiny-Qwen runs
    def start_llm(self) -> None:
        """Start the tiny-Qwen demo now in a second process (``spawn``; its own bars off), so that it runs beside
        whatever this process does next (torch in one thread there, numba here); :meth:`llm` waits for it, then
        reads the folder it wrote. A second call, or one after :meth:`llm`, does nothing."""
        if self._llm_job is not None or "llm" in self._cache or "llm" in self.errors:
            return
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        future = pool.submit(load_llm, self.mode, self.llm_dir, seed=self.seed, progress=False, n_jobs=self.n_jobs)
        self._llm_job = (pool, future)

    def llm(self):
        """The tiny-Qwen GRPO-vs-WAPO demo's outputs (see :mod:`llm_probe`), run once, cached on disk (after
        :meth:`start_llm`: the second process's run, its error raised here)."""
        key = "llm"
        if key in self._cache:
            return self._cache[key]
        if key in self.errors:
            raise (SourceFailed if "failed:" in self.errors[key] else NotAvailable)(self.errors[key])
        try:
            if self._llm_job is not None:
                (pool, future), self._llm_job = self._llm_job, None
                try:
                    future.result()  # the demo's folder is written: load_llm below only reads it
                finally:
                    pool.shutdown(cancel_futures=True)
            out = load_llm(self.mode, self.llm_dir, seed=self.seed, progress=self.llm_progress, n_jobs=self.n_jobs)
        except NotAvailable as exc:
            self.errors[key] = str(exc)
            raise
        except Exception as exc:  # noqa: BLE001
            self.errors[key] = f"llm_probe.experiments.demo failed: {type(exc).__name__}: {exc}"
            raise SourceFailed(self.errors[key]) from exc
        self._cache[key] = out
        return out


def _has_varkw(params) -> bool:
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
