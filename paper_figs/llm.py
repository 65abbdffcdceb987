"""The tiny-Qwen runs behind figure 7 and notebook 04: llm_probe.experiments.demo's grid, cached in its output folder.

A finished folder is reused when its configuration matches (``paper_figs_config.json``); otherwise the
demo runs. :func:`llm_claims` states WAPO's stability claim against the runs as :class:`gapdyn.Claim` records.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

import gapdyn
from gapdyn.io import atomic_write_text

from ._common import NotAvailable, _import

__all__ = ["LLMResults", "llm_demo_config", "load_llm", "read_llm_results", "llm_headline", "llm_claims", "reward_outcomes"]


class LLMResults(NamedTuple):
    """The tiny-Qwen demo's outputs (llm_probe.experiments.demo.run_demo), as tables.

    runs: one row per run (llm_probe.experiments.demo.RUN_COLUMNS); metrics: per-step metrics of every run
    (method, lr, seed, step, reward, entropy, entropy/pos_adv, entropy/neg_adv, taxonomy/<bin>, ...);
    probes: per (run, probe step, probe prompt) rows of probe_prompts.jsonl (J_hat, M, ...) with
    method, lr, seed; alerts: one row per alert (method, lr, seed, step, rule, value, threshold);
    summary: summary.json; out_dir: where they live.
    """

    runs: pd.DataFrame
    metrics: pd.DataFrame
    probes: pd.DataFrame
    alerts: pd.DataFrame
    summary: dict
    out_dir: Path


def llm_demo_config(mode: str, out_dir: Path, *, seed: int | None = None, n_jobs: int = 1):
    """The llm_probe.experiments.demo.DemoConfig of a mode: "test" = 2 methods x 2 lrs x 2 seeds x 8 steps on a
    30-step warm-up; "quick" = 2 seeds x 60 steps (8 runs); "full" = 5
    seeds x 300 steps and lr 5e-4 added (the GRPO/WAPO contrast lives near 5e-4; use
    >= 5 seeds). Everything else is llm_probe's default; ``n_jobs`` parallel runs (joblib)."""
    demo = _import("llm_probe.experiments.demo", "the tiny-Qwen figure")
    base = 0 if seed is None else int(seed)
    sizes = {
        "test": dict(seeds=(base, base + 1), steps=8, prompts_per_step=4, group_size=4, probe_every=2, probe_prompts=4,
                     warmup_steps=30),
        "quick": dict(seeds=tuple(base + i for i in range(2)), steps=60),
        "full": dict(seeds=tuple(base + i for i in range(5)), steps=300, lrs=(3e-4, 5e-4, 1e-3)),
    }[mode]
    jobs = (os.cpu_count() or 1) if int(n_jobs) < 0 else max(1, int(n_jobs))
    return demo.DemoConfig(out_dir=str(out_dir), num_threads=1, n_jobs=jobs, **sizes)


def load_llm(mode: str, out_dir: Path, *, seed: int | None, progress: bool, n_jobs: int = 1) -> LLMResults:
    """Reuse ``out_dir`` when it holds a finished demo run, else run the mode's grid there.

    A folder written by paper_figs carries ``paper_figs_config.json`` and is reused only for the same
    configuration; a finished folder without it (e.g. ``gapdyn train demo --out DIR``, passed with
    ``--llm-dir DIR``) is used as it is."""
    demo = _import("llm_probe.experiments.demo", "the tiny-Qwen figure")
    cfg = llm_demo_config(mode, out_dir, seed=seed, n_jobs=n_jobs)
    stamp = out_dir / "paper_figs_config.json"
    want = json.dumps({k: v for k, v in dataclasses.asdict(cfg).items() if k != "n_jobs"}, sort_keys=True,
                      default=str)
    finished = (out_dir / "runs.parquet").exists()
    done = finished and (not stamp.exists() or stamp.read_text() == want)
    if not done:
        out_dir.mkdir(parents=True, exist_ok=True)
        stamp.unlink(missing_ok=True)
        if progress:  # keep the demo's own "demo runs" bar, drop transformers' per-load bars
            with contextlib.suppress(ImportError):
                from transformers.utils import logging as hf_logging

                hf_logging.disable_progress_bar()
        quiet = contextlib.redirect_stderr(io.StringIO()) if not progress else contextlib.nullcontext()
        # the demo's own tqdm bars (and transformers' loading bars) write to stderr; its runs' alert lines go to
        # stdout, into the caller's bar: kept out (every run's alerts.json holds them, figure 7 (f) draws them)
        with quiet, contextlib.redirect_stdout(io.StringIO()):
            demo.run_demo(cfg)
        atomic_write_text(stamp, want)
    return read_llm_results(out_dir)


def read_llm_results(out_dir) -> LLMResults:
    """Read a finished ``llm_probe.experiments.demo`` output folder into :class:`LLMResults`."""
    out_dir = Path(out_dir)
    if not (out_dir / "runs.parquet").exists():
        raise NotAvailable(f"no finished llm_probe demo in {out_dir} (runs.parquet missing)")
    runs = pd.read_parquet(out_dir / "runs.parquet")
    metrics = pd.read_parquet(out_dir / "metrics_all.parquet")
    probes, alerts = [], []
    for r in runs.itertuples(index=False):
        d = out_dir / f"{r.method}_lr{r.lr:g}_s{r.seed}"
        tag = {"method": r.method, "lr": float(r.lr), "seed": int(r.seed)}
        pp = d / "probe_prompts.jsonl"
        if pp.exists() and pp.stat().st_size:
            probes.append(pd.read_json(pp, lines=True).assign(**tag))
        al = d / "alerts.json"
        if al.exists():
            alerts += [{**tag, **a} for a in json.loads(al.read_text())]
    summary = json.loads((out_dir / "summary.json").read_text()) if (out_dir / "summary.json").exists() else {}
    return LLMResults(
        runs=runs,
        metrics=metrics,
        probes=pd.concat(probes, ignore_index=True) if probes else pd.DataFrame(
            columns=["step", "prompt_id", "J_hat", "M", "method", "lr", "seed"]),
        alerts=pd.DataFrame(alerts, columns=["method", "lr", "seed", "step", "rule", "value", "threshold"]),
        summary=summary,
        out_dir=out_dir,
    )


def reward_outcomes(res: LLMResults) -> pd.Series:
    """Each run's outcome (llm_probe.collapse.reward_outcome on its per-step mean rewards, with its alerts as
    events): collapsed / recovered / healthy / failed, indexed like ``res.runs``. The runs table's
    ``alerted`` column says whether an alert fired (an event), not this."""
    from llm_probe.collapse import reward_outcome

    out = []
    for r in res.runs.itertuples(index=False):
        m = res.metrics[(res.metrics["method"] == r.method) & np.isclose(res.metrics["lr"], r.lr)
                        & (res.metrics["seed"] == r.seed)].sort_values("step")
        a = res.alerts[(res.alerts["method"] == r.method) & np.isclose(res.alerts["lr"], r.lr)
                       & (res.alerts["seed"] == r.seed)]
        rewards = m["reward"].to_numpy(float)
        out.append(reward_outcome(rewards, alerts=[{"step": int(s), "rule": str(u)} for s, u in zip(a["step"], a["rule"])]
                               ).label if len(rewards) else "failed")
    return pd.Series(out, index=res.runs.index, name="outcome")


def llm_headline(res: LLMResults) -> dict:
    """Per (method, lr): runs, runs with an alert (events, not outcomes), mean reward over the first and last 25
    steps."""
    out: dict[str, object] = {}
    for (m, lr), g in res.runs.groupby(["method", "lr"], sort=True):
        key = f"{m} lr={lr:g}"
        out[f"{key}: runs"] = int(len(g))
        out[f"{key}: alerted"] = int(g["alerted"].sum())
        out[f"{key}: reward first 25"] = float(g["reward_first25"].mean())
        out[f"{key}: reward last 25"] = float(g["reward_last25"].mean())
    alerted = res.runs[res.runs["alerted"].astype(bool)]
    out["alerted runs"] = "; ".join(f"{r.method} lr={r.lr:g} seed={r.seed} ({r.alert_rule}@{r.alert_step})"
                                    for r in alerted.itertuples()) or "none"
    return out


def llm_claims(res: LLMResults, *, n_resamples: int = 2000) -> list:
    """WAPO's stability claims on the demo's tiny-Qwen runs (a smoke test at CPU scale): per lr, runs paired
    by seed, the claims of :func:`llm_probe.experiments.ablation.wapo_grpo_claims` (criteria and hash from
    ``llm_probe.experiments.ablation.CRITERIA``), Holm over all of them; discovery block (seeds 0, 1, ...). A run
    counts as collapsed when it ends collapsed (:func:`reward_outcomes`), failed runs apart; an alert is not a
    collapse."""
    from llm_probe.experiments.ablation import CRITERIA_HASH, block_of, wapo_grpo_claims

    runs = res.runs
    if not {"grpo", "wapo"} <= set(runs["method"]):
        return []
    outcome = reward_outcomes(res)
    runs = runs.assign(collapsed=outcome == "collapsed", failed=outcome == "failed")
    rng = np.random.default_rng(0)
    claims = [c for lr in sorted(runs["lr"].unique()) for c in wapo_grpo_claims(runs, lr, rng=rng, n_boot=n_resamples)]
    block = block_of(runs["seed"])
    return gapdyn.holm_adjust_claims([dataclasses.replace(c, block=block, criteria_hash=CRITERIA_HASH) for c in claims])
