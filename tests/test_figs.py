"""paper_figs: the shared style's file metadata, the figure-module contract, the taxonomy table against
an independent numpy route, a figure script run on its own, the gallery doc, the report as a rendering of
claims (identity rows apart, replication flags, the README table), the tiny-Qwen claims against scipy, and
the tiny reproduction (every figure written, REPORT.md quoting exactly the claims of this run)."""

from __future__ import annotations

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


@pytest.mark.slow  # a fresh interpreter renders one figure; the figures themselves are tested in-process
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


def _report_rows(text: str) -> list[tuple[str, ...]]:
    rows = []
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("|---"):
            rows.append(tuple(c.strip().replace("\\|", "|") for c in line.strip().strip("|").split(" | ")))
    return rows


def _claim(cid, estimate, lo, hi, criterion, block="discovery", **kw):
    import gapdyn

    keys = {"taxonomy.": ("WAPO", "token taxonomy"), "stagnation.": ("Suk & Duan", "stagnation"),
            "threshold.": ("Suk & Duan", "Theorem 2"), "llm.wapo": ("WAPO", "stability"),
            "llm.nsr": ("Zhu et al.", "NSR vs PSR")}  # the statement each constructed row tests
    key = next((k for p, k in keys.items() if cid.startswith(p)), None)
    return gapdyn.Claim(id=cid, source="test", statement="s", setting="t", statistic="x", estimate=estimate,
                        interval=(lo, hi), n=5, criterion_text=criterion.describe(), criterion=criterion,
                        block=block, **({"form": None if criterion.kind == "identity" else "law", "key": key} | kw))


def _close(cell: str, value: float) -> bool:
    return float(cell) == pytest.approx(value, rel=5e-4, abs=1e-12)


def test_report_renders_claims_identity_apart_and_replication():
    import gapdyn

    above, ident = gapdyn.Criterion.above(0.5), gapdyn.Criterion.identity(1.0, tol=0.01)
    claims = [_claim("taxonomy.a", 0.9, 0.8, 0.95, above), _claim("taxonomy.b", 1.0, 1.0, 1.0, ident),
              _claim("taxonomy.a", 0.4, 0.3, 0.45, above, block="confirmation"),
              _claim("stagnation.c", 0.6, 0.4, 0.7, above)]
    text = report.render_report(mode="full", seconds=1.0, seed=None, claims=claims, figures={}, captions={},
                                unavailable={})
    counted, identities = text.split("## Identity and derived rows")
    assert "Summary: holds: 0, does not hold: 1, inconclusive: 0." in counted  # stagnation.c: discovery only
    rows = _report_rows(counted)
    decided = [r for r in rows if r[0] == "taxonomy.a"]
    cols = report.CLAIM_COLUMNS
    v, e, lo, hi = (cols.index(k) for k in ("verdict", "estimate", "lo", "hi"))
    assert len(decided) == 1 and decided[0][1] == "confirmation" and decided[0][v] == "does not hold"
    assert _close(decided[0][e], 0.4) and _close(decided[0][lo], 0.3) and _close(decided[0][hi], 0.45)
    assert not any(r[0] == "taxonomy.b" for r in rows)
    assert any(r[0] == "taxonomy.b" and r[v] == "identity" for r in _report_rows(identities))
    rep = [r for r in _report_rows(text.split("## Replication")[1]) if r[0] == "taxonomy.a"]
    assert rep == [("taxonomy.a", "holds", "does not hold", "does not hold", "disagree")]
    assert "(+1 identity: shown, not counted)" in text
    table = report.readme_table(claims)
    assert table.startswith("Verdicts from the confirmation block")
    assert "taxonomy.b" not in table.split("## Identity and derived rows")[0]
    assert "| taxonomy.b |" in table.split("## Identity and derived rows")[1]
    quick = report.readme_table([c for c in claims if c.block == "discovery"])
    assert quick.startswith("**Indicative verdicts (quick mode):**")


def test_llm_claims_against_scipy():
    """Per lr, paired by seed: the collapse-rate difference and a one-sided Fisher test, the reward difference and
    Wilcoxon, against scipy on the same table. A run counts as collapsed when its reward trajectory ends collapsed
    (constructed: 0.4 then 0 for the last 25 steps), never because an alert fired (some healthy runs alert)."""
    from scipy.stats import fisher_exact, wilcoxon

    from paper_figs.llm import LLMResults, llm_claims

    rng = np.random.default_rng(0)
    rows, steps, alerts = [], [], []
    for lr in (3e-4, 1e-3):
        for seed in range(6):
            for m in ("grpo", "wapo"):
                ends = bool(rng.random() < (0.7 if m == "grpo" else 0.3))
                alerted = ends or bool(rng.random() < 0.5)
                rows.append({"method": m, "lr": lr, "seed": seed, "reward_first25": 0.3, "steps_run": 35,
                             "alerted": alerted, "collapsed": ends, "reward_last25": float(rng.random())})
                r = [0.4] * 10 + [0.0 if ends else 0.4] * 25
                steps += [{"method": m, "lr": lr, "seed": seed, "step": k, "reward": v} for k, v in enumerate(r)]
                alerts += [{"method": m, "lr": lr, "seed": seed, "step": 12, "rule": "reward_collapse"}] if alerted else []
    runs = pd.DataFrame(rows)
    res = LLMResults(runs.drop(columns="collapsed"), pd.DataFrame(steps), pd.DataFrame(), pd.DataFrame(alerts), {},
                     Path("."))
    got = {c.id: c for c in llm_claims(res, n_resamples=500)}
    assert set(got) == {f"llm.{k}@lr{lr:g}" for k in ("wapo_fewer_collapses", "wapo_higher_reward")
                        for lr in (3e-4, 1e-3)}
    for lr in (3e-4, 1e-3):
        g = runs[(runs.method == "grpo") & (runs.lr == lr)].sort_values("seed")
        w = runs[(runs.method == "wapo") & (runs.lr == lr)].sort_values("seed")
        cg, cw = int(g["collapsed"].sum()), int(w["collapsed"].sum())
        c = got[f"llm.wapo_fewer_collapses@lr{lr:g}"]
        assert c.estimate == pytest.approx((cg - cw) / 6) and c.block == "discovery"
        assert c.p_value == pytest.approx(fisher_exact([[cg, 6 - cg], [cw, 6 - cw]], alternative="greater").pvalue)
        diff = w["reward_last25"].to_numpy() - g["reward_last25"].to_numpy()
        c = got[f"llm.wapo_higher_reward@lr{lr:g}"]
        assert c.estimate == pytest.approx(diff.mean())
        assert c.p_value == pytest.approx(wilcoxon(diff, alternative="greater").pvalue)
    assert all(c.p_adjusted >= c.p_value for c in got.values())


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
    made = {p.name for p in (cwd / "gapdyn_out").iterdir()}
    assert {"reproduce", "store"} <= made <= {"reproduce", "store", "warm"}  # warm: llm_probe.warmup (unless
    # $GAPDYN_WARM_CACHE points elsewhere, as in this suite)
    assert str(out) in printed.splitlines()[0], "the command must say where it writes, first"
    assert _package_files() == before, "the run wrote into the package folder"


def test_demo_beside_equals_the_demo_in_this_process(tiny_run, tmp_path):
    """The tiny reproduction ran its demo in a second process (Sources.start_llm, the default on 2+ cores): it
    wrote, bit for bit, what the demo run in this process writes (same mode and seed; wall-clock columns apart)."""
    import os

    out, rc, _, _ = tiny_run
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: reproduce runs the demo in its own process")
    a = data.read_llm_results(out.parent / "store" / "llm_probe" / "test")
    here = data.Sources("test", store=tmp_path, seed=3).llm()
    timing = ["wall_s", "step_time"]
    pd.testing.assert_frame_equal(a.runs.drop(columns=timing, errors="ignore"),  # outcomes, rewards, probes
                                  here.runs.drop(columns=timing, errors="ignore"))
    pd.testing.assert_frame_equal(a.metrics.drop(columns=timing, errors="ignore"),
                                  here.metrics.drop(columns=timing, errors="ignore"))
    assert len(a.runs) == 8 and not a.metrics.empty


def test_tiny_reproduction_writes_every_figure(tiny_run):
    out, rc, printed, _ = tiny_run
    assert rc == 0, f"gapdyn reproduce --mode test exited {rc}:\n{printed[-3000:]}"
    assert str(out / "REPORT.md") in printed, "the command must print where the report is"
    for name in FIGURES:
        for ext in ("png", "pdf"):
            f = out / f"{name}.{ext}"
            assert f.exists() and f.stat().st_size > 5_000, f"{f} missing or empty"
        assert Image.open(out / f"{name}.png").text["Description"] == figure_module(name).CAPTION


def test_tiny_report_quotes_the_claims_of_this_run(tiny_run):
    out, _, _, _ = tiny_run
    text = (out / "REPORT.md").read_text()
    claims = report.read_claims(out)
    assert claims, "no claims"
    rows = {r[0]: r for r in _report_rows(text) if len(r) == len(report.CLAIM_COLUMNS)}
    for c in report.decided_claims(claims):
        r = rows.get(c.id)
        assert r is not None, f"claim {c.id} not in REPORT.md"
        col = {k: i for i, k in enumerate(report.CLAIM_COLUMNS)}
        assert r[1] == c.block and r[col["verdict"]] == c.verdict and int(r[col["n"]]) == c.n
        if c.measured:
            assert _close(r[col["estimate"]], c.estimate) and _close(r[col["lo"]], c.interval[0])
            assert _close(r[col["hi"]], c.interval[1])
        else:  # no placeholder numbers: the row says why
            assert r[col["estimate"]] == f"not measured: {c.reason}" and r[col["lo"]] == r[col["hi"]] == ""
    counted = text.split("## Identity and derived rows")[0]
    assert not any(r[0] == c.id for c in claims if not c.counts_as_evidence for r in _report_rows(counted))
    # the claims are those of the sweep results stored by this run: re-judged from the store, they agree
    from bandits.experiments import load

    for name in ("taxonomy", "logistic", "stagnation"):
        mod = load(name)
        again = mod.run(mod.Config.test(), store=out.parent / "store", backend="serial", progress=False)
        stored = {c.id: c for c in claims if c.id in mod.CRITERIA}
        assert {c.id: c for c in again.claims} == stored


def test_tiny_report_covers_every_experiment(tiny_run):
    out, _, _, _ = tiny_run
    claims = report.read_claims(out)
    from bandits.experiments import load

    from llm_probe.experiments.ablation import CRITERIA as LLM_CRITERIA
    from paper_figs.reproduce import _experiment_names

    known = set(LLM_CRITERIA)
    from paper_figs.reproduce import _runs_here

    for name in _experiment_names():
        if not _runs_here(name):  # a registered study with its own command (the tiny-Qwen studies)
            continue
        ids = {i if i.startswith(f"{name}.") else f"{name}.{i}" for i in load(name).CRITERIA}
        known |= ids
        assert ids & {c.id for c in claims}, f"no claims from experiment {name!r}"
        stored = [p for p in (out.parent / "store").glob(f"{name}*/results.parquet") if p.stat().st_size > 0]
        assert stored, f"{name}: no stored sweep results under {out.parent / 'store'}"
    assert {c.id.split("@")[0] for c in claims} <= known
    assert any(c.id.startswith("llm.wapo_") for c in claims), "no claims from the tiny-Qwen runs"
    unmapped = [c.id for c in claims if c.key is None and c.role == "test" and c.counts_as_evidence]
    assert not unmapped, f"counted tests that name no registered statement: {unmapped}"
    assert "## Coverage: the statements of both papers" in (out / "REPORT.md").read_text()


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


_SLOPE_LABEL = re.compile(r"^(?P<name>[^:]+): slope (?P<b>-?\d+\.\d\d) \[(?P<lo>-?\d+\.\d\d), (?P<hi>-?\d+\.\d\d)\]$")


def _claim_label(c) -> tuple[str, str, str]:
    return f"{c.estimate:.2f}", f"{c.interval[0]:.2f}", f"{c.interval[1]:.2f}"


def _drawn_slope(ax, text: str) -> float:
    """The log-log slope of the line labelled ``text``, read back from its vertices."""
    (line,) = [ln for ln in ax.get_lines() if ln.get_label() == text]
    x, y = (np.log(np.asarray(v, float)) for v in line.get_data())
    return float((y[-1] - y[0]) / (x[-1] - x[0]))


def _legend_entries(ax) -> list[str]:
    leg = ax.get_legend()
    return sorted(t.get_text() for t in leg.get_texts()) if leg is not None else []


def _legend_notes(ax) -> list[str]:
    """The lines of a legend's title (where plots name the series they could not draw)."""
    leg = ax.get_legend()
    return leg.get_title().get_text().splitlines() if leg is not None and leg.get_title().get_text() else []


def _drawn_labels(ax) -> list[str]:
    """Labels of the artists on ``ax`` that show at least one finite point (lines, scatters, error bars)."""
    from matplotlib.collections import PathCollection
    from matplotlib.container import ErrorbarContainer
    from matplotlib.lines import Line2D

    out = []
    for art in [*ax.get_lines(), *ax.collections, *ax.containers]:
        lab = art.get_label()
        if not lab or lab.startswith("_"):
            continue
        if isinstance(art, ErrorbarContainer):
            xy = np.column_stack([np.asarray(v, float) for v in art[0].get_data()])
        elif isinstance(art, Line2D):
            xy = np.column_stack([np.asarray(v, float) for v in art.get_data()])
        elif isinstance(art, PathCollection):
            xy = np.asarray(art.get_offsets(), float)
        else:
            continue
        if xy.size and np.isfinite(xy).all(axis=1).any():
            out.append(lab)
    return sorted(out)


def test_loglog_slopes_legend_lists_exactly_the_drawn_artists():
    """A group without points gets no legend marker (it is named in the legend's title); a group with points
    but no slope labels its points; a slope labels its line. Checked on the matplotlib objects."""
    from paper_figs import plots
    from paper_figs.style import new_figure

    df = pd.DataFrame({"T": [1, 2, 4, 1, 2, 4], "y": [1.0, 0.5, 0.25, 1.0, 0.9, np.nan],
                       "g": ["a", "a", "a", "b", "b", "b"]})
    slopes = {"a": (-1.0, "a: slope -1.00"), "b": (None, "b: no slope"), "c": (None, "c: no points")}
    fig, axes = new_figure(1, 1)
    ax = axes[0, 0]
    plots.plot_loglog_slopes(df, ax, x="T", y="y", hue="g", slopes=slopes, reference=-1.0)
    assert _legend_entries(ax) == _drawn_labels(ax) == sorted(["a: slope -1.00", "b: no slope", "slope -1 guide"])
    assert _legend_notes(ax) == ["not drawn: c: no points"]
    (line,) = [ln for ln in ax.get_lines() if ln.get_label() == "a: slope -1.00"]
    x, y = (np.log(np.asarray(v, float)) for v in line.get_data())
    assert (y[-1] - y[0]) / (x[-1] - x[0]) == pytest.approx(-1.0, rel=1e-12)
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_fig2_draws_four_panels_with_the_claims_slopes(tiny_run):
    """Figure 2 from the tiny run's store: no panel marked unavailable, and every slope it prints and draws is
    the length / success_rate claim's (read back from the legend and the line), matched by id."""
    from bandits.experiments import length, success_rate

    from paper_figs import fig2_critical_eta
    from paper_figs.data import Sources
    from paper_figs.views import SUCCESS_RATE_SHOWN

    out, _, _, _ = tiny_run
    sources = Sources("test", store=out.parent / "store")
    res_len, res_sr = sources.experiment("length"), sources.experiment("success_rate")
    assert not res_len.block("confirmation") and not res_sr.block("confirmation")
    claims = {c.id: c for c in res_len.claims + res_sr.claims}
    fig = fig2_critical_eta.draw(sources)
    assert len(fig.axes) == 4
    labels = []
    for ax in fig.axes:
        assert not any(t.get_text().startswith(("not available", "error:")) for t in ax.texts), ax.get_title()
        assert ax.get_legend() is not None, ax.get_title()
        assert _legend_entries(ax) == _drawn_labels(ax), ax.get_title()  # no marker for what is not plotted
        labels.append([t.get_text() for t in ax.get_legend().get_texts()]
                      + [n.removeprefix("not drawn: ") for n in _legend_notes(ax)])
    drawn = 0
    for ax, texts in zip(fig.axes[:3], labels[:3]):
        J0 = float(re.search(r"J0 = ([\d.]+)", ax.get_title()).group(1))
        shown = set()
        for text in texts:
            m = _SLOPE_LABEL.match(text)
            if m:
                rho = float(re.fullmatch(r"rho = ([\d.]+), raw", m["name"]).group(1))
                c = claims[length.slope_claim_id(rho, J0)]
                assert (m["b"], m["lo"], m["hi"]) == _claim_label(c)
                assert _drawn_slope(ax, text) == pytest.approx(c.estimate, rel=1e-9)
                shown.add(rho)
                drawn += 1
            if ", 1/|o|: slope" in text:
                b, d = re.search(r"slope (-?\d+\.\d\d) \+ (-?\d+\.\d\d)", text).groups()
                raw, ident = claims[length.slope_claim_id(1.0, J0)], claims[length.identity_claim_id(J0)]
                assert (b, d) == (f"{raw.estimate:.2f}", f"{ident.estimate:.2f}")
                assert _drawn_slope(ax, text) == pytest.approx(raw.estimate + ident.estimate, rel=1e-9)
        if "across" in ax.get_title():  # every rho with a measured claim has its line, the others say why not
            measured = {r for r in length.RHOS if claims[length.slope_claim_id(r, J0)].measured}
            assert shown == measured
            assert sum(t.endswith("no slope") for t in texts) >= len(length.RHOS) - len(measured)
    names = {v: k for k, v in SUCCESS_RATE_SHOWN.items()}
    for setting in success_rate.SETTINGS:  # every setting is named, with its slope or why there is none
        assert any(t.startswith(setting.replace("=", " = ")) for t in labels[3]), setting
    for text in labels[3]:  # the bound claim's share and verdict, never a fitted slope
        assert not _SLOPE_LABEL.match(text), text
        if "bound violated" in text:
            setting, rest = text.split(", ", 1)
            c = claims[success_rate.slope_claim_id(setting.replace(" ", ""), success_rate.BOUND_MEASURE)]
            assert f"{c.estimate:.0%} of states ({c.verdict})" in rest
    assert names  # the shown measures are named in the legend


def test_claims_command_takes_the_tiny_qwen_rows_from_an_ablation_study(tmp_path, capsys):
    """`gapdyn claims --llm-study DIR`: the study's llm.* claims replace the reproduction's; the rest stays."""
    import gapdyn
    from paper_figs.report import main as claims_main

    above = gapdyn.Criterion.above(0.0)
    repro, study = tmp_path / "repro", tmp_path / "study"
    (repro / "results").mkdir(parents=True)
    study.mkdir()
    (repro / "results" / "claims.json").write_text(gapdyn.claims_to_json(
        [_claim("threshold.sharpness", 1.0, 0.9, 1.1, above), _claim("llm.wapo_higher_reward@lr0.0003", 0.1, -0.1, 0.3,
                                                                      above)]))
    (study / "claims.json").write_text(gapdyn.claims_to_json(
        [_claim("llm.wapo_higher_reward@lr0.0004", 0.2, 0.1, 0.3, above, block="confirmation"),
         _claim("llm.nsr_passk_above_psr@lr0.0004", -0.2, -0.3, -0.1, above, block="confirmation")]))
    assert claims_main(["--out", str(repro), "--llm-study", str(study)]) == 0
    table = (repro / "README_table.md").read_text()
    assert "threshold.sharpness" in table and "llm.wapo_higher_reward@lr0.0004" in table
    assert "@lr0.0003" not in table and "(not mapped" not in table
    assert "Zhu et al." in table  # the NSR/PSR claim sits under its own paper's statement


def test_readme_headline_counts_the_decided_evidence_rows():
    import gapdyn

    above, ident = gapdyn.Criterion.above(0.5), gapdyn.Criterion.identity(1.0, tol=0.01)
    claims = [_claim("taxonomy.a", 0.9, 0.8, 0.95, above), _claim("taxonomy.b", 1.0, 1.0, 1.0, ident),
              _claim("taxonomy.a", 0.4, 0.3, 0.45, above, block="confirmation"),
              _claim("stagnation.c", 0.6, 0.4, 0.7, above), _claim("stagnation.d", 0.9, 0.8, 0.95, above, form="derived")]
    text = report.readme_headline(claims)
    assert text.startswith("0 claims hold, 1 do not hold, 0 are inconclusive: ")  # stagnation.c: discovery only
    assert "1 discovery-only rows, 1 identity rows and 1 derived rows" in text
    row = next(ln for ln in text.splitlines() if "taxonomy" in ln or "token taxonomy" in ln)
    assert "| 0 | 1: taxonomy.a | 0 |" in row


def _synthetic_llm_results(seed: int = 0, steps: int = 30):
    """GRPO and WAPO runs at two lrs and two seeds, in the tables of paper_figs.llm.LLMResults: WAPO has no
    A < 0 completions (its advantage max(r - p_hat, 0) is never negative), so its A < 0 entropy is NaN and its
    negative bins are empty, as in the real runs."""
    from paper_figs.llm import LLMResults

    rng = np.random.default_rng(seed)
    bins = ("pos_peak", "pos_valley", "neg_peak", "neg_valley")
    rows, probes, runs = [], [], []
    for method in ("grpo", "wapo"):
        for lr in (3e-4, 1e-3):
            for s in (0, 1):
                for k in range(steps):
                    n = rng.integers(1, 50, size=4) * (np.array([1, 1, 0, 0]) if method == "wapo" else 1)
                    rows.append({"step": k, "method": method, "lr": lr, "seed": s, "reward": rng.uniform(0, 1),
                                 "entropy/pos_adv": rng.uniform(0.3, 1.2),
                                 "entropy/neg_adv": np.nan if method == "wapo" else rng.uniform(0.3, 1.2),
                                 **{f"taxonomy/{b}": int(v) for b, v in zip(bins, n)}})
                    if k % 5 == 0:
                        probes += [{"step": k, "J_hat": rng.integers(0, 9) / 8, "M": k * rng.uniform(0, 0.3),
                                    "method": method, "lr": lr, "seed": s} for _ in range(4)]
                runs.append({"method": method, "lr": lr, "seed": s, "steps_run": steps, "alerted": False})
    alerts = pd.DataFrame([{"method": "grpo", "lr": 1e-3, "seed": 0, "step": 7, "rule": "reward_collapse",
                            "value": 0.0, "threshold": 0.05}])
    return LLMResults(pd.DataFrame(runs), pd.DataFrame(rows), pd.DataFrame(probes), alerts, {}, Path("."))


def test_fig7_legends_fraction_axes_and_bound_line():
    """Figure 7 on constructed runs: every legend lists exactly the drawn artists (WAPO's absent A < 0 series is
    named in the legend's title, not drawn), the fraction panels (reward, accuracy, bin shares) span [0, 1] and
    hold their data, and the dashed bound is Theorem 1's sigmoid(logit J0 + M/2) (checked against scipy at the
    J0 its label states), with its formula in the label and its source in the caption."""
    from scipy.special import expit, logit

    from paper_figs import fig7_llm_probe

    res = _synthetic_llm_results()
    fig = fig7_llm_probe.draw(res)
    a, b, c, d, e, f = fig.axes
    for ax in fig.axes:
        assert _legend_entries(ax) == _drawn_labels(ax), ax.get_title()
    for ax in (b, c):
        drawn = _drawn_labels(ax)
        assert len(drawn) == 3 and not any("WAPO" in t and "<" in t for t in drawn)
        assert _legend_notes(ax) == ["no completions: WAPO, $A < 0$"]
    for ax in (a, d, e):  # fractions on [0, 1], every drawn point inside
        assert ax.get_ylim() == (0.0, 1.0), ax.get_ylabel()
        ys = np.concatenate([np.asarray(ln.get_ydata(), float) for ln in ax.get_lines()]
                            + [np.asarray(col.get_offsets(), float)[:, 1] for col in ax.collections])
        ys = ys[np.isfinite(ys)]
        assert ys.size and ys.min() >= 0 and ys.max() <= 1
    (bound,) = [ln for ln in d.get_lines() if "Thm 1" in ln.get_label()]
    assert r"\sigma(\mathrm{logit}\,J_0 + M/2)" in bound.get_label() and "Suk & Duan" in bound.get_label()
    J0 = float(re.search(r"J_0\$ = ([\d.]+)", bound.get_label()).group(1))
    M, J = (np.asarray(v, float) for v in bound.get_data())
    np.testing.assert_allclose(J, expit(logit(J0) + M / 2), atol=5e-3)  # J0 printed to 2 decimals
    assert "sigmoid(logit J0 + M/2)" in fig7_llm_probe.CAPTION and "arXiv 2510.08539" in fig7_llm_probe.CAPTION
    import matplotlib.pyplot as plt

    plt.close(fig)


# ---- figures that say what they show: labels and captions against the drawn objects ----------------------------

def test_phase_diagram_names_no_run_cells_the_collapse_colour_and_off_axis_predictors():
    """A grid with a cell never run, a cell below the collapse level and a predictor far left of the grid: the cell
    is hatched and named, the low cell takes the 'under' colour (named), the x axis spans the grid's cells, and the
    predictor is a triangle on the left edge whose legend label gives its value."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    from paper_figs import plots

    df = pd.DataFrame({"eta": [1.0, 10.0, 100.0, 1.0, 10.0], "row": [0, 0, 0, 1, 1], "J": [0.9, 0.5, 1e-5, 0.8, 0.7]})
    curves = pd.DataFrame({"eta_pred": [0.003, 20.0], "row": [0, 1], "predictor": ["bound", "bound"]})
    fig, axes = new_figure(1, 1)
    ax = axes[0, 0]
    im = plots.plot_phase_diagram(df, ax, x="eta", y="row", value="J", curves=curves, curve_y="row",
                                  curve_hue="predictor", curve_lines=False, under=(1e-3, "#000000", "collapsed"),
                                  clip_curves=True)
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "no run at this grid point" in texts and "collapsed" in texts
    assert any(t.startswith("bound (0.003, off the left edge)") for t in texts), texts
    assert to_hex(im.cmap.get_under()) == "#000000" and im.norm.vmin == 1e-3
    assert np.ma.is_masked(im.get_array()) and int(np.ma.getmaskarray(im.get_array()).sum()) == 1
    lo, hi = ax.get_xlim()
    assert lo == pytest.approx(1.0 / np.sqrt(10.0)) and hi == pytest.approx(100.0 * np.sqrt(10.0))
    edge = [ln for ln in ax.get_lines() if ln.get_marker() == "<"]
    assert len(edge) == 1 and np.asarray(edge[0].get_xdata(), float).tolist() == [lo]
    plt.close(fig)


def test_fig1_rows_legend_and_axis_from_the_tiny_run(tiny_run):
    """Figure 1 on the tiny run's store: the x axes span the scanned etas (no predictor widens them), every drawn
    predictor is in the legend, and the instances without eta* (if any) sit above a dashed line, named."""
    import matplotlib.pyplot as plt

    from paper_figs import fig1_phase_diagram
    from paper_figs.data import Sources, threshold_views

    out, _, _, _ = tiny_run
    sources = Sources("test", store=out.parent / "store")
    v = threshold_views(sources.experiment("threshold").results)
    fig = fig1_phase_diagram.draw(sources)
    a, b = fig.axes[0], fig.axes[2]  # the colour bars are axes 1 and 3
    etas = v.exact["eta"].to_numpy(float)
    lo, hi = a.get_xlim()
    assert etas.min() / 10 < lo < etas.min() < etas.max() < hi < etas.max() * 10
    for ax in (a, b):
        assert set(_drawn_labels(ax)) <= set(_legend_entries(ax)), ax.get_title()
    crit = v.critical[v.critical["method"] == "grpo"]
    dashed = [ln for ln in a.get_lines() if ln.get_linestyle() == "--"]
    assert len(dashed) == int((~np.isfinite(crit["eta_star"].to_numpy(float))).any())
    assert "1e-3" in fig1_phase_diagram.CAPTION and "hatched" in fig1_phase_diagram.CAPTION
    plt.close(fig)


def test_fig2_panel_d_draws_no_fitted_line_as_its_caption_says(tiny_run):
    """Panel (d) is descriptive (caption: 'no fitted line'): its only line with a line style is the guide."""
    import matplotlib.pyplot as plt

    from paper_figs import fig2_critical_eta
    from paper_figs.data import Sources

    out, _, _, _ = tiny_run
    fig = fig2_critical_eta.draw(Sources("test", store=out.parent / "store"))
    d = fig.axes[3]
    styled = [ln.get_label() for ln in d.get_lines() if ln.get_linestyle() not in ("None", "", " ")]
    assert styled == ["slope +1 guide"], styled
    assert "no fitted line" in fig2_critical_eta.CAPTION
    plt.close(fig)


def test_fig7_alert_panel_counts_events_and_outcomes_apart():
    """Figure 7 (f): the title counts runs with an alert and runs that end collapsed separately (one run made to
    collapse, one alerted run that does not); each row's label ends with its outcome, recomputed here from the
    rule's definition (last-25-step mean reward < 0.25 x first-10-step mean, that mean >= 0.05); (d)'s bound says
    where Theorem 1's step condition holds."""
    import matplotlib.pyplot as plt

    from paper_figs import fig7_llm_probe

    res = _synthetic_llm_results()
    m = res.metrics
    sel = (m["method"] == "wapo") & np.isclose(m["lr"], 1e-3) & (m["seed"] == 1)
    m.loc[sel & (m["step"] >= 10), "reward"] = 0.0  # collapses from step 10
    fig = fig7_llm_probe.draw(res)
    f, d = fig.axes[5], fig.axes[3]
    expected = {}
    for (meth, lr, seed), g in m.groupby(["method", "lr", "seed"]):
        r = g.sort_values("step")["reward"].to_numpy(float)
        ends = r[:10].mean() >= 0.05 and r[-25:].mean() < 0.25 * r[:10].mean()
        alerted = ((res.alerts["method"] == meth) & np.isclose(res.alerts["lr"], lr) & (res.alerts["seed"] == seed)).any()
        expected[f"{meth.upper()} lr {lr:g} s{seed}"] = "collapsed" if ends else "recovered" if alerted else "healthy"
    shown = dict(t.get_text().rsplit(": ", 1) for t in f.get_yticklabels())
    assert shown == expected and list(expected.values()).count("collapsed") == 1
    assert f.get_title() == (f"alerts (events): {res.alerts.groupby(['method', 'lr', 'seed']).ngroups}/8 runs alerted"
                             "\n1/8 end collapsed (run outcome)")
    (bound,) = [ln for ln in d.get_lines() if "Thm 1" in ln.get_label()]
    assert "step condition" in bound.get_label() and fig7_llm_probe.CONDITION in bound.get_label()
    assert "events, not collapses" in fig7_llm_probe.CAPTION
    plt.close(fig)


def test_fig4_bound_legend_says_where_the_step_condition_is_checked():
    """Figure 4's fixed-eta panels draw Theorem 1's bound with a legend saying its step condition is not checked
    there (the last panel checks it); the drawn curve is sigmoid(logit J0 + M/2) at the labelled J0 (scipy)."""
    import matplotlib.pyplot as plt
    from scipy.special import expit, logit

    from paper_figs import fig4_logistic, plots

    rng = np.random.default_rng(1)
    M = rng.uniform(0, 8, 200)
    df = pd.DataFrame({"M": M, "J": expit(1.2 * M - 2.0), "sampling": "exact"})
    fig, axes = new_figure(1, 1)
    plots.plot_logistic_fit(df, axes[0, 0], J0=0.12, hue="sampling", condition=fig4_logistic.CONDITION)
    (bound,) = [ln for ln in axes[0, 0].get_lines() if ln.get_label().startswith("Thm 1 bound")]
    assert bound.get_label().endswith(fig4_logistic.CONDITION) and "$J_0$ = 0.12" in bound.get_label()
    m, j = (np.asarray(v, float) for v in bound.get_data())
    np.testing.assert_allclose(j, expit(logit(0.12) + m / 2), rtol=1e-12)
    assert "not checked" in fig4_logistic.CAPTION and "where the condition is checked" in fig4_logistic.CAPTION
    plt.close(fig)
