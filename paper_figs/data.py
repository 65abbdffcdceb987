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
import importlib
import inspect
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import gapdyn

__all__ = [
    "MODES",
    "NotAvailable",
    "Sources",
    "BIN_DH_SIGN",
    "taxonomy_table",
    "taxonomy_summary",
    "taxonomy_verdict",
    "default_store",
]

MODES = ("test", "quick", "full")

BIN_DH_SIGN: dict[str, int] = {"pos_peak": -1, "pos_valley": +1, "neg_peak": +1, "neg_valley": -1}
"""The sign of Delta H that each WAPO bin predicts (THEORY.md §4: sharpening, rising, rising, falling)."""


class NotAvailable(RuntimeError):
    """A figure's data source (an experiment module, the LLM trainer) is not available yet."""


def default_store() -> Path:
    """The sweep store: ``$GAPDYN_STORE`` or ``paper_figs/out/store``."""
    env = os.environ.get("GAPDYN_STORE")
    return Path(env) if env else Path(__file__).resolve().parent / "out" / "store"


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return mode


# --------------------------------------------------------------------------------------------------
# Figure 5: the WAPO taxonomy, from gapdyn alone


def taxonomy_table(
    n_tokens: int = 20000,
    *,
    vocab: int = 32,
    seed: int = 0,
    sigma_range: tuple[float, float] = (0.05, 8.0),
) -> pd.DataFrame:
    """First-order effects of one token update for random positions, one row per (position, sign of A).

    Logits z = sigma * N(0, I_V) with log sigma uniform over ``sigma_range`` (flat to peaked
    distributions); the token s is sampled from p = softmax(z), as in training. For A = +1 and
    A = -1 (eta = 1, weight 1) :func:`gapdyn.token_step_effects` gives Delta H, Delta p_s, the bin
    and the exact first-order sign of Delta H; ``bin_sign`` is the sign the bin predicts
    (:data:`BIN_DH_SIGN`), ``mispredicted`` marks tokens where the two differ.

    Columns: p_s, C, H, A, dH, dp_s, bin, sign_dH, bin_sign, mispredicted.
    """
    if int(n_tokens) < 1:
        raise ValueError(f"n_tokens must be >= 1, got {n_tokens}")
    if int(vocab) < 2:
        raise ValueError(f"vocab must be >= 2, got {vocab}")
    lo, hi = sigma_range
    if not (0 < lo < hi):
        raise ValueError(f"sigma_range must satisfy 0 < low < high, got {sigma_range}")
    rng = np.random.default_rng(seed)
    n, V = int(n_tokens), int(vocab)
    sigma = np.exp(rng.uniform(np.log(lo), np.log(hi), n))
    z = sigma[:, None] * rng.standard_normal((n, V))
    p = gapdyn.softmax(z)
    token = gapdyn.sample_group(p, 2, rng)[:, 0]
    H = gapdyn.token_entropy(gapdyn.log_softmax(z))
    frames = []
    for A in (1.0, -1.0):
        e = gapdyn.token_step_effects(z, token, A, 1.0)
        names = np.asarray(gapdyn.BIN_NAMES)[e.bin]
        bin_sign = np.array([BIN_DH_SIGN[b] for b in names])
        dp_s = np.take_along_axis(e.dp, token[:, None], axis=-1)[:, 0]
        frames.append(
            pd.DataFrame(
                {
                    "p_s": e.p_token,
                    "C": e.collision,
                    "H": H,
                    "A": A,
                    "dH": e.dH,
                    "dp_s": dp_s,
                    "bin": names,
                    "sign_dH": e.entropy_sign.astype(int),
                    "bin_sign": bin_sign,
                    "mispredicted": e.entropy_sign != bin_sign,
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def taxonomy_summary(table: pd.DataFrame) -> dict[str, float]:
    """Headline numbers of the taxonomy table (A = +1 rows; A = -1 flips every sign alike).

    share_bin_correct: share of sampled tokens whose bin predicts the exact sign of Delta H;
    valley_mispredicted: count of valley tokens that disagree (THEORY.md: never);
    max_gap_of_misses: the largest p_s - C among misses (THEORY.md: misses sit just above p_s = C).
    """
    pos = table[table["A"] > 0]
    miss = pos[pos["mispredicted"]]
    valley = pos["bin"].str.endswith("valley")
    return {
        "n_tokens": int(len(pos)),
        "share_bin_correct": float(1.0 - pos["mispredicted"].mean()),
        "share_peak": float((~valley).mean()),
        "valley_mispredicted": int((pos["mispredicted"] & valley).sum()),
        "max_gap_of_misses": float((miss["p_s"] - miss["C"]).max()) if len(miss) else 0.0,
        "median_gap_of_misses": float((miss["p_s"] - miss["C"]).median()) if len(miss) else 0.0,
    }


def taxonomy_verdict(summary: dict) -> pd.DataFrame:
    """THEORY.md §4's taxonomy claims against :func:`taxonomy_summary` (same columns as ``analyse``).

    "~97%" is read as "at least 90% of sampled tokens"; "misses sit just above p_s = C" as "every miss
    has 0 <= p_s - C < 0.05".
    """
    share, vmiss, gap = summary["share_bin_correct"], summary["valley_mispredicted"], summary["max_gap_of_misses"]
    rows = [
        ("WAPO bin predicts the exact sign of dH for ~97% of sampled tokens", "random softmax positions, V=32",
         share, "~0.97 (>= 0.9)", "holds" if share >= 0.9 else "does not hold"),
        ("valley tokens never disagree with the exact sign of dH", "random softmax positions, V=32",
         vmiss, 0, "holds" if vmiss == 0 else "does not hold"),
        ("misses sit just above p_s = C", "random softmax positions, V=32",
         gap, "max(p_s - C) < 0.05", "holds" if gap < 0.05 else "does not hold"),
    ]
    return pd.DataFrame(rows, columns=["claim", "setting", "measured", "expected", "holds"])


# --------------------------------------------------------------------------------------------------
# Bandit experiments and the tiny-Qwen runs


def _import(module: str, why: str):
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise NotAvailable(f"{module} is not available yet ({exc}); needed for {why}") from exc


def experiment_config(module, mode: str, *, seed: int | None = None):
    """``Config.quick()`` / ``Config.full()`` of an experiment module; mode "test" asks for
    ``Config.test()`` when the module has one, else ``Config.quick()``. ``seed`` overrides a
    ``seed`` / ``seed0`` / ``base_seed`` field when the config has one."""
    cfg_cls = getattr(module, "Config", None)
    if cfg_cls is None:
        raise NotAvailable(f"{module.__name__} has no Config (experiment contract not implemented yet)")
    ctor = {"test": "test", "quick": "quick", "full": "full"}[mode]
    if not hasattr(cfg_cls, ctor):
        ctor = "quick"
    config = getattr(cfg_cls, ctor)()
    if seed is not None and dataclasses.is_dataclass(config):
        fields = {f.name for f in dataclasses.fields(config)}
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
        self.n_jobs = int(n_jobs)
        self.seed = seed
        self.progress = progress
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
            raise NotAvailable(self.errors[key])
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
            raise NotAvailable(self.errors[key])
        try:
            out = _load_llm(self.mode, self.llm_dir, seed=self.seed, progress=self.progress)
        except NotAvailable as exc:
            self.errors[key] = str(exc)
            raise
        self._cache[key] = out
        return out


def _has_varkw(params) -> bool:
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def _load_llm(mode: str, out_dir: Path, *, seed: int | None, progress: bool):
    """Placeholder until llm_probe's demo API lands (filled in at integration)."""
    _import("llm_probe", "the tiny-Qwen figure")
    raise NotAvailable("llm_probe's GRPO-vs-WAPO demo is not available yet")
