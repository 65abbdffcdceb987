"""``python -m benchmarks.greedy_eval [--n N]``: greedy held-out decoding on the pinned testbed warm start, the
KV-cache decoder (:func:`llm_probe.sampler.decode` with ``greedy=True``, what the testbed evaluates with) against
the loop of full forwards (one forward over the whole sequence per new token), in one run, 1 torch thread.
Prints both times, their ratio, the load, and whether the tokens agree."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Literal


@dataclass
class GreedyEvalConfig:
    """Time greedy held-out decoding: the KV-cache decoder against the loop of full forwards."""

    n: int = 512
    """Held-out problems decoded (default: all 512)."""
    length: Literal["long", "short"] = "long"
    """The scratchpad length."""


def main(argv=None) -> int:
    from gapdyn.cmdline import parse

    import sys

    a = parse(GreedyEvalConfig, sys.argv[1:] if argv is None else argv, prog="python -m benchmarks.greedy_eval")
    import torch

    from llm_probe.rollout import encode_prompts
    from llm_probe.testbed import warm
    from llm_probe.testbed.evaluate import _greedy, _sample
    from llm_probe.testbed.task import ScratchpadAddition

    torch.set_num_threads(1)
    model, tok = warm.load_testbed("small")
    task = ScratchpadAddition(length=a.length)
    probs = task.heldout()[:a.n]
    ids, mask = encode_prompts(tok, [p.prompt for p in probs])
    kw = dict(max_new_tokens=task.max_completion_tokens(), eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    load0 = os.getloadavg()[0]
    with torch.no_grad():
        t = time.process_time()
        ref = _greedy(model, ids, mask, **kw)
        full = time.process_time() - t
        t = time.process_time()
        got = _sample(model, ids, mask, generator=None, temperature=1.0, greedy=True, **kw)
        kv = time.process_time() - t
    same = torch.equal(got[0], ref[0]) and torch.equal(got[2], ref[2])
    print(f"greedy decoding of {len(probs)} {a.length} held-out problems (CPU s, 1 thread): full forwards "
          f"{full:.1f}, KV cache {kv:.1f}, ratio {full / kv:.1f}x; tokens identical: {same}; "
          f"load {load0:.1f} -> {os.getloadavg()[0]:.1f}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
