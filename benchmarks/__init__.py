"""gapdyn benchmarks: speed of the simulators and probes, measured as ratios against reference routes
in the same run (``python -m benchmarks [--quick]``; see BENCHMARKS.md). Not part of the test suite
(tests/test_benchmarks_smoke.py runs the harness at a tiny size and checks fast == reference).

Modules: :mod:`benchmarks.timing` (interleaved repeats, medians, spread, machine info),
:mod:`benchmarks.roofline` (memory bandwidth, exp rate, minimal fused exact-update kernels),
:mod:`benchmarks.references` (the fused fast-math exact kernel and the numpy rng.choice sampled loop),
:mod:`benchmarks.speed` (bandits.engine vs those references and over threads),
:mod:`benchmarks.bandit` (bandits.engine vs bandits.reference), :mod:`benchmarks.sequence`
(bandits.sequence vs T), :mod:`benchmarks.llm` (llm_probe step time and probe routes; imports torch),
:mod:`benchmarks.threads` (torch threads x OpenMP wait policy, in fresh subprocesses; bit identity),
:mod:`benchmarks.whatif` (a kept prototype route), :mod:`benchmarks.run` (the report).
"""

__all__ = ["timing", "roofline", "references", "speed", "bandit", "sequence", "llm", "threads", "whatif", "run"]
