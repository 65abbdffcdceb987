"""Every tutorial notebook executes without error at small sizes (GAPDYN_NB_MODE=test), and the
committed notebooks carry no outputs and match their generator (notebooks/make_notebooks.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="install the [notebooks] extra")
nbclient = pytest.importorskip("nbclient", reason="install the [notebooks] extra")

NB_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(NB_DIR.glob("*.ipynb"))


def _generator():
    spec = importlib.util.spec_from_file_location("make_notebooks", NB_DIR / "make_notebooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_at_least_four_notebooks():
    names = [p.name for p in NOTEBOOKS]
    assert len(names) >= 4, f"expected >= 4 notebooks, found {names}"


def test_notebooks_match_generator_and_have_no_outputs():
    gen = _generator()
    assert sorted(gen.NOTEBOOKS) == [p.name for p in NOTEBOOKS], "notebooks/ and make_notebooks.py disagree"
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None, f"{path.name} has committed outputs"
        assert path.read_text() == gen.render(path.name), f"{path.name} is stale: run python notebooks/make_notebooks.py"
        params = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        assert len(params) == 1 and "GAPDYN_NB_MODE" in params[0].source, f"{path.name} lacks its parameters cell"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path, monkeypatch, tmp_path):
    monkeypatch.setenv("GAPDYN_NB_MODE", "test")
    monkeypatch.setenv("GAPDYN_STORE", str(tmp_path / "store"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("MPLBACKEND", raising=False)
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})]
    assert images, f"{path.name} drew no figure"
