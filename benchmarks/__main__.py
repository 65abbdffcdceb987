"""``python -m benchmarks [--quick]``: print the benchmark table (see benchmarks/run.py, BENCHMARKS.md)."""

import sys

from .run import main

if __name__ == "__main__":
    sys.exit(main())
