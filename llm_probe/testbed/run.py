"""One testbed run: RL from the pinned warm start, held-out evaluation at a fixed cadence, the outcome against the
pre-RL start (llm_probe.testbed.outcome), and ``summary.json``.

The setting (:class:`TestbedSetting`) is what a study cell fixes; a run adds its seed (prompt stream, sampler,
control permutations). Held-out evaluations use generators of their own, so evaluating never changes the training
trajectory: the evaluation before the first update (step 0, sampled and greedy), every ``eval_every`` steps, and
after the last step (sampled and greedy).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..config import check_settings
from .outcome import rl_outcome
from .task import LENGTHS, ScratchpadAddition

__all__ = ["TestbedSetting", "DEFAULT_LR", "run_testbed", "SUMMARY", "HEAD_LOG", "HEAD_KEYS", "read_head_log"]

DEFAULT_LR = 1e-4
"""The documented learning lr of the default setting (Adam, GRPO, long scratchpad, small model)."""
SUMMARY = "summary.json"
HEAD_LOG = "lm_head.jsonl"
"""Per step: the LM head's gradient norm (before any clipping) and the norm of its weight change, the statistic of
Dynamic Gradient Gating (arXiv 2605.19425) as a baseline detector; one row per step (a skipped step: no gradient,
``grad_norm`` null)."""
HEAD_KEYS = {"grad_norm": "lm_head/grad_norm", "update_norm": "lm_head/update_norm"}
"""The LM head's per-step statistics as they appear among a run's series and in an exported steps.csv."""
_INF = float("inf")
_RANGES = {"lr": ("float", 0, _INF, False, False), "steps": ("int", 1, _INF, True, False),
           "eval_every": ("int", 1, _INF, True, False), "n_heldout": ("int", 1, _INF, True, False),
           "prompts_per_step": ("int", 1, _INF, True, False)}
"""TestbedSetting's numeric settings (llm_probe.config.check_settings: kind, bounds)."""


def read_head_log(folder: str | Path) -> dict[int, dict]:
    """A run folder's :data:`HEAD_LOG` as step -> {HEAD_KEYS name: value} (null values left out); {} when the run
    did not log it."""
    p = Path(folder) / HEAD_LOG
    if not p.is_file():
        return {}
    out = {}
    for ln in p.read_text().splitlines():
        if ln.strip():
            h = json.loads(ln)
            out[int(h["step"])] = {name: h[k] for k, name in HEAD_KEYS.items() if h.get(k) is not None}
    return out


@dataclass(frozen=True)
class TestbedSetting:
    """What a testbed cell fixes. Optimiser: torch Adam, betas (0.9, 0.999), eps 1e-8, no weight decay, no
    gradient clipping, lr warm-up over ``lr_warmup_steps`` (linear), no KL term; temperature 1."""

    method: str = "grpo"
    lr: float = DEFAULT_LR
    steps: int = 100
    size: str = "small"
    length: str = "long"
    prompts_per_step: int = 16
    group_size: int = 8
    lr_warmup_steps: int = 10
    control: bool = False
    """The random-advantage control (TrainConfig.shuffle_rewards)."""
    eval_every: int = 10
    n_heldout: int = 256
    probe_every: int = 0
    safe_step: bool = False
    """Scale each step by the safe step rule (TrainConfig.safe_step; its c and delta at their defaults)."""

    def __post_init__(self):
        if self.length not in LENGTHS:
            raise ValueError(f"length must be one of {LENGTHS}, got {self.length!r}")
        check_settings(self, _RANGES)


def _evaluate(model, tok, task, problems, max_new: int, seed: int, idx: int, *, greedy: bool = False):
    from ..seeds import derive_seed
    from .evaluate import heldout_accuracy

    stream = int(np.random.SeedSequence([derive_seed(seed, "testbed_eval"), idx]).generate_state(1, np.uint64)[0])
    return heldout_accuracy(model, tok, task, problems, max_new_tokens=max_new, greedy=greedy,
                            seed=stream >> 1)


def run_testbed(setting: TestbedSetting, seed: int, out: str | Path, *, warm_dir: str | Path | None = None,
                progress: bool = False) -> dict:
    """Run one testbed cell on ``seed`` into ``out``; returns (and writes) summary.json's dict.

    ``warm_dir``: a saved model folder to start from instead of the pinned checkpoint of ``setting.size``."""
    import torch

    from ..config import TrainConfig
    from ..model import load_policy
    from ..trainer import FaultError, Trainer
    from .warm import file_sha256, pinned_testbed

    out = Path(out)
    d = Path(warm_dir) if warm_dir is not None else pinned_testbed(setting.size)
    model, tok = load_policy(d, device="cpu")
    task = ScratchpadAddition(length=setting.length)
    max_new = task.max_completion_tokens() + 4
    held = task.heldout()[:setting.n_heldout]
    cfg = TrainConfig(out_dir=str(out), method=setting.method, seed=int(seed), steps=setting.steps,
                      prompts_per_step=setting.prompts_per_step, group_size=setting.group_size,
                      max_new_tokens=max_new, lr=setting.lr, lr_warmup_steps=setting.lr_warmup_steps,
                      shuffle_rewards=setting.control, probe_every=setting.probe_every, probe_prompts=0,
                      warmup_steps=0, progress=progress, device="cpu", safe_step=setting.safe_step)
    t0 = time.perf_counter()
    before = _evaluate(model, tok, task, held, max_new, seed, 0)
    before_greedy = _evaluate(model, tok, task, held, max_new, seed, 0, greedy=True)
    trainer = Trainer(cfg, model=model, tokenizer=tok, task=task)
    evals = []
    head = trainer.model.get_output_embeddings().weight
    head_before = [head.detach().clone()]
    head_log = (out / HEAD_LOG).open("a")

    def on_step(tr, k, m):
        with torch.no_grad():  # the LM head's gradient norm and weight change of step k (arXiv 2605.19425's signal)
            g = head.grad
            row = {"step": k, "grad_norm": float(g.norm()) if g is not None else None,
                   "update_norm": float((head.detach() - head_before[0]).norm())}
            head_before[0] = head.detach().clone()
        head_log.write(json.dumps(row) + "\n")
        head_log.flush()
        if (k + 1) % setting.eval_every == 0 or k + 1 == setting.steps:
            e = _evaluate(tr.model, tok, task, held, max_new, seed, k + 1)
            evals.append({"step": k + 1, **e})

    try:
        result = trainer.run(on_step=on_step, checkpoint=False)
    except FaultError as exc:  # max_faults non-finite steps in a row: the run is labelled failed, not lost
        result = {"faults": trainer.faults, "fault_reason": str(exc)}
    finally:
        head_log.close()
    after_greedy = _evaluate(trainer.model, tok, task, held, max_new, seed, setting.steps, greedy=True)
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    rewards = [r.get("reward", np.nan) if not r.get("skipped") else np.nan for r in rows]
    R0 = float(json.loads((out / "baseline.json").read_text())["reward"])
    outcome = rl_outcome([(e["step"], e["acc"]) for e in evals], rewards, A0=before["acc"], R0=R0,
                         fault=bool(result.get("faults")) and len(rows) < setting.steps)
    summary = {
        "setting": asdict(setting), "seed": int(seed), "warm_sha256": file_sha256(d / "model.safetensors"),
        "heldout_acc_before": before["acc"], "heldout_acc_after": evals[-1]["acc"] if evals else None,
        "heldout_greedy_before": before_greedy["acc"], "heldout_greedy_after": after_greedy["acc"],
        "completion_tokens_median": evals[-1]["tokens_median"] if evals else None,
        "completion_tokens_median_before": before["tokens_median"],
        "reward_before": R0, "outcome": outcome.label, "outcome_detail": outcome.to_dict(),
        "evaluations": evals, "faults": result.get("faults", 0), "fault_reason": result.get("fault_reason"),
        "wall_s": time.perf_counter() - t0,
    }
    (out / SUMMARY).write_text(json.dumps(summary, indent=1))
    return summary


