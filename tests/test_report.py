"""REPORT.md and the README table on constructed claims: identity and derived rows are never counted (not even
as inconclusive), an unmeasured claim prints "not measured: <reason>" and no interval, and statements whose
claims only `gapdyn train ablation` makes say that it is needed. Expected counts come from the claims' own
fields (form, measured, verdict), tallied here by hand, not from gapdyn.count_verdicts."""

from __future__ import annotations

import pytest

import gapdyn
from paper_figs import report

ABOVE = gapdyn.Criterion.above(0.5)
IDENT = gapdyn.Criterion.identity(1.0, tol=0.01)


def _claim(cid, estimate, lo, hi, criterion, *, form="law", **kw):
    return gapdyn.Claim(id=cid, source="test", statement="s", setting="t", statistic="x", estimate=estimate,
                        interval=(lo, hi), n=5, criterion_text=criterion.describe(), criterion=criterion,
                        form=None if criterion.kind == "identity" else form, **kw)


# Placeholder numbers (7.25, 6.5, 8.75) that must never reach a table when the claim is unmeasured.
CLAIMS = [
    _claim("taxonomy.holds", 0.9, 0.8, 0.95, ABOVE),
    _claim("taxonomy.straddles", 0.6, 0.4, 0.7, ABOVE),
    _claim("taxonomy.unmeasured", 7.25, 6.5, 8.75, ABOVE, measured=False, reason="too few instances (2 < 10)"),
    _claim("taxonomy.identity_unmeasured", 7.25, 6.5, 8.75, IDENT, measured=False, reason="no run dipped"),
    _claim("taxonomy.identity_ok", 1.0, 1.0, 1.0, IDENT),
    _claim("taxonomy.derived_straddles", 0.6, 0.4, 0.7, ABOVE, form="derived"),
    _claim("taxonomy.derived_unmeasured", 7.25, 6.5, 8.75, ABOVE, form="derived", measured=False, reason="no data"),
]
EVIDENCE = {c.id for c in CLAIMS if c.form not in ("identity", "derived")}
APART = {c.id for c in CLAIMS} - EVIDENCE


def _rows(text: str) -> list[list[str]]:
    return [[c.strip().replace("\\|", "|") for c in line.strip().strip("|").split(" | ")]
            for line in text.splitlines() if line.startswith("| ") and not line.startswith("|---")]


def _render(claims=CLAIMS) -> str:
    return report.render_report(mode="quick", seconds=1.0, seed=None, claims=claims, figures={}, captions={},
                                unavailable={})


def test_identity_and_derived_rows_are_never_counted_as_inconclusive():
    # by hand: holds 1 (taxonomy.holds), inconclusive 2 (straddles, unmeasured); the other four are apart,
    # although three of them have the verdict "inconclusive"
    assert sum(c.verdict == "inconclusive" for c in CLAIMS if c.id in APART) == 3
    text = _render()
    counted, apart = text.split("## Identity and derived rows")
    assert "Summary: holds: 1, does not hold: 0, inconclusive: 2." in counted
    assert {r[0] for r in _rows(counted) if r[0].startswith("taxonomy.")} == EVIDENCE
    assert {r[0] for r in _rows(apart) if r[0].startswith("taxonomy.")} == APART
    (cov,) = [r for r in _rows(text) if r[0] == "WAPO" and r[1].startswith("token taxonomy")]
    assert cov[3] == "holds: 1; inconclusive: 2 (+2 identity, 2 derived: shown, not counted)"
    head = report.readme_headline(CLAIMS)
    assert head.startswith("1 claims hold, 0 do not hold, 2 are inconclusive (2 identity and 2 derived rows")
    assert "| 1: taxonomy.holds | 0 | 2 |" in head
    table = report.readme_table(CLAIMS)
    assert {r[1] for r in _rows(table) if r[1].startswith("taxonomy.")} == EVIDENCE


def test_an_unmeasured_claim_prints_its_reason_and_no_interval():
    text = _render()
    col = {k: i for i, k in enumerate(report.CLAIM_COLUMNS)}
    rows = {r[0]: r for r in _rows(text) if len(r) == len(report.CLAIM_COLUMNS)}
    for c in CLAIMS:
        r = rows[c.id]
        if c.measured:
            assert float(r[col["lo"]]) == pytest.approx(c.interval[0], rel=5e-4)
            assert float(r[col["hi"]]) == pytest.approx(c.interval[1], rel=5e-4)
        else:
            assert r[col["estimate"]] == f"not measured: {c.reason}"
            assert r[col["lo"]] == r[col["hi"]] == ""
    placeholders = ("7.25", "6.5", "8.75")
    assert not any(p in line for line in text.splitlines() for p in placeholders), "a placeholder number printed"
    readme = {r[1]: r for r in _rows(report.readme_table(CLAIMS))}
    assert readme["taxonomy.unmeasured"][3] == "not measured: too few instances (2 < 10)"
    assert readme["taxonomy.holds"][3] == "0.9 [0.8, 0.95] (95 %)"


def test_statements_only_the_ablation_tests_say_it_is_needed():
    """No tiny-Qwen claims in the run: the rows whose ids are all llm.* say "not run: needs `gapdyn train
    ablation`"; a row with some of its experiments present names the llm.* ids still missing."""
    methods = _claim("methods.wapo_more_stable", 0.9, 0.8, 0.95, ABOVE)
    rows = {r[1]: r for r in _rows(_render(CLAIMS + [methods])) if len(r) == 4}
    needs = "not run: needs `gapdyn train ablation`"
    only_llm = [(statement, specs) for _, statement, specs, _ in report.PAPER_CLAIMS
                if specs and all(s.startswith("llm.") for s in specs)]
    assert only_llm, "no statement is tested by the ablation alone"
    for statement, specs in only_llm:
        assert rows[statement][3] == needs, statement
    (wapo,) = [r for s, r in rows.items() if s.startswith("WAPO keeps the Gap direction")]
    wapo_llm = [s for _, st, specs, _ in report.PAPER_CLAIMS if st.startswith("WAPO keeps") for s in specs
                if s.startswith("llm.")]
    assert wapo[2] == "methods.wapo_more_stable"
    assert wapo[3] == f"holds: 1; {', '.join(wapo_llm)}: {needs}"
    # with the tiny-Qwen claims present, nothing says it is needed
    llm = [_claim(f"{s}@lr0.0003", 0.9, 0.8, 0.95, ABOVE) for _, _, specs, _ in report.PAPER_CLAIMS for s in specs
           if s.startswith("llm.")]
    assert "needs `gapdyn train ablation`" not in _render(CLAIMS + [methods] + llm)


def test_a_statement_with_only_identity_rows_says_none_is_counted():
    text = _render([c for c in CLAIMS if c.id in APART])
    (cov,) = [r for r in _rows(text) if r[0] == "WAPO" and r[1].startswith("token taxonomy")]
    assert cov[3] == "no counted claim (+2 identity, 2 derived: shown, not counted)"
    counted = text.split("## Identity and derived rows")[0]
    assert "Summary:" not in counted and "every claim of this run is an identity or derived row" in counted


def test_statements_without_claims_in_the_run_are_not_blamed_on_the_ablation():
    rows = {r[1]: r for r in _rows(_render([])) if len(r) == 4}
    (thm2,) = [r for s, r in rows.items() if s.startswith("Theorem 2")]
    assert thm2[3] == "not in this run"


def test_llm_block_renders_committed_study_outputs(tmp_path):
    """The README's tiny-Qwen block from a constructed study folder: the confirmation rows of survival.csv (the
    discovery rows left out), the command / wall / hash line, and each primary with its numbers and verdict."""
    import dataclasses
    import json

    import pandas as pd

    import gapdyn
    from paper_figs.report import llm_block

    d = tmp_path / "llm-ablation-full"
    d.mkdir()
    pd.DataFrame([dict(block="discovery", method="grpo", lr=4e-4, n=10, alerted=9, recovered=3, collapsed=6, failed=0,
                       rate=0.6, cp_lo=0.26, cp_hi=0.88, reward_last25=0.1),
                  dict(block="confirmation", method="grpo", lr=4e-4, n=30, alerted=21, recovered=7, collapsed=14,
                       failed=1, rate=14 / 29, cp_lo=0.29, cp_hi=0.67, reward_last25=0.2)]).to_csv(d / "survival.csv")
    c = gapdyn.Claim(id="llm.wapo_fewer_collapses@lr0.0004", source="WAPO", statement="s", setting="lr=4e-4",
                     statistic="share", estimate=0.3, interval=(0.1, 0.5), n=30, criterion_text="c",
                     criterion=gapdyn.Criterion.above(0.0, alpha=0.05), block="confirmation", p_value=0.001,
                     p_adjusted=0.006, form="comparison", primary=True, n_planned=88)
    short = dataclasses.replace(c, id="llm.wapo_higher_reward@lr0.0004", estimate=0.08, interval=(0.08, 0.08),
                                measured=False, reason="too few pairs for a valid interval (n = 30)")
    (d / "claims.json").write_text(gapdyn.claims_to_json([c, short]))
    (d / "run.json").write_text(json.dumps({"title": "WAPO vs GRPO", "command": "gapdyn train ablation --mode full",
                                            "wall_min": 61.4, "load": "2-3", "warm_sha256": "ab" * 32}))
    text = llm_block([d])
    assert "**WAPO vs GRPO** (`gapdyn train ablation --mode full`; 61 min wall, load 2-3" in text
    assert "abababababab…" in text and "| 30 | 21 | 7 | 14 | 1 |" in text and "| 10 | 9 |" not in text
    assert ("`llm.wapo_fewer_collapses@lr0.0004`: 0.3 [0.1, 0.5] (95 %), p (Holm) 0.006, n 30 / 88 planned → **holds**"
            in text)
    assert ("`llm.wapo_higher_reward@lr0.0004`: not measured: too few pairs for a valid interval (n = 30), p (Holm) "
            "0.006, n 30 / 88 planned → **inconclusive**" in text)  # an unmeasured primary shows no interval
    assert llm_block([tmp_path / "nothing"]).startswith("No tiny-Qwen study")
