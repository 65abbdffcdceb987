"""Torch CPU threads: one count per process, set once, and OpenMP workers that sleep instead of spin.

Default: 1 intra-op thread (``GAPDYN_TORCH_THREADS=n`` or an explicit ``n`` overrides). Two reasons, both
measured on the 2-core machines this project runs on (``python -m benchmarks.threads``, BENCHMARKS.md):

- speed: torch's default (one thread per core) makes every OpenMP barrier wait for a thread the kernel has
  given to another process; the tiny Qwen's kernels are too small to gain from a second thread anyway.
- bits: a reduction split over 2 threads adds in another order than over 1, so the warmed weights (and a
  study's outcomes) differ bit for bit between thread counts. Guarantee: same thread count, same torch build
  and machine -> the same bits (warm-up and RL steps take their randomness only from explicit generators).

OpenMP wait policy: with ``OMP_WAIT_POLICY=PASSIVE`` an idle OpenMP worker sleeps at once (libgomp's spin
count 0) instead of spinning up to 300,000 iterations. The OpenMP runtime reads the variable once, when it
is loaded, i.e. when torch is first imported in the process; setting it later changes nothing in that
process (it still reaches the child processes started afterwards). ``import llm_probe`` therefore calls
:func:`set_wait_policy` before it imports torch, and an explicit ``OMP_WAIT_POLICY`` in the environment
is kept. With 1 thread no OpenMP worker exists, so the policy matters only when more threads are asked for.

This module imports torch only inside the functions, so its import sets nothing in motion.
"""

from __future__ import annotations

import operator
import os
import sys

__all__ = ["ENV_THREADS", "DEFAULT_THREADS", "set_wait_policy", "resolve_threads", "configure_threads",
           "use_threads"]

ENV_THREADS = "GAPDYN_TORCH_THREADS"
"""Environment variable that overrides the default thread count (a positive integer)."""

DEFAULT_THREADS = 1
"""Intra-op threads when neither an explicit count nor :data:`ENV_THREADS` is given."""

_configured: int | None = None  # the count configure_threads set in this process (None: not yet)


def set_wait_policy(policy: str = "PASSIVE") -> bool:
    """Put ``OMP_WAIT_POLICY=policy`` in the environment unless it is already set there.

    Returns whether it can still take effect in this process: True iff torch is not imported yet (OpenMP
    reads the variable when torch's import loads it). Child processes started later inherit it either way.
    """
    if policy not in ("PASSIVE", "ACTIVE"):
        raise ValueError(f"policy must be 'PASSIVE' or 'ACTIVE', got {policy!r}")
    os.environ.setdefault("OMP_WAIT_POLICY", policy)
    return "torch" not in sys.modules


def _positive_int(value, name: str) -> int:
    try:
        n = int(value.strip()) if isinstance(value, str) else operator.index(value)
    except (TypeError, ValueError):
        n = 0
    if isinstance(value, bool) or n < 1:
        raise ValueError(f"{name} must be a positive integer number of torch threads, got {value!r}")
    return n


def resolve_threads(n: int | None = None) -> int:
    """The thread count to use: ``n`` if given, else ``$GAPDYN_TORCH_THREADS``, else :data:`DEFAULT_THREADS`.

    A bad value (not an integer >= 1) is a ValueError naming ``n`` or the environment variable."""
    if n is not None:
        return _positive_int(n, "n")
    env = os.environ.get(ENV_THREADS)
    if env is None or env.strip() == "":
        return DEFAULT_THREADS
    return _positive_int(env, ENV_THREADS)


def configure_threads(n: int | None = None) -> int:
    """Set torch's intra-op threads (and MKL's / OpenMP's, which torch sets with it) to
    :func:`resolve_threads` ``(n)``, and the inter-op threads to the same count where torch still allows it
    (only before the first inter-op work of the process); also :func:`set_wait_policy` for processes started
    afterwards. Returns the intra-op count now in force."""
    global _configured
    k = resolve_threads(n)
    set_wait_policy()
    import torch

    torch.set_num_threads(k)
    try:
        if torch.get_num_interop_threads() != k:
            torch.set_num_interop_threads(k)
    except RuntimeError:  # inter-op pool already started (or set once before): torch keeps its size
        pass
    _configured = k
    return torch.get_num_threads()


def use_threads(n: int | None = None) -> int:
    """For library entry points (warm-up, Trainer): ``n`` given -> :func:`configure_threads` ``(n)``; None ->
    keep the count this process configured, configuring the default on first use. Returns the count."""
    if n is not None or _configured is None:
        return configure_threads(n)
    import torch

    return torch.get_num_threads()
