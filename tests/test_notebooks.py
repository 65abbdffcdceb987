"""The tutorial notebooks: every source (notebooks/NN_*.py, jupytext percent format) executes without
error at small sizes (GAPDYN_NB_MODE=test) in a temporary directory and draws a figure, and every
rendered page in docs/notebooks/ is current (its recorded digest matches its source, its figures exist)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

pytest.importorskip("jupytext", reason="install the [notebooks] extra")
pytest.importorskip("nbclient", reason="install the [notebooks] extra")
pytest.importorskip("nbconvert", reason="install the [notebooks] extra")

ROOT = Path(__file__).resolve().parents[1]


def _render_module():
    spec = importlib.util.spec_from_file_location("notebooks_render", ROOT / "notebooks" / "render.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


render = _render_module()
SOURCES = render.sources()


def test_sources_are_notebooks_with_a_parameters_cell():
    assert len(SOURCES) >= 4, f"expected >= 4 notebook sources, found {[p.name for p in SOURCES]}"
    for path in SOURCES:
        nb = render.load(path)
        params = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        assert len(params) == 1 and "GAPDYN_NB_MODE" in params[0].source, f"{path.name} lacks its parameters cell"
        assert nb.cells[0].cell_type == "markdown", f"{path.name} should open with a markdown title"


@pytest.mark.parametrize("path", SOURCES, ids=[p.stem for p in SOURCES])
def test_rendered_page_is_current(path):
    page = render.DOCS / f"{path.stem}.md"
    assert page.exists(), f"{page} missing: run python notebooks/render.py {path.stem}"
    text = page.read_text()
    m = render.HEADER.match(text.splitlines()[0])
    assert m and m["source"] == path.name, f"{page.name} lacks its header line"
    assert m["sha"] == render.source_digest(path), f"{page.name} is stale: run python notebooks/render.py {path.stem}"
    images = re.findall(r"!\[[^\]]*\]\(([^)\s]+\.png)\)", text)
    assert images, f"{page.name} shows no figure"
    missing = [i for i in images if not (page.parent / i).exists()]
    assert not missing, f"{page.name} links missing figures {missing}"


@pytest.mark.parametrize("path", [pytest.param(p, marks=() if i == 0 else pytest.mark.slow)
                                  for i, p in enumerate(SOURCES)], ids=[p.stem for p in SOURCES])
def test_notebook_executes(path, tmp_path):
    """The first notebook runs in the default suite, the others under `slow` (each page's code cells are checked
    current against its notebook in the default suite: test_rendered_page_is_current)."""
    nb = render.execute(render.load(path), tmp_path, mode="test", timeout=240)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})]
    assert images, f"{path.name} drew no figure"
    body, files = render.to_markdown(nb, path.stem)
    assert files and all(f"({name})" in body for name in files), "the markdown export lost a figure"
