"""REPORT.md and the README table on constructed claims: identity and derived rows are never counted (not even
as inconclusive), an unmeasured claim prints "not measured: <reason>" and no interval, and a row counts under a
statement only by its own key, role and block (premise, exploratory and discovery-only rows listed apart).
Expected counts come from the claims' own fields (form, measured, verdict, key, role, block), tallied here by
hand, not from gapdyn.count_verdicts or gapdyn.evidence.claims.listing."""

from __future__ import annotations

import pytest

import gapdyn
from paper_figs import report

ABOVE = gapdyn.Criterion.above(0.5)
IDENT = gapdyn.Criterion.identity(1.0, tol=0.01)


TAXONOMY = ("WAPO", "token taxonomy")


def _claim(cid, estimate, lo, hi, criterion, *, form="law", **kw):
    kw.setdefault("key", TAXONOMY)
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
    assert head.startswith("1 claims hold, 0 do not hold, 2 are inconclusive: ")
    assert "2 identity rows and 2 derived rows" in head
    assert "| 1: taxonomy.holds | 0 | 2 | 4 |" in head
    table = report.readme_table(CLAIMS)  # every row shown; identity and derived rows in their own section
    counted_part, apart_part = table.split("## Identity and derived rows")
    assert {r[1] for r in _rows(counted_part) if r[1].startswith("taxonomy.")} == EVIDENCE
    assert {r[1] for r in _rows(apart_part) if r[1].startswith("taxonomy.")} == APART


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
    value = report.README_COLUMNS.index("estimate [interval]")
    assert readme["taxonomy.unmeasured"][value] == "not measured: too few instances (2 < 10)"
    assert readme["taxonomy.holds"][value] == "0.9 [0.8, 0.95] (95 %)"


def _confirmed(c, **kw):
    return gapdyn.Claim.from_dict({k: v for k, v in c.to_dict().items() if k != "verdict"} | {"block": "confirmation"}
                                  | kw)


def test_a_row_counts_only_under_its_own_key_role_and_confirmation_block():
    """Hand-tallied: of seven confirmation rows that hold, only the two whose key is a statement and whose role is
    test count; a premise check, an exploratory row, a row without a key and a discovery-only row are listed apart
    under their own headings; a row counts under its key's statement, never under another."""
    good = _claim("taxonomy.counted", 0.9, 0.8, 0.95, ABOVE)
    rows = [
        _confirmed(good),
        _confirmed(good, id="stagnation.keyed_taxonomy"),  # another experiment's id: counted under its key
        _confirmed(good, id="safe_step.premise", role="premise", key=("beyond the papers", "safe step rule")),
        _confirmed(good, id="threshold.exploratory", role="exploratory", key=("Suk & Duan", "Theorem 2")),
        _confirmed(good, id="threshold.beyond", key=None),
        _claim("threshold.discovery_only", 0.9, 0.8, 0.95, ABOVE, key=("Suk & Duan", "Theorem 2")),
        _confirmed(_claim("threshold.broken", 1.5, 1.5, 1.5, IDENT, key=None)),
    ]
    assert rows[-1].verdict == "does not hold"
    head = report.readme_headline(rows)
    assert head.startswith("2 claims hold, 0 do not hold, 0 are inconclusive: ")
    assert ("1 premise checks, 2 exploratory rows, 1 discovery-only rows, 1 identity rows (1 broken: threshold.broken)"
            " and 0 derived rows") in head
    lines = {r[1].split(":")[0]: r for r in _rows(head) if len(r) == 6}
    assert lines["token taxonomy"][2:] == ["2: taxonomy.counted, stagnation.keyed_taxonomy", "0", "0", "0"]
    assert lines["Theorem 2"][2:] == ["0", "0", "0", "2"]
    assert lines["safe step rule"][2:] == ["0", "0", "0", "1"]
    assert lines["rows that name no registered statement (beyond the papers)"][5] == "2"
    table = report.readme_table(rows)
    sections = {s.split("\n", 1)[0]: s for s in table.split("## ")[1:]}
    ids = {k: {r[1] for r in _rows(v) if r[1] != "claim"} for k, v in sections.items()}
    assert ids["Counted: tests of a registered statement"] == {"taxonomy.counted", "stagnation.keyed_taxonomy"}
    assert ids["Listed apart: premise checks"] == {"safe_step.premise"}
    assert ids["Listed apart: exploratory rows"] == {"threshold.exploratory", "threshold.beyond"}
    assert ids["Listed apart: discovery-only rows"] == {"threshold.discovery_only"}
    assert ids["Identity and derived rows"] == {"threshold.broken"}
    assert "Broken identities (a defect, verdict \"does not hold\"): threshold.broken." in table
    report_text = _render(rows)
    counted = report_text.split("## Listed apart")[0]
    assert {r[0] for r in _rows(counted) if len(r) == len(report.CLAIM_COLUMNS)} - {"id"} == {"taxonomy.counted",
                                                                                     "stagnation.keyed_taxonomy"}


def test_in_quick_mode_discovery_rows_count_as_indicative():
    rows = [_claim("taxonomy.a", 0.9, 0.8, 0.95, ABOVE), _claim("taxonomy.b", 0.9, 0.8, 0.95, ABOVE, role="premise")]
    head = report.readme_headline(rows)
    assert head.startswith("1 claims hold, 0 do not hold, 0 are inconclusive: indicative (no confirmation block ran)")
    assert report.readme_table(rows).startswith("**Indicative verdicts (quick mode):**")


def test_a_statement_with_only_identity_rows_says_none_is_counted():
    text = _render([c for c in CLAIMS if c.id in APART])
    (cov,) = [r for r in _rows(text) if r[0] == "WAPO" and r[1].startswith("token taxonomy")]
    assert cov[3] == "no counted claim (+2 identity, 2 derived: shown, not counted)"
    counted = text.split("## Identity and derived rows")[0]
    assert "Summary:" not in counted and "no row of this run tests a registered statement" in counted


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
