"""Peak memory and time of the per-prompt alignment routes on a Qwen2.5-0.5B-shaped model (a benchmark, not a test).

    python -m benchmarks.probe_memory [--prompts 1 2 4] [--routes dense stream jvp] [--G 4] [--T 8] [--out FILE]

The model is built from a Qwen2Config with the shape of Qwen2.5-0.5B (hidden 896, 24 layers, 14 heads, 2 kv heads,
intermediate 4864, vocab 151936, tied embeddings; ~494M parameters), random weights, CPU, float32; nothing is
downloaded. One rollout of Q prompts x G completions (random prompt tokens of length 16, completions of length T,
every group mixed) and a random update direction w over all parameters. Per route, dmu_q = <w, g_q> for every q:

- dense:  ``per_prompt_gaps`` (vectorize=False: its leanest form, one group's gradient at a time) then
          ``dot_alignment``: holds the [Q, P] gap matrix;
- stream: ``streamed_gap_stats``: one gap at a time, reduced to its dot and norm (the GapProbe "stream" route);
- jvp:    ``jvp_alignment``: forward mode, all prompts in one pass (no norms).

Each (route, Q) runs in a fresh process: peak resident memory above the resident memory just before the call
(Linux: the VmHWM high-water mark, reset through /proc/self/clear_refs before the call), and wall time. The
dmu values of the routes are compared with the stream route's (max difference over the largest |dmu|).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Annotated, Literal

from gapdyn.cmdline import command, optional, parse

QWEN25_05B = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                  intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=512)


def _status_kib(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def one(route: str, Q: int, G: int, T: int, threads: int) -> dict:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from llm_probe.probes import (dot_alignment, flat, jvp_alignment, mixed_groups, per_prompt_gaps, select_params,
                                  streamed_gap_stats)
    from llm_probe.rollout import Rollout

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg = Qwen2Config(**QWEN25_05B, use_cache=False, pad_token_id=0, eos_token_id=1)
    cfg._attn_implementation = "eager"
    model = Qwen2ForCausalLM(cfg).eval()
    params = select_params(model, "all")
    P = sum(p.numel() for p in params.values())
    g = torch.Generator().manual_seed(1)
    w = {n: torch.randn(p.shape, generator=g) * 1e-3 for n, p in params.items()}
    N, L = Q * G, 16
    prompt = torch.randint(3, cfg.vocab_size, (Q, L), generator=g).repeat_interleave(G, 0)
    comp = torch.randint(3, cfg.vocab_size, (N, T), generator=g)
    rewards = torch.tensor([[1.0, 0.0] * (G // 2) + [1.0] * (G % 2)] * Q)
    ro = Rollout([None] * Q, prompt, torch.ones(N, L, dtype=torch.long), comp, torch.ones(N, T),
                 torch.ones(N, dtype=torch.bool), [""] * N, rewards)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak-RSS mark
    rss0 = _status_kib("VmRSS")
    t0 = time.perf_counter()
    if route == "dense":
        est = per_prompt_gaps(model, ro, params, vectorize=False)
        dmu = dot_alignment(est.gaps, flat(w))
    elif route == "stream":
        dmu = streamed_gap_stats(model, ro, params, {"w": w}).dots["w"]
    elif route == "jvp":
        dmu = jvp_alignment(model, ro, mixed_groups(ro.rewards), {k: p.detach() for k, p in params.items()}, w)
    else:
        raise ValueError(f"route must be dense, stream or jvp, got {route!r}")
    wall = time.perf_counter() - t0
    peak = _status_kib("VmHWM")
    return {"route": route, "Q": Q, "G": G, "T": T, "P": P, "threads": threads, "wall_s": round(wall, 2),
            "peak_above_start_MiB": round((peak - rss0) / 1024, 1), "rss_start_MiB": round(rss0 / 1024, 1),
            "gap_matrix_MiB": round(Q * P * 4 / 2**20, 1), "dmu": [float(x) for x in dmu]}


Route = Literal["stream", "dense", "jvp"]


@dataclass
class ProbeMemoryConfig:
    """Peak memory and time of the per-prompt alignment routes on a Qwen2.5-0.5B-shaped model (CPU, float32)."""

    prompts: tuple[int, ...] = (1, 2, 4)
    """Prompt counts Q of the rollout (Q x G completions)."""
    routes: tuple[Route, ...] = ("stream", "dense", "jvp")
    """Routes to measure, each (route, Q) in a fresh process."""
    dense_max: int = 2
    """Largest Q for the dense route (it needs Q x 1.9 GiB)."""
    G: int = 4
    """Completions per prompt."""
    T: int = 8
    """Completion length (tokens)."""
    threads: int = 1
    """torch intra-op threads."""
    out: Annotated[str | None, optional("FILE")] = None
    """JSONL file to append the rows to."""
    one: Annotated[tuple[Route, int] | None, optional("ROUTE Q")] = None
    """Measure only this (route, Q) in this process and print its row as JSON (what each subprocess runs)."""


@command("python -m benchmarks.probe_memory")
def main(argv: list[str]) -> int:
    a = parse(ProbeMemoryConfig, argv, prog="python -m benchmarks.probe_memory")
    if a.one:
        print(json.dumps(one(a.one[0], a.one[1], a.G, a.T, a.threads)))
        return 0
    rows = []
    for Q in a.prompts:
        for route in a.routes:
            if route == "dense" and Q > a.dense_max:
                continue
            cmd = [sys.executable, "-m", "benchmarks.probe_memory", "--one", route, str(Q), "--G", str(a.G), "--T",
                   str(a.T), "--threads", str(a.threads)]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode:
                print(f"{route} Q={Q} failed:\n{r.stderr[-2000:]}", file=sys.stderr)
                continue
            row = json.loads(r.stdout.strip().splitlines()[-1])
            rows.append(row)
            ref = next((x for x in rows if x["route"] == "stream" and x["Q"] == Q), None)
            note = ""
            if ref is not None and route != "stream":
                scale = max(abs(y) for y in ref["dmu"])
                d = max(abs(x - y) for x, y in zip(row["dmu"], ref["dmu"])) / max(scale, 1e-30)
                note = f"  max |dmu - dmu_stream| / max |dmu_stream| = {d:.1e}"
            print(f"{route:6s} Q={Q} G={a.G} T={a.T}: peak +{row['peak_above_start_MiB']:8.1f} MiB "
                  f"(gap matrix {row['gap_matrix_MiB']:.0f} MiB), {row['wall_s']:6.1f} s{note}", flush=True)
            if a.out:
                with open(a.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
