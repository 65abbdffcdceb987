"""``python -m benchmarks.threads [--warmup-steps N] [--rl-steps N] [--small] [--out FILE]``: torch threads
and the OpenMP wait policy on the tiny Qwen.

Each configuration (1 or 2 intra-op threads x ``OMP_WAIT_POLICY=PASSIVE`` or unset) runs in a fresh
subprocess, since OpenMP reads the policy once, when torch is first imported; the subprocess imports torch
before llm_probe (whose import would otherwise set PASSIVE) and runs with ``OMP_DISPLAY_ENV=VERBOSE``, so
the spin count OpenMP really uses is read back from its start-up report (PASSIVE: 0; unset: 300000).
In each: the tiny Qwen (TinyQwenSpec defaults, seed 0) warmed up N steps (batch 128, Adam 1e-3), then a
GRPO Trainer on it (B = 16 prompts x G = 8, probes off) runs one untimed and ``--rl-steps`` timed steps.
Reported: seconds, the ratio to 1 thread + PASSIVE, the load average before and after each subprocess, and
a sha256 of the warmed weights (and of the weights after the RL steps).

The configurations run in ``--rounds`` rounds, every other one in reverse order (ABBA: a load that drifts
over the run hits all alike); a cell shows each round's seconds and their median.

Bit identity: every configuration is a fresh process; the digests of all 1-thread processes (either wait
policy: the policy changes no arithmetic) are compared, likewise the 2-thread ones, and 1 vs 2 threads.
Same thread count -> the same bits is what llm_probe guarantees (llm_probe/threads.py); 1 vs 2 threads is
reported, not promised (a reduction split over two threads adds in another order).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from gapdyn.cmdline import command, optional, parse

from .timing import emit_report, load_average

__all__ = ["CONFIGS", "weights_digest", "warm_digest", "run_config", "run_all", "format_report", "ThreadsConfig",
           "main"]

CONFIGS = ((1, "PASSIVE"), (2, "PASSIVE"), (1, "unset"), (2, "unset"))
"""(threads, OMP_WAIT_POLICY) per subprocess, in the order of the first round."""

ROOT = Path(__file__).resolve().parents[1]


def weights_digest(model) -> str:
    """sha256 over (name, dtype, shape, raw bytes) of every state_dict tensor, in state_dict order."""
    import torch

    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        t = t.detach().cpu().contiguous().reshape(-1)
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _spec(small: bool):
    from llm_probe import TinyQwenSpec

    if small:  # the tests' size
        return TinyQwenSpec(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=8)
    return TinyQwenSpec()


def warm_digest(steps: int, *, small: bool = False, seed: int = 0, batch_size: int = 128):
    """(model, tokenizer, task, warm-up seconds, weights_digest) after ``steps`` warm-up steps, with the
    process's configured torch threads (llm_probe.threads)."""
    from llm_probe import AdditionTask, build_char_tokenizer, build_tiny_qwen, warmup

    tok, task = build_char_tokenizer(), AdditionTask()
    model = build_tiny_qwen(tok, _spec(small), seed=seed)
    t0 = time.perf_counter()
    warmup(model, tok, task, steps=steps, batch_size=batch_size, lr=1e-3, seed=seed)
    return model, tok, task, time.perf_counter() - t0, weights_digest(model)


def _child(threads: int, warmup_steps: int, rl_steps: int, small: bool) -> dict:
    import tempfile

    import torch  # noqa: F401  (before llm_probe: the policy in force is the one this process was given)

    from llm_probe import Trainer, TrainConfig
    from llm_probe.threads import configure_threads

    n = configure_threads(threads)
    model, tok, task, t_warm, digest = warm_digest(warmup_steps, small=small)
    out = {"threads": n, "warmup_s": t_warm, "warm_digest": digest}
    if rl_steps:
        with tempfile.TemporaryDirectory(prefix="gapdyn_threads_") as tmp:
            tr = Trainer(TrainConfig(out_dir=tmp, method="grpo", seed=0, steps=10**6, prompts_per_step=16,
                                     group_size=8, max_new_tokens=6, lr=3e-4, warmup_steps=0, probe_every=0,
                                     probe_prompts=0, num_threads=threads, device="cpu", progress=False),
                         model=model, tokenizer=tok, task=task)
            tr.train_step()  # untimed: lazy allocations, optimizer state
            times = []
            for _ in range(rl_steps):
                t0 = time.perf_counter()
                tr.train_step()
                times.append(time.perf_counter() - t0)
        out.update(rl_step_s=sorted(times)[len(times) // 2], rl_digest=weights_digest(model))
    return out


def _spincount(stderr: str) -> str:
    for line in stderr.splitlines():
        if "GOMP_SPINCOUNT" in line:
            return line.split("=", 1)[1].strip().strip("'")
    return "?"


def run_config(threads: int, policy: str, *, warmup_steps: int, rl_steps: int, small: bool = False,
               timeout: float = 120.0) -> dict:
    """One configuration in a fresh subprocess (module doc); its measurements plus load and spin count."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                                               "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(PYTHONPATH=str(ROOT), OMP_DISPLAY_ENV="VERBOSE", GAPDYN_TORCH_THREADS=str(threads))
    if policy != "unset":
        env["OMP_WAIT_POLICY"] = policy
    cmd = [sys.executable, "-m", "benchmarks.threads", "--child", str(threads), "--warmup-steps",
           str(warmup_steps), "--rl-steps", str(rl_steps)] + (["--small"] if small else [])
    row = {"threads": threads, "policy": policy, "load_before": load_average()[0]}
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        row.update(error=f"timed out after {timeout:.0f} s", load_after=load_average()[0])
        return row
    row.update(wall_s=time.perf_counter() - t0, load_after=load_average()[0], spincount=_spincount(p.stderr))
    if p.returncode != 0:
        row["error"] = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}"
        return row
    row.update(json.loads(p.stdout.strip().splitlines()[-1]))
    return row


def run_all(*, warmup_steps: int = 20, rl_steps: int = 3, rounds: int = 2, small: bool = False,
            configs=CONFIGS) -> list[dict]:
    """run_config for each of ``configs``, ``rounds`` times, every other round in reverse order (A B C D, D C B
    A, ...: a load that drifts linearly over the run hits every configuration alike); rows carry ``round``."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    rows = []
    for k in range(rounds):
        for t, pol in (configs if k % 2 == 0 else configs[::-1]):
            rows.append({"round": k, **run_config(t, pol, warmup_steps=warmup_steps, rl_steps=rl_steps, small=small)})
    return rows


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return 0.5 * (xs[(len(xs) - 1) // 2] + xs[len(xs) // 2])


def format_report(rows: list[dict], warmup_steps: int, rl_steps: int) -> str:
    """Markdown table (per configuration: the rounds' seconds, their median and its ratio to 1 thread +
    PASSIVE) and the bit-identity lines."""
    ok = [r for r in rows if "error" not in r]
    cfgs = list(dict.fromkeys((r["threads"], r["policy"]) for r in rows))
    med = {}
    for c in cfgs:
        mine = [r for r in ok if (r["threads"], r["policy"]) == c]
        med[c] = {k: _median([r[k] for r in mine]) if mine and k in mine[0] else None
                  for k in ("warmup_s", "rl_step_s")}
    ref = med.get((1, "PASSIVE"), {})
    lines = [f"warm-up: {warmup_steps} steps (batch 128); RL: median of {rl_steps} GRPO steps (B=16 x G=8); "
             "cells: each round's seconds, median, median / median of 1 thread + PASSIVE", "",
             "| threads | OMP_WAIT_POLICY | GOMP_SPINCOUNT | warm-up s | vs 1/PASSIVE | RL step s | vs 1/PASSIVE "
             "| load (1 min) during |", "|---|---|---|---|---|---|---|---|"]
    for c in cfgs:
        mine = [r for r in rows if (r["threads"], r["policy"]) == c]
        errors = [r["error"] for r in mine if "error" in r]
        loads = [x for r in mine for x in (r["load_before"], r["load_after"])]
        cells = []
        for k in ("warmup_s", "rl_step_s"):
            m, m0 = med[c][k], ref.get(k)
            vals = ", ".join(f"{r[k]:.3g}" for r in mine if k in r)
            cells += [f"{vals} (median {m:.3g})" if m is not None else "",
                      f"{m / m0:.2f}x" if m is not None and m0 else ""]
        spin = ", ".join(sorted({r.get("spincount", "?") for r in mine}))
        lines.append(f"| {c[0]} | {c[1]} | {spin} | " + " | ".join(cells)
                     + f" | {min(loads):.2f} - {max(loads):.2f} |" + (f" errors: {'; '.join(errors)}" if errors else ""))
    lines.append("")
    for key, what in (("warm_digest", "warmed weights"), ("rl_digest", "weights after the RL steps")):
        if not rl_steps and key == "rl_digest":
            continue
        for n in (1, 2):
            same = _same([r for r in ok if r["threads"] == n], key)
            if same is not None:
                lines.append(f"{what}, {n} thread(s), {sum(r['threads'] == n for r in ok)} fresh processes: "
                             f"{'bit-identical' if same else 'DIFFER'}")
        one = [r for r in ok if r["threads"] == 1][:1]
        two = [r for r in ok if r["threads"] == 2][:1]
        if one and two:
            lines.append(f"{what}, 1 vs 2 threads: {'bit-identical' if _same(one + two, key) else 'differ'}")
    return "\n".join(lines)


def _same(rows: list[dict], key: str) -> bool | None:
    """Whether every row has the same ``key`` (None: fewer than two rows)."""
    return None if len(rows) < 2 else len({r.get(key) for r in rows}) == 1


@dataclass
class ThreadsConfig:
    """torch threads x the OpenMP wait policy on the tiny Qwen, each configuration in a fresh subprocess."""

    warmup_steps: int = 20
    """Warm-up steps per configuration."""
    rl_steps: int = 3
    """Timed RL steps per configuration (0: none)."""
    rounds: int = 2
    """Rounds over the configurations (ABBA order)."""
    small: bool = False
    """Hidden 32 (the tests' model) instead of the default."""
    out: Annotated[str | None, optional("FILE")] = None
    """Also write the report to this file."""
    child: Annotated[int | None, optional("THREADS")] = None
    """Run only this thread count in this process and print its row as JSON (what each subprocess runs)."""


@command("python -m benchmarks.threads")
def main(argv: list[str]) -> int:
    a = parse(ThreadsConfig, argv, prog="python -m benchmarks.threads")
    if a.warmup_steps < 0 or a.rl_steps < 0:
        raise ValueError(f"--warmup-steps and --rl-steps must be >= 0, got {a.warmup_steps}, {a.rl_steps}")
    if a.child is not None:
        print(json.dumps(_child(a.child, a.warmup_steps, a.rl_steps, a.small)))
        return 0
    t0 = time.perf_counter()
    rows = run_all(warmup_steps=a.warmup_steps, rl_steps=a.rl_steps, rounds=a.rounds, small=a.small)
    emit_report("torch threads x OpenMP wait policy", "python -m benchmarks.threads " + " ".join(argv),
                format_report(rows, a.warmup_steps, a.rl_steps), a.out,
                details=(f"{os.cpu_count()} cores", f"wall {time.perf_counter() - t0:.0f} s"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
