"""Execute the tutorial notebooks and render them, figures included, to ``docs/notebooks/``.

    python notebooks/render.py                         every notebook, MODE "quick"
    python notebooks/render.py 02_thresholds_and_collapse --mode test
    python notebooks/render.py --out /tmp/rendered     somewhere else than docs/notebooks

The sources are plain-text notebooks, ``notebooks/<name>.py`` in jupytext's percent format (open them
in Jupyter with jupytext installed, or run ``jupytext --to ipynb notebooks/<name>.py``; .ipynb files are
kept out of git). Each source is converted with jupytext, executed with nbclient in a temporary
working directory (so nothing is written into the repository or the package) with
``GAPDYN_NB_MODE=<mode>``, and exported with nbconvert's markdown exporter: ``<out>/<name>.md`` plus
its PNG figures in ``<out>/<name>_files/``. The first line of each page records the sha256 of its
source, so the tests can tell when a page is older than its notebook.
"""

import hashlib
import os
import re
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import tyro

from gapdyn.cmdline import MODES, Mode, UsageError, command, optional, parse

HERE = Path(__file__).resolve().parent
DOCS = HERE.parent / "docs" / "notebooks"
HEADER = re.compile(r"^<!-- rendered from notebooks/(?P<source>\S+) sha256=(?P<sha>[0-9a-f]{64}) mode=(?P<mode>\w+) -->$")


def sources() -> list[Path]:
    """The notebook sources: ``notebooks/NN_*.py`` (this script and helpers are not notebooks)."""
    return sorted(p for p in HERE.glob("[0-9][0-9]_*.py"))


def source_digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def header(path: Path, mode: str) -> str:
    """The first line of a rendered page (an HTML comment: invisible on a code host)."""
    return f"<!-- rendered from notebooks/{Path(path).name} sha256={source_digest(path)} mode={mode} -->"


def load(path: Path):
    """The notebook of a percent-format source, without outputs."""
    import jupytext

    return jupytext.read(path, fmt="py:percent")


@contextmanager
def _environment(values: dict[str, str]):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def execute(nb, workdir: Path, *, mode: str, timeout: int = 1800):
    """Run every cell of ``nb`` in place with a python3 kernel whose working directory is ``workdir``.

    The kernel sees GAPDYN_NB_MODE=mode, a sweep store and an LLM output folder under ``workdir``
    one thread per numeric library and no progress bars. Raises nbclient's CellExecutionError on the first failing cell.
    """
    import nbclient

    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    workdir = Path(workdir)
    env = {
        "GAPDYN_NB_MODE": mode,
        "GAPDYN_STORE": str(workdir / "store"),
        "GAPDYN_NB_LLM_DIR": str(workdir / "llm"),
        "MPLBACKEND": "module://matplotlib_inline.backend_inline",
        "TQDM_DISABLE": "1",  # progress bars are noise in a rendered page
        "OMP_NUM_THREADS": "1",
        "NUMBA_NUM_THREADS": os.environ.get("NUMBA_NUM_THREADS", "1"),
    }
    with _environment(env):
        client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                         resources={"metadata": {"path": str(workdir)}})
        client.execute()
    return nb


def _tidy_outputs(nb) -> None:
    """Keep what a reader of the page needs: drop stderr streams (progress bars, library warnings)
    and the HTML form of outputs that also have a plain-text form (pandas tables: a code host shows
    raw HTML styling badly, the text form reads well in a code block)."""
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        cell.outputs = [o for o in cell.outputs if not (o.output_type == "stream" and o.get("name") == "stderr")]
        for out in cell.outputs:
            data = out.get("data", {})
            if "text/html" in data and "text/plain" in data:
                del data["text/html"]


def to_markdown(nb, name: str) -> tuple[str, dict[str, bytes]]:
    """(markdown text, {relative file name: bytes}) of an executed notebook; figures go to ``<name>_files/``."""
    from nbconvert import MarkdownExporter
    from nbconvert.preprocessors import CoalesceStreamsPreprocessor

    _tidy_outputs(nb)
    exporter = MarkdownExporter()
    exporter.register_preprocessor(CoalesceStreamsPreprocessor(), enabled=True)  # one block per printed stream
    body, resources = exporter.from_notebook_node(nb, resources={"output_files_dir": f"{name}_files"})
    return body, dict(resources.get("outputs", {}))


def render(path: Path, out_dir: Path = DOCS, *, mode: str = "quick") -> Path:
    """Execute one source and write ``out_dir/<name>.md`` and its figures; returns the page's path."""
    path, out_dir = Path(path), Path(out_dir)
    name = path.stem
    nb = load(path)
    with tempfile.TemporaryDirectory(prefix=f"gapdyn_{name}_") as tmp:
        execute(nb, Path(tmp), mode=mode)
    body, files = to_markdown(nb, name)
    figures = out_dir / f"{name}_files"
    if figures.exists():
        for old in figures.iterdir():
            old.unlink()
    for rel, blob in files.items():
        target = out_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(blob)
    page = out_dir / f"{name}.md"
    page.write_text(header(path, mode) + "\n\n" + body.strip() + "\n")
    return page


@dataclass
class RenderConfig:
    """Execute the tutorial notebooks and render them, figures included, to docs/notebooks/ (markdown + PNG)."""

    names: Annotated[tuple[str, ...], tyro.conf.Positional, tyro.conf.arg(metavar="[NAME ...]", help_behavior_hint="")] = ()
    """Notebook names (stems of notebooks/NN_*.py); default all."""
    mode: Mode = "quick"
    """Sizes: test (seconds), quick, full (paper scale)."""
    out: Annotated[Path | None, optional("DIR", "docs/notebooks")] = None
    """Output folder."""


@command("python notebooks/render.py")
def main(argv: list[str]) -> int:
    args = parse(RenderConfig, argv, prog="python notebooks/render.py")
    known = {p.stem: p for p in sources()}
    unknown = [n for n in args.names if n not in known]
    if unknown:
        raise UsageError(f"unknown notebooks {unknown}; known: {sorted(known)}")
    for name in args.names or sorted(known):
        print(f"rendering {name} (mode {args.mode}) ...", flush=True)
        print(f"  wrote {render(known[name], args.out or DOCS, mode=args.mode)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
