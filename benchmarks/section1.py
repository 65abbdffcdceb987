"""``python -m benchmarks.section1 [--quick] [--tiny] [--out FILE]``: the bandit engine only.

Sections 0 (machine ceilings), 1 (bandits.engine vs bandits.reference, the fused kernel, the numpy loop,
threads) and the per-method rows of section 4, with the same code and table format as
``python -m benchmarks`` (benchmarks/run.py); sections 2 and 4's other axes and the llm_probe section 3 are
left out (their tables print empty). About 1.5 minutes on the 2 shared cores.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace

from . import run as rb

__all__ = ["bandit_sizes", "main"]


def bandit_sizes(sizes: rb.Sizes) -> rb.Sizes:
    """sizes without the sequence-bandit points and the scaling axes other than the method."""
    return replace(sizes, seq_T=(), scale_K=(), scale_C=(), scale_R=(), scale_G=())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.section1", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes and fewer repeats")
    ap.add_argument("--tiny", action="store_true", help="smoke-test sizes (seconds; numbers meaningless)")
    ap.add_argument("--out", default=None, help="also write the report to this file")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    a = ap.parse_args(argv)
    sizes = bandit_sizes(rb.TINY if a.tiny else rb.QUICK if a.quick else rb.FULL)
    res = rb.run_all(sizes, llm=False, verbose=not a.quiet)
    cmd = "python -m benchmarks.section1 " + " ".join(argv if argv is not None else sys.argv[1:])
    text = f"# gapdyn benchmarks ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\ncommand: `{cmd.strip()}`\n\n"
    text += rb.format_report(res)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
