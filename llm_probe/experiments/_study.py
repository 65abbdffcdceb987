"""What the LLM studies share: the split addition task, a run folder's held-out evaluations and its outcome, and
the block (discovery or confirmation) of a set of seeds. Used by the ablation (which re-exports these names), the
early-warning, pinned-checkpoint and entropy studies."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from gapdyn.evidence.claims import CONFIRMATION_SEEDS

from ..collapse import OUTCOME_WINDOW, RewardOutcome, reward_outcome

__all__ = ["CONFIRMATION_START", "SplitAddition", "outcome_from_rows", "folder_outcome", "read_evals", "block_of"]

CONFIRMATION_START = CONFIRMATION_SEEDS[0]
"""Seeds >= this are confirmation seeds (gapdyn.CONFIRMATION_SEEDS starts the range); smaller ones are discovery."""


# ---- the split task ------------------------------------------------------------------------------------------
class SplitAddition:
    """Two-digit addition with held-out pairs: (a, b) is held out iff (7a + 3b) % mod == 0.

    :meth:`sample` draws only training pairs (rejection from AdditionTask's uniform draw); :meth:`heldout`
    returns held-out problems (a fixed order set by ``rng``)."""

    name = "addition-split"

    def __init__(self, mod: int = 20):
        from ..tasks import AdditionTask

        if int(mod) < 2:
            raise ValueError(f"mod must be >= 2, got {mod}")
        self.base, self.mod = AdditionTask(), int(mod)
        self.cache_key = f"addition-split:{self.base.lo}-{self.base.hi}:{self.mod}"  # llm_probe.warmup.task_key

    def is_heldout(self, a: int, b: int) -> bool:
        return (7 * a + 3 * b) % self.mod == 0

    def _draw(self, rng, n, keep):
        from ..tasks import Problem

        out = []
        while len(out) < n:
            ab = rng.integers(self.base.lo, self.base.hi + 1, size=(2 * (n - len(out)) + 8, 2))
            out += [Problem(f"{a}+{b}=", str(a + b)) for a, b in ab.tolist() if self.is_heldout(a, b) == keep]
        return out[:n]

    def sample(self, rng: np.random.Generator, n: int):
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        return self._draw(rng, n, False)

    def heldout(self, rng: np.random.Generator, n: int):
        return self._draw(rng, n, True)

    def reward(self, completion, problem, *, terminated):
        return self.base.reward(completion, problem, terminated=terminated)

    def max_answer_len(self):
        return self.base.max_answer_len()


# ---- run outcomes ------------------------------------------------------------------------------------------
def outcome_from_rows(rows: list, done: dict, evals: list, *, window: int = OUTCOME_WINDOW) -> RewardOutcome:
    """The run outcome (llm_probe.collapse.reward_outcome) of one run: rewards from its metrics rows (step order),
    alerts from the rows' ``alerts`` (step, rule), held-out accuracies from ``evals`` (step 0 first), the fault
    from ``done`` (its ``fault`` message; older summaries mark it ``collapse_rule == "faults"``)."""
    if not isinstance(done, dict):
        raise ValueError(f"done must be a run summary dict, got {type(done).__name__}")
    if not rows:
        return reward_outcome([np.nan], fault=True, window=window)
    rewards = [r.get("reward", np.nan) for r in sorted(rows, key=lambda r: r["step"])]
    alerts = [{"step": int(r["step"]), "rule": rule} for r in rows for rule in r.get("alerts", [])]
    acc = [e["acc"] for e in sorted(evals, key=lambda e: e["step"])]
    fault = done.get("fault") or done.get("collapse_rule") == "faults"
    return reward_outcome(rewards, alerts=alerts, heldout=acc if len(acc) >= 2 else None, fault=bool(fault),
                       window=window)


def folder_outcome(d, *, window: int = OUTCOME_WINDOW) -> RewardOutcome:
    """:func:`outcome_from_rows` of a finished run folder (metrics.jsonl, done.json, eval.jsonl)."""
    d = Path(d)
    if not (d / "done.json").exists():
        raise ValueError(f"d must be a finished run folder (with done.json), got {d}")
    f = d / "metrics.jsonl"
    rows = [json.loads(ln) for ln in f.read_text().splitlines() if ln.strip()] if f.exists() else []
    return outcome_from_rows(rows, json.loads((d / "done.json").read_text()), read_evals(d), window=window)


def read_evals(path) -> list:
    """The rows of a run folder's eval.jsonl (held-out accuracy and entropy by step); [] without the file."""
    f = Path(path) / "eval.jsonl"
    return [json.loads(ln) for ln in f.read_text().splitlines() if ln.strip()] if f.exists() else []


def block_of(seeds) -> str:
    """"confirmation" when every seed is a confirmation seed (>= :data:`CONFIRMATION_START`), else "discovery"."""
    seeds = set(int(s) for s in seeds)
    return "confirmation" if seeds and min(seeds) >= CONFIRMATION_START else "discovery"
