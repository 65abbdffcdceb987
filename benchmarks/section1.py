"""``python -m benchmarks.section1 [--quick] [--tiny] [--out FILE]``: the bandit engine only.

Sections 0 (machine ceilings), 1 (bandits.engine vs bandits.reference, the fused kernel, the numpy loop,
threads) and the per-method rows of section 4, with the same code and table format as
``python -m benchmarks`` (benchmarks/run.py); sections 2 and 4's other axes and the llm_probe section 3 are
left out (their tables print empty). About 1.5 minutes on the 2 shared cores.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Annotated

import tyro

from gapdyn.cmdline import command, optional, parse

from . import run as rb
from .timing import emit_report

__all__ = ["bandit_sizes", "Section1Config", "main"]


def bandit_sizes(sizes: rb.Sizes) -> rb.Sizes:
    """sizes without the sequence-bandit points and the scaling axes other than the method."""
    return replace(sizes, seq_T=(), scale_K=(), scale_C=(), scale_R=(), scale_G=())


@dataclass
class Section1Config:
    """The bandit engine's sections of the benchmark table (0, 1, 1b and section 4's per-method rows)."""

    quick: bool = False
    """Smaller sizes and fewer repeats."""
    tiny: bool = False
    """Smoke-test sizes (seconds; numbers meaningless)."""
    out: Annotated[str | None, optional("FILE")] = None
    """Also write the report to this file."""
    quiet: Annotated[bool, tyro.conf.arg(aliases=("-q",))] = False
    """No progress lines on stderr."""


@command("python -m benchmarks.section1")
def main(argv: list[str]) -> int:
    a = parse(Section1Config, argv, prog="python -m benchmarks.section1")
    sizes = bandit_sizes(rb.TINY if a.tiny else rb.QUICK if a.quick else rb.FULL)
    res = rb.run_all(sizes, llm=False, verbose=not a.quiet)
    emit_report("gapdyn benchmarks", "python -m benchmarks.section1 " + " ".join(argv), rb.format_report(res), a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
