"""``python -m paper_figs``: regenerate all figures (same as ``gapdyn figs``)."""

import sys

from .cli import main

raise SystemExit(main(sys.argv[1:]))
