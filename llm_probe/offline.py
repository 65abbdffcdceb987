"""Offline Gradient-Gap analysis of one recorded step: two checkpoints and the rollout that produced it.

    gapdyn train offline --before DIR --after DIR --rollouts FILE.jsonl --out DIR

``--before`` / ``--after``: local ``save_pretrained`` directories (model + tokenizer; theta_k and theta_{k+1};
loaded with ``from_pretrained(local_dir, local_files_only=True)``). ``--rollouts``: JSONL, one completion a line,
{"prompt": str, "completion": str, "reward": number} (optionally "completion_ids": [int] and "prompt_ids": [int],
which then replace the texts, and "temperature": the policy scored is log softmax(z / T), 1 when absent; a "step"
field selects lines with ``--step``), grouped by prompt. GapProbeCallback's ``rollout_path`` writes all of them. The gaps are taken at ``--before`` and the step is w = after - before
(llm_probe.measure). Writes ``offline_gap.json`` (summary, ``gap/*`` metrics) and ``per_prompt.jsonl`` (one
line per prompt: J_hat, mixed, phi, gap norm, dmu, cos) into ``--out``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from .measure import measure
from .model import load_policy
from .tasks import iter_jsonl_objects

__all__ = ["load_rollouts", "select_step", "analyse", "write_report"]


def load_rollouts(path: str | Path) -> list[dict]:
    """The records of a rollout JSONL; ValueError with the line number for a malformed line."""
    p = Path(path)
    out = []
    for n, obj in iter_jsonl_objects(p, name="rollouts"):
        if (not isinstance(obj.get("prompt"), str) or not obj["prompt"]) and obj.get("prompt_ids") is None:
            raise ValueError(f"{p.name}: line {n} lacks a non-empty 'prompt' string (or 'prompt_ids')")
        ids = obj.get("completion_ids")
        if ids is not None and not (isinstance(ids, list) and ids and all(isinstance(t, int) for t in ids)):
            raise ValueError(f"{p.name}: line {n}: 'completion_ids' must be a non-empty list of ints")
        if ids is None and not isinstance(obj.get("completion"), str):
            raise ValueError(f"{p.name}: line {n} lacks a 'completion' string (or 'completion_ids')")
        pids = obj.get("prompt_ids")
        if pids is not None and not (isinstance(pids, list) and pids and all(isinstance(t, int) for t in pids)):
            raise ValueError(f"{p.name}: line {n}: 'prompt_ids' must be a non-empty list of ints")
        T = obj.get("temperature", 1.0)
        if isinstance(T, bool) or not isinstance(T, (int, float)) or not math.isfinite(T) or T <= 0:
            raise ValueError(f"{p.name}: line {n}: 'temperature' must be a finite number > 0")
        rw = obj.get("reward")
        if isinstance(rw, bool) or not isinstance(rw, (int, float)) or not math.isfinite(rw):
            raise ValueError(f"{p.name}: line {n} lacks a finite numeric 'reward'")
        out.append(obj)
    if not out:
        raise ValueError(f"{p.name}: the file holds no rollout (empty)")
    return out


def select_step(recs: list[dict], step: int | None) -> list[dict]:
    """The records of one step: those whose "step" equals ``step``; with ``step`` None the file must hold one step
    (or none named)."""
    steps = sorted({r["step"] for r in recs if "step" in r})
    if step is None:
        if len(steps) > 1:
            raise ValueError(f"rollouts hold steps {steps[:5]}...; choose one with step (--step)")
        return recs
    out = [r for r in recs if r.get("step") == step]
    if not out:
        raise ValueError(f"step {step} is not in the rollouts (steps: {steps[:10]})")
    return out


def analyse(before: str | Path, after: str | Path, rollouts: str | Path, *, params: str = "all", route: str = "auto",
            device: str = "cpu", dtype: str = "float32", append_eos: bool = False, step: int | None = None) -> dict:
    """:func:`llm_probe.measure.measure` at the ``before`` checkpoint with w = after - before, on the lines' token
    ids where they carry them and at their temperature."""
    model, tok = load_policy(before, dtype=dtype, device=device)
    after_model, _ = load_policy(after, dtype=dtype, device="cpu")
    after_sd = {n: p.detach() for n, p in after_model.named_parameters()}
    del after_model
    before_sd = {n: p.detach().to("cpu") for n, p in model.named_parameters()}
    recs = select_step(load_rollouts(rollouts), step)
    temps = {float(r.get("temperature", 1.0)) for r in recs}
    if len(temps) > 1:
        raise ValueError(f"rollouts: the step's lines carry different temperatures {sorted(temps)}")
    prompts = [r["prompt_ids"] if r.get("prompt_ids") is not None
               else tok(r["prompt"], add_special_tokens=False)["input_ids"] for r in recs]
    comps = [r["completion_ids"] if r.get("completion_ids") is not None
             else tok(r["completion"], add_special_tokens=False)["input_ids"] for r in recs]
    eos = tok.eos_token_id if append_eos else None
    res = measure(model, None, prompts, comps, [float(r["reward"]) for r in recs], update=(before_sd, after_sd),
                  params=params, route=route, eos_id=eos, temperature=temps.pop())
    text = {}
    for r, p in zip(recs, prompts):
        text.setdefault(tuple(p), r["prompt"])
    res["prompt_text"] = [text[tuple(k)] for k in res["prompts"]]
    return res


def write_report(res: dict, out: str | Path, *, before, after, rollouts) -> dict:
    """``offline_gap.json`` (the summary, returned) and ``per_prompt.jsonl`` of an :func:`analyse` result in ``out``
    (created); ``before``, ``after``, ``rollouts`` are recorded in the summary. The command line (``gapdyn train
    offline``) is llm_probe.cli's."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    q_of = {int(b): q for q, b in enumerate(res["groups"].tolist())}
    with open(out / "per_prompt.jsonl", "w") as f:
        for b, prompt in enumerate(res["prompt_text"]):
            row = {"prompt": prompt, "J_hat": float(res["J_hat"][b]), "mixed": bool(res["mixed"][b])}
            q = q_of.get(b)
            if q is not None:
                row.update(phi=float(res["phi"][q]), gap_norm=float(res["gap_norm"][q]), dmu=float(res["dmu"][q]),
                           cos=float(res["cos"][q]))
            f.write(json.dumps(row) + "\n")
    summary = {"before": str(before), "after": str(after), "rollouts": str(rollouts), "route": res["route"],
               "n_prompts": len(res["prompts"]), "n_mixed": int(res["mixed"].sum()),
               "update_norm": res["update_norm"], "M_increment": res["M_increment"], **res["metrics"]}
    (out / "offline_gap.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
