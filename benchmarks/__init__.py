"""gapdyn benchmarks: speed of the simulators and probes, measured as ratios against reference routes
in the same run (``python -m benchmarks [--quick]``; see BENCHMARKS.md). Not part of the test suite
(tests/test_benchmarks_smoke.py runs the harness at a tiny size and checks fast == reference).

Modules: :mod:`benchmarks.timing` (interleaved repeats, medians, spread, machine info),
:mod:`benchmarks.roofline` (memory bandwidth, exp rate, fused exact-update ceiling),
:mod:`benchmarks.bandit` (bandits.engine vs bandits.reference), :mod:`benchmarks.sequence`
(bandits.sequence vs T), :mod:`benchmarks.llm` (llm_probe step time and probe routes; imports torch),
:mod:`benchmarks.run` (the table).
"""

__all__ = ["timing", "roofline", "bandit", "sequence", "llm", "run"]
