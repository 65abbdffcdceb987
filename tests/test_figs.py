"""paper_figs: the shared style's file metadata, the figure-module contract, the taxonomy table against
an independent numpy route, a figure script run on its own, the gallery doc, and the tiny reproduction
(every figure written, REPORT.md quoting exactly the numbers of this run)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("matplotlib")
from PIL import Image  # noqa: E402  (a matplotlib dependency)

from paper_figs import data, report  # noqa: E402
from paper_figs.cli import FIGURES, figure_module  # noqa: E402
from paper_figs.style import new_figure, save_figure  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _pdf_subject(path: Path) -> str:
    """The PDF Info dict's /Subject literal string, unescaped (ASCII captions)."""
    m = re.search(rb"/Subject \(((?:[^\\)]|\\.)*)\)", path.read_bytes(), re.S)
    return re.sub(rb"\\(.)", rb"\1", m.group(1)).decode("latin-1") if m else ""


def test_save_figure_writes_png_and_pdf_with_caption(tmp_path):
    fig, ax = new_figure()
    ax[0, 0].plot([0, 1], [0, 1])
    caption = "Tests nothing; a line from (0, 0) to (1, 1)."
    paths = save_figure(fig, "probe", caption=caption, title="probe title", out_dir=tmp_path)
    assert [p.suffix for p in paths] == [".png", ".pdf"]
    assert all(p.stat().st_size > 1000 for p in paths)
    assert Image.open(paths[0]).text["Description"] == caption
    assert _pdf_subject(paths[1]) == caption
    with pytest.raises(ValueError, match="caption"):
        save_figure(new_figure()[0], "x", caption="", out_dir=tmp_path)


def test_figure_modules_follow_the_contract():
    for name in FIGURES:
        mod = figure_module(name)
        assert mod.NAME == name
        assert callable(mod.make) and callable(mod.main)
        assert mod.TITLE and mod.TITLE != name, f"{name} has no title"
        assert re.match(r"Tests\b", mod.CAPTION), f"{name}: the caption must say what it tests"


def test_taxonomy_table_matches_an_independent_numpy_route():
    table = data.taxonomy_table(500, vocab=7, seed=11)
    pos, neg = table[table["A"] > 0].reset_index(drop=True), table[table["A"] < 0].reset_index(drop=True)
    # first-order effects are linear in A: A = -1 rows are exactly minus the A = +1 rows
    np.testing.assert_allclose(neg["dH"], -pos["dH"], rtol=0, atol=1e-15)
    np.testing.assert_allclose(neg["dp_s"], -pos["dp_s"], rtol=0, atol=1e-15)
    # closed forms written out here (docs/theory.md §9.1) instead of gapdyn's vectorised code
    p_s, C = pos["p_s"].to_numpy(), pos["C"].to_numpy()
    np.testing.assert_allclose(pos["dp_s"], p_s * (1 - 2 * p_s + C), rtol=1e-12, atol=1e-15)
    assert ((C >= p_s**2 - 1e-15) & (C <= 1 + 1e-12)).all()
    peak = p_s >= C
    expect_bin = np.where(peak, "pos_peak", "pos_valley")
    assert (pos["bin"].to_numpy() == expect_bin).all()
    assert (pos["bin_sign"].to_numpy() == np.where(peak, -1, 1)).all()
    assert (pos["mispredicted"] == (pos["sign_dH"] != pos["bin_sign"])).all()
    s = data.taxonomy_summary(table)
    assert s["valley_mispredicted"] == 0
    assert 0.0 <= s["max_gap_of_misses"] < 0.2


def test_taxonomy_sign_by_finite_differences():
    """sign_dH against a numerical derivative of H along dz = a (e_s - p), computed here from scratch."""
    rng = np.random.default_rng(3)
    n, V = 300, 6
    z = 2.0 * rng.standard_normal((n, V))
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    tok = np.array([rng.choice(V, p=row) for row in p])
    import gapdyn

    eff = gapdyn.token_step_effects(z, tok, 1.0, 1.0)

    def H(zz):
        q = np.exp(zz - zz.max(1, keepdims=True))
        q /= q.sum(1, keepdims=True)
        return -(q * np.log(q)).sum(1)

    step = np.eye(V)[tok] - p
    h = 1e-6
    fd = (H(z + h * step) - H(z - h * step)) / (2 * h)
    big = np.abs(fd) > 1e-6
    assert (np.sign(fd[big]) == eff.entropy_sign[big]).all()


def test_a_figure_script_runs_on_its_own(tmp_path):
    mod = figure_module("fig5_taxonomy")
    proc = subprocess.run(
        [sys.executable, "-m", "paper_figs.fig5_taxonomy", "--mode", "test", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    png, pdf = tmp_path / "fig5_taxonomy.png", tmp_path / "fig5_taxonomy.pdf"
    assert png.stat().st_size > 10_000 and pdf.stat().st_size > 10_000
    assert Image.open(png).text["Description"] == mod.CAPTION


def test_gallery_doc_is_in_sync():
    from paper_figs.gallery import DOC_PATH, gallery_markdown

    assert DOC_PATH.read_text() == gallery_markdown(), "run: python -m paper_figs.gallery --write"


def test_gapdyn_figs_command_lists_the_figures(capsys):
    from gapdyn.cli import main

    assert main(["figs", "--list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in FIGURES)


def _report_rows(text: str) -> set[tuple[str, ...]]:
    rows = set()
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("|---"):
            rows.add(tuple(c.strip().replace("\\|", "|") for c in line.strip().strip("|").split(" | ")))
    return rows


def _package_files() -> set:
    """The files of the paper_figs package folder (a run that writes there adds some)."""
    import paper_figs as pkg

    return {p for p in Path(pkg.__file__).parent.rglob("*") if "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """`gapdyn reproduce --mode test` through the command dispatcher, run from an empty folder without --out:
    (out dir, exit code, printed text, the package's files before the run)."""
    import contextlib
    import io
    import os

    from gapdyn.cli import main

    cwd = tmp_path_factory.mktemp("cwd")
    before = _package_files()
    old, store_env = os.getcwd(), os.environ.pop("GAPDYN_STORE", None)
    buf = io.StringIO()
    try:
        os.chdir(cwd)
        with contextlib.redirect_stdout(buf):
            rc = main(["reproduce", "--mode", "test", "--seed", "3", "--no-progress"])
    finally:
        os.chdir(old)
        if store_env is not None:
            os.environ["GAPDYN_STORE"] = store_env
    return cwd / "gapdyn_out" / "reproduce", rc, buf.getvalue(), before


def test_tiny_reproduction_writes_only_under_the_working_directory(tiny_run):
    out, rc, printed, before = tiny_run
    cwd = out.parents[1]
    assert [p.name for p in cwd.iterdir()] == ["gapdyn_out"]
    assert {p.name for p in (cwd / "gapdyn_out").iterdir()} == {"reproduce", "store"}
    assert str(out) in printed.splitlines()[0], "the command must say where it writes, first"
    assert _package_files() == before, "the run wrote into the package folder"


def test_tiny_reproduction_writes_every_figure(tiny_run):
    out, rc, printed, _ = tiny_run
    assert rc == 0, f"gapdyn reproduce --mode test exited {rc}:\n{printed[-3000:]}"
    assert str(out / "REPORT.md") in printed, "the command must print where the report is"
    for name in FIGURES:
        for ext in ("png", "pdf"):
            f = out / f"{name}.{ext}"
            assert f.exists() and f.stat().st_size > 5_000, f"{f} missing or empty"
        assert Image.open(out / f"{name}.png").text["Description"] == figure_module(name).CAPTION


def test_tiny_report_quotes_the_numbers_of_this_run(tiny_run):
    out, _, _, _ = tiny_run
    text = (out / "REPORT.md").read_text()
    rows = _report_rows(text)
    headline = json.loads((out / "results" / "headline.json").read_text())
    assert headline, "no headline numbers"
    for section, numbers in headline.items():
        assert f"### {section}" in text
        for key, value in numbers.items():
            assert (key, report.fmt(value)) in rows, f"{section}.{key} = {value} not quoted in REPORT.md"
    verdicts = pd.read_csv(out / "results" / "verdicts.csv", dtype=str, keep_default_na=False)
    assert len(verdicts) >= 3
    for r in verdicts.itertuples(index=False):
        assert tuple(str(v) for v in r) in rows, f"verdict row missing from REPORT.md: {r}"
    assert (verdicts["holds"].str.len() > 0).all()
    # the numbers depend on this run's seed: recompute the taxonomy headline independently for seeds 3 and 0
    tax = headline["fig5_taxonomy"]
    s3 = data.taxonomy_summary(data.taxonomy_table(tax["n_tokens"], seed=3))
    s0 = data.taxonomy_summary(data.taxonomy_table(tax["n_tokens"], seed=0))
    assert tax["share_bin_correct"] == pytest.approx(s3["share_bin_correct"], abs=0)
    assert s0["share_bin_correct"] != s3["share_bin_correct"]
    # the bandit numbers are those of the sweep results stored by this run (read back from disk)
    from bandits.experiments.threshold import critical_steps

    stored = next((out.parent / "store").glob("threshold*/results.parquet"))
    crit = critical_steps(pd.read_parquet(stored))
    finite = crit[(crit["method"] == "grpo") & np.isfinite(crit["eta_star"])]
    assert len(finite), "no finite threshold in the tiny run: nothing to compare"
    for r in finite.itertuples():
        assert (f"instance {r.instance}: eta* measured", report.fmt(float(r.eta_star))) in rows


def test_tiny_report_covers_every_experiment(tiny_run):
    out, _, _, _ = tiny_run
    verdicts = pd.read_csv(out / "results" / "verdicts.csv", dtype=str, keep_default_na=False)
    from paper_figs.reproduce import _experiment_names

    for name in _experiment_names():
        assert (verdicts["source"] == f"bandit:{name}").any(), f"no verdict rows from experiment {name!r}"
        stored = [p for p in (out.parent / "store").glob(f"{name}*/results.parquet") if p.stat().st_size > 0]
        assert stored, f"{name}: no stored sweep results under {out.parent / 'store'}"
    assert (verdicts["source"] == "llm_probe").any(), "no verdict rows from the tiny-Qwen runs"
    mapped = {src for _, _, sources, _ in report.PAPER_CLAIMS for src in sources}
    unmapped = set(verdicts["source"]) - mapped
    assert not unmapped, f"verdict sources not mapped to a paper claim: {unmapped}"
    assert "## Coverage: the claims of both papers" in (out / "REPORT.md").read_text()


def test_a_missing_source_is_reported_not_faked(tmp_path, monkeypatch):
    """With an experiment unregistered, its figure is skipped with a 'not available yet' reason, the other
    figures are still made, and the command exits 3."""
    import bandits.experiments as registry

    from paper_figs.cli import main, make_figures
    from paper_figs.data import Sources

    monkeypatch.setitem(registry.EXPERIMENTS, "methods", "bandits.experiments.no_such_module")
    made = make_figures(Sources("test", store=tmp_path / "store"), ["fig6_methods", "fig5_taxonomy"],
                        out_dir=tmp_path, log=lambda s: None)
    assert isinstance(made["fig6_methods"], str) and made["fig6_methods"].startswith("not available yet")
    assert not (tmp_path / "fig6_methods.png").exists()
    assert (tmp_path / "fig5_taxonomy.png").stat().st_size > 5_000
    assert main(["--only", "fig6_methods", "--mode", "test", "--store", str(tmp_path / "s"),
                 "--out", str(tmp_path)]) == 3
