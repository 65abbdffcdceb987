"""The README gallery (docs/figures.md) from the figure modules' titles and captions.

    python -m paper_figs.gallery          print the markdown
    python -m paper_figs.gallery --write  write docs/figures.md

One source of truth: the caption in docs/figures.md is the one written into each figure file's
metadata (PNG "Description", PDF "Subject"); tests/test_figs.py checks that they agree.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from gapdyn.io import atomic_write_text, write_with

from .cli import FIGURES, figure_module

__all__ = ["gallery_markdown", "DOC_PATH"]

DOC_PATH = Path(__file__).resolve().parents[1] / "docs" / "figures.md"

_INTRO = """## Figures and the quick reproduction

```bash
gapdyn reproduce            # the quick CPU reproduction: all figures + gapdyn_out/reproduce/REPORT.md
gapdyn reproduce --mode test   # the smallest sizes (what the test suite runs)
gapdyn reproduce --mode full --jobs -1   # paper-scale sweeps (resumable through the sweep store)
gapdyn figs                 # only the figures (quick mode), into gapdyn_out/figs; python -m paper_figs is the same
gapdyn figs --only fig5     # one figure (a name or an unambiguous prefix; also python -m paper_figs.fig5_taxonomy)
```

Their wall and CPU seconds, with the machine's load, are the README's measured table (Quick start; written by
`python -m benchmarks.documented_times`, never typed; the tiny-Qwen demo runs in a second process beside the bandit
experiments). A rerun reuses the stored results. It prints where it writes, a progress bar, then what it wrote. Outputs go under the working directory
(`--out DIR` to choose the folder):

| output | what |
|---|---|
| `gapdyn_out/reproduce/fig*.png`, `.pdf` | the figures; caption in the file metadata (PNG `Description`, PDF `Subject`) |
| `gapdyn_out/reproduce/REPORT.md` | every claim of this run (estimate, 95 % interval, n, criterion, verdict, block), identity rows apart, the replication table, the coverage of both papers |
| `gapdyn_out/reproduce/results/claims.json`, `claims.csv` | the same claims, machine-readable (`gapdyn.claims_from_json`) |
| `gapdyn_out/store/` | the sweep store shared with `gapdyn figs` (`<out>/store` with `--out`; `$GAPDYN_STORE` or `--store` to move it): completed cells are reloaded, not recomputed |
| `gapdyn_out/store/llm_probe/<mode>/` | the tiny-Qwen runs, reused when their configuration matches; `gapdyn figs --llm-dir DIR` uses an existing `gapdyn train demo --out DIR` output instead |

Modes: `test` (smallest sizes), `quick` (each experiment's `Config.quick()`, 2 seeds x 60 steps of the
tiny Qwen), `full` (each `Config.full()` with the confirmation block, 5 seeds x 300 steps and lr 5e-4 added).
Every verdict is a `gapdyn.Claim` made by an experiment's `analyse` (the taxonomy is an experiment too) or
by `paper_figs.llm.llm_claims` for the tiny-Qwen runs, decided by its interval and a criterion frozen
before the run (docs/evidence.md); the report only renders them. `gapdyn claims` (or `--out DIR` for another
reproduction) prints the README's "What it found" table (marked indicative when only the discovery block
ran). A figure whose data source
is missing is written with a "not available yet: <why>" panel or skipped with that message; nothing is
faked. Exit codes: 0 all produced, 3 something not available, 1 an error.

Plotting code lives in `paper_figs/plots.py` (one idea per Axes; the figure scripts only load data through
`paper_figs/data.py`, cut tables in `paper_figs/views.py` and call it; fits, seeds and sizes belong to the
experiments). Shared style: `paper_figs/style.py` (Okabe-Ito colour-blind-safe palette,
glossary symbols with units on every axis). Tutorials: `notebooks/01..04` (gradient-gap basics; thresholds
and collapse; the token taxonomy; probing a tiny Qwen run), plain-text jupytext sources rendered with their
figures to `docs/notebooks/` by `python notebooks/render.py`; `tests/test_notebooks.py` runs them with
`GAPDYN_NB_MODE=test`.
The images below are snapshots of a quick run kept in `docs/img/` (`gapdyn_out/` is not committed);
refresh them after `gapdyn reproduce` (run in the repository root) with `python -m paper_figs.gallery --write --snapshot`.
All seven snapshots were redrawn by `gapdyn reproduce` (quick mode, run in the repository root on 2026-12-02)
and copied by `python -m paper_figs.gallery --snapshot`; the captions below describe them.
"""


def gallery_markdown() -> str:
    out = [_INTRO, "### Gallery", ""]
    for name in FIGURES:
        mod = figure_module(name)
        out += [f"#### {mod.TITLE}", "", f"![{name}](img/{name}.png)", "",
                f"`python -m paper_figs.{name}` — {mod.CAPTION}", ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = gallery_markdown()
    if "--write" in argv:
        atomic_write_text(DOC_PATH, text)
        print(f"wrote {DOC_PATH}")
    if "--snapshot" in argv:
        out_dir = DOC_PATH.parents[1] / "gapdyn_out" / "reproduce"
        img_dir = DOC_PATH.parent / "img"
        img_dir.mkdir(exist_ok=True)
        missing = [n for n in FIGURES if not (out_dir / f"{n}.png").is_file()]
        if missing:
            print(f"not available yet: {missing} (run `gapdyn reproduce` first)", file=sys.stderr)
            return 3
        for n in FIGURES:
            write_with(img_dir / f"{n}.png", lambda tmp, n=n: shutil.copyfile(out_dir / f"{n}.png", tmp))
        print(f"copied {len(FIGURES)} figures to {img_dir}")
    if "--write" in argv or "--snapshot" in argv:
        return 0
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
