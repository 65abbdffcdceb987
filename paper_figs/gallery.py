"""The README gallery (docs/figures.md) from the figure modules' titles and captions.

    python -m paper_figs.gallery          print the markdown
    python -m paper_figs.gallery --write  write docs/figures.md

One source of truth: the caption in docs/figures.md is the one written into each figure file's
metadata (PNG "Description", PDF "Subject"); tests/test_figs.py checks that they agree.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .cli import FIGURES, figure_module

__all__ = ["gallery_markdown", "DOC_PATH"]

DOC_PATH = Path(__file__).resolve().parents[1] / "docs" / "figures.md"

_INTRO = """## Figures and the quick reproduction

```bash
gapdyn reproduce            # ~10 min on a laptop CPU: all figures + paper_figs/out/REPORT.md
gapdyn reproduce --tiny     # seconds: the smallest sizes (what the test suite runs)
gapdyn figs                 # only the figures (quick mode); --mode full for paper-scale sweeps
python -m paper_figs.fig5_taxonomy   # one figure on its own
```

Every figure is written to `paper_figs/out/<name>.png` and `.pdf`, with its caption in the file's
metadata (PNG `Description`, PDF `Subject`). Data come from the bandit sweep store
(`paper_figs/out/store`, or `$GAPDYN_STORE`; cells computed before are loaded, not recomputed) and the
tiny-Qwen runs' output folder; missing results are computed. `REPORT.md` lists the headline numbers of
the run and the verdict of every tested claim (holds / holds only in a named setting / does not hold),
assembled from each experiment's `analyse`. Plotting code lives in `paper_figs/plots.py`; the figure
scripts only load data and call it. Tutorials: `notebooks/01..04` (regenerate with
`python notebooks/make_notebooks.py`; they run in the tests at small sizes).
"""


def gallery_markdown() -> str:
    out = [_INTRO, "### Gallery", ""]
    for name in FIGURES:
        mod = figure_module(name)
        out += [f"#### {mod.TITLE}", "", f"![{name}](paper_figs/out/{name}.png)", "",
                f"`python -m paper_figs.{name}` — {mod.CAPTION}", ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = gallery_markdown()
    if "--write" in argv:
        DOC_PATH.write_text(text)
        print(f"wrote {DOC_PATH}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
