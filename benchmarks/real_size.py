"""``python -m benchmarks.real_size [--optimizer adamw|sgd] [--prompts 4] [--G 4] [--T 64] [--out FILE]``: one
gap-probe step against one plain training step on a Qwen2.5-0.5B-shaped model, CPU, 1 thread (minutes).

The model: :func:`llm_probe.model.build_tiny_qwen` with the shape of Qwen2.5-0.5B (vocab 151936, hidden 896,
24 layers, 14 / 2 heads, intermediate 4864, tied embeddings; ~494M parameters; the shape of
:data:`benchmarks.probe_memory.QWEN25_05B`), random init, float32; nothing is downloaded. The batch: ``prompts``
random prompts of ``prompt_len`` tokens x ``G`` random completions of ``T`` tokens, rewards 1, 0, 1, 0, ... in
every group (every group mixed, so every prompt is probed). One fresh subprocess (``OMP_WAIT_POLICY=PASSIVE``,
``OMP_NUM_THREADS=1``, ``GAPDYN_TORCH_THREADS=1``; torch set to ``threads`` intra-op threads) measures, in order:

- base: the model, its gradients and the optimizer state alone (AdamW: exp_avg and exp_avg_sq, allocated by one
  step on zero gradients, which moves nothing), before any activation;
- plain: forward + backward of the GRPO loss (:func:`llm_probe.losses.policy_loss` "grpo", on-policy ratio 1) of
  the batch, then clipping to norm 1 (untimed);
- probe: what :class:`llm_probe.callback.GapProbeCallback` runs on this probed step, in its order: its copy of
  theta_k for the headroom and :meth:`llm_probe.gap_probe.GapProbe.before` (route "stream": at this size the
  callback's default "dot" switches to it, the gap matrix being Q x P x 4 B > 1 GiB), ``optimizer.step()``
  (timed apart: not the probe's), then :meth:`GapProbe.after` and the headroom
  (:func:`llm_probe.safe_step.step_rule`, one forward-mode pass over the batch).

Time: wall (``time.perf_counter``) and CPU seconds of the process (``time.process_time``: with 1 thread, less
sensitive to a shared machine's load than wall time) around each part. Memory: resident set size from
/proc/self/status (Linux): VmRSS after ``malloc_trim(0)`` at the start of a part, and the part's peak VmHWM,
reset through /proc/self/clear_refs before it (where /proc is missing: ``resource`` ru_maxrss, the peak since the
process started). A ratio is probe / plain of the same process.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Literal

from gapdyn.cmdline import command, optional, parse

from .probe_memory import QWEN25_05B
from .timing import emit_report, load_average

__all__ = ["RealSizeConfig", "measure", "run", "format_report", "main"]

ROOT = Path(__file__).resolve().parents[1]

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=64, vocab_size=512, tie_word_embeddings=True, max_position_embeddings=512)
"""A tiny model of the same family (the smoke test's size)."""


@dataclass
class RealSizeConfig:
    """One gap-probe step vs one plain GRPO training step on a Qwen2.5-0.5B-shaped model (CPU, float32)."""

    prompts: int = 4
    """Prompts B of the batch (B x G completions)."""
    G: int = 4
    """Completions per prompt."""
    T: int = 64
    """Completion length (tokens)."""
    prompt_len: int = 16
    """Prompt length (tokens)."""
    optimizer: Literal["adamw", "sgd"] = "adamw"
    """adamw (TRL's default; 2 x P floats of state) or sgd (no state: 3.7 GiB less at this size)."""
    lr: float = 1e-6
    """Learning rate of the one step."""
    threads: int = 1
    """torch intra-op threads."""
    tiny: bool = False
    """A tiny model of the same family (hidden 32, vocab 512) instead of the real shape: a smoke run."""
    out: Annotated[str | None, optional("FILE")] = None
    """Also write the report to this file."""
    child: bool = False
    """Measure in this process and print the row as JSON (what the subprocess runs)."""


class _Vocab:
    """What :func:`llm_probe.model.build_tiny_qwen` reads of a tokenizer: its size and the pad / eos ids
    (Qwen2.5's <|endoftext|> / <|im_end|> positions for the real vocabulary)."""

    def __init__(self, size: int):
        self.size = size
        self.pad_token_id, self.eos_token_id = (151643, 151645) if size == 151936 else (0, 1)

    def __len__(self) -> int:
        return self.size


def build_model(shape: dict, *, seed: int = 0):
    """A randomly initialised Qwen2ForCausalLM (float32, eager attention) of ``shape`` (QWEN25_05B keys)."""
    from llm_probe.model import TinyQwenSpec, build_tiny_qwen

    spec = TinyQwenSpec(**{k: v for k, v in shape.items() if k != "vocab_size"})
    return build_tiny_qwen(_Vocab(shape["vocab_size"]), spec, seed=seed)


def make_batch(vocab: int, B: int, G: int, T: int, prompt_len: int, *, seed: int = 1):
    """A Rollout of B random prompts x G random completions (no padding), rewards 1, 0, 1, ... per group."""
    import torch

    from llm_probe.rollout import Rollout

    g = torch.Generator().manual_seed(seed)
    N = B * G
    prompt = torch.randint(3, vocab - 300, (B, prompt_len), generator=g).repeat_interleave(G, 0)  # [N, L]
    comp = torch.randint(3, vocab - 300, (N, T), generator=g)  # [N, T] (below the special ids)
    rewards = torch.tensor([[float(i % 2 == 0) for i in range(G)]] * B)  # [B, G]
    return Rollout([None] * B, prompt, torch.ones(N, prompt_len, dtype=torch.long), comp, torch.ones(N, T),
                   torch.ones(N, dtype=torch.bool), [""] * N, rewards)


def _status_mib(field: str) -> float | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


class _Part:
    """Context manager: wall seconds and (start RSS, peak RSS) in MiB of one part (module docstring)."""

    def __enter__(self):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed heap back to the system: RSS = live memory
        except (OSError, AttributeError):
            pass
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset VmHWM to the current RSS
        except OSError:
            pass
        self.rss0 = _status_mib("VmRSS")
        self.t0, self.c0 = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.t0, time.process_time() - self.c0
        peak = _status_mib("VmHWM")
        self.peak = _maxrss_mib() if peak is None else peak
        return False


def measure(cfg: RealSizeConfig) -> dict:
    """The three parts (module docstring) in this process; seconds and MiB, and the probe's numbers."""
    import torch

    from llm_probe.gap_probe import GapProbe
    from llm_probe.losses import policy_loss
    from llm_probe.model import completion_logprobs
    from llm_probe.safe_step import step_rule
    from llm_probe.step_hook import Step
    from llm_probe.threads import configure_threads

    threads = configure_threads(cfg.threads)
    shape = TINY if cfg.tiny else QWEN25_05B
    t0 = time.perf_counter()
    model = build_model(shape)
    build_s = time.perf_counter() - t0
    model.train()
    P = sum(p.numel() for p in model.parameters())
    ro = make_batch(shape["vocab_size"], cfg.prompts, cfg.G, cfg.T, cfg.prompt_len)
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.zeros_like(p)
    if cfg.optimizer == "adamw":
        opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0, foreach=False)
    else:
        opt = torch.optim.SGD(params, lr=cfg.lr)
    opt.step()  # AdamW: allocates its state; a zero gradient moves nothing
    row = {"P": P, "threads": threads, "build_s": build_s, **{k: v for k, v in asdict(cfg).items()
                                                             if k not in ("out", "child")}}
    with _Part() as base:
        pass
    row["base_MiB"] = base.rss0

    with _Part() as plain:  # forward + backward of the GRPO loss
        logp = completion_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask)
        res = policy_loss("grpo", logp, logp.detach(), ro.completion_mask, ro.rewards, max_completion_length=cfg.T)
        res.loss.backward()
        del logp, res
    torch.nn.utils.clip_grad_norm_(params, 1.0)  # the callback reads the clipped gradient

    probe = GapProbe(model, "all", alignment="stream")
    with _Part() as before:  # on_pre_optimizer_step: the callback's theta_k copy (headroom), GapProbe.before
        theta_k = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
        probe.before(Step(ro))
    with _Part() as step:
        opt.step()
    with _Part() as after:  # on_optimizer_step: GapProbe.after
        out = probe.after()
    with _Part() as head:  # ... and the headroom
        d = {n: p.detach() - theta_k[n] for n, p in model.named_parameters() if n in theta_k}
        h = step_rule(model, ro, theta_k, d).headroom
        del d
    m = out.metrics
    for name, part in (("plain", plain), ("opt_step", step), ("before", before), ("after", after),
                       ("headroom", head)):
        row.update({f"{name}_s": part.wall, f"{name}_cpu_s": part.cpu, f"{name}_start_MiB": part.rss0,
                    f"{name}_peak_MiB": part.peak})
    row.update(
        n_prompts=m.get("gap/n_prompts", 0), dmu_update=out.dmu_update.tolist(),
        dmu_update_mean=m.get("gap/dmu_update_mean"), dphi_mean=m.get("gap/dphi_mean"), headroom=h)
    return row


def run(cfg: RealSizeConfig, *, timeout: float = 3600.0) -> dict:
    """:func:`measure` in a fresh subprocess with the thread settings of the module docstring; adds the load
    average before and after."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(PYTHONPATH=str(ROOT), OMP_WAIT_POLICY="PASSIVE", OMP_NUM_THREADS=str(cfg.threads),
               MKL_NUM_THREADS=str(cfg.threads), GAPDYN_TORCH_THREADS=str(cfg.threads))
    cmd = [sys.executable, "-m", "benchmarks.real_size", "--child", "--prompts", str(cfg.prompts), "--G", str(cfg.G),
           "--T", str(cfg.T), "--prompt-len", str(cfg.prompt_len), "--optimizer", cfg.optimizer, "--lr", str(cfg.lr),
           "--threads", str(cfg.threads)] + (["--tiny"] if cfg.tiny else [])
    load0, t0 = load_average(), time.perf_counter()
    p = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    load1 = load_average()
    if p.returncode != 0:
        raise RuntimeError(f"the measuring subprocess failed (exit {p.returncode}): {p.stderr.strip()[-2000:]}")
    row = json.loads(p.stdout.strip().splitlines()[-1])
    row.update(load_before=list(load0), load_after=list(load1), wall_s=time.perf_counter() - t0)
    return row


def format_report(r: dict) -> str:
    """Markdown: the table of parts (seconds, ratio to plain, peak RSS and its excess over base) and the
    probe's numbers."""
    gib = lambda mib: f"{mib / 1024:.2f}"  # noqa: E731
    parts = (("plain: forward + backward of the GRPO loss", ("plain",)), ("optimizer.step()", ("opt_step",)),
             ("probe: theta_k copy + GapProbe.before (stream)", ("before",)),
             ("probe: GapProbe.after (stream)", ("after",)),
             ("probe: headroom (step_rule, forward-mode)", ("headroom",)),
             ("probe: all three", ("before", "after", "headroom")))
    base = r["base_MiB"]
    lines = [f"P = {r['P']:,} parameters, batch {r['prompts']} prompts x {r['G']} completions of {r['T']} tokens "
             f"(prompts {r['prompt_len']} tokens), float32, {r['threads']} thread(s), optimizer {r['optimizer']}; "
             f"load average (1, 5, 15 min) before {', '.join(f'{x:.2f}' for x in r['load_before'])}, after "
             f"{', '.join(f'{x:.2f}' for x in r['load_after'])}; wall {r['wall_s']:.0f} s (model build "
             f"{r['build_s']:.0f} s)", "",
             f"base (model + gradients + optimizer state, no activations): {gib(base)} GiB RSS", "",
             "| part | wall s | / plain | CPU s | / plain | RSS at start GiB | peak RSS GiB | peak - base GiB |",
             "|---|---|---|---|---|---|---|---|"]
    for name, keys in parts:
        s, c = sum(r[f"{k}_s"] for k in keys), sum(r[f"{k}_cpu_s"] for k in keys)
        start, peak = r[f"{keys[0]}_start_MiB"], max(r[f"{k}_peak_MiB"] for k in keys)
        lines.append(f"| {name} | {s:.1f} | {s / r['plain_s']:.2f} | {c:.1f} | {c / r['plain_cpu_s']:.2f} | "
                     f"{gib(start)} | {gib(peak)} | {gib(peak - base)} |")
    lines += ["", f"probe: {r['n_prompts']} prompts, dmu_update_mean "
              f"{r['dmu_update_mean']:.3e}, dphi_mean {r['dphi_mean']:.3e} (first order: equal), headroom "
              f"{r['headroom']:.3g}"]
    return "\n".join(lines)


@command("python -m benchmarks.real_size")
def main(argv: list[str]) -> int:
    a = parse(RealSizeConfig, argv, prog="python -m benchmarks.real_size")
    for name in ("prompts", "T", "prompt_len", "threads"):
        if getattr(a, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    if a.G < 2:
        raise ValueError(f"--G must be >= 2 (a mixed group), got {a.G}")
    if not a.lr > 0:
        raise ValueError(f"--lr must be > 0, got {a.lr}")
    if a.child:
        print(json.dumps(measure(a)))
        return 0
    r = run(a)
    emit_report("Probe cost at real size", "python -m benchmarks.real_size " + " ".join(argv), format_report(r),
                a.out, details=(f"{os.cpu_count()} cores",))
    return 0


if __name__ == "__main__":
    sys.exit(main())
