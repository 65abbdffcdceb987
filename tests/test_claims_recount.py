"""The README's generated headline, recounted from the committed docs/verdicts/*/claims.json by code of its own
(plain JSON, no gapdyn): a row counts under a statement only when its key is that statement, its role is "test",
its form is counted and its block is confirmation; the recount must equal the rendered table. docs/claims.md must
list every decided row, identity and derived rows included, with its verdict."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VERDICTS = ROOT / "docs" / "verdicts"
COUNTED_FORMS = {"bound", "law", "existence", "comparison"}


def _decided_rows() -> dict[str, dict]:
    """Per claim id (qualified by the experiment as `gapdyn claims --runs` does), the confirmation row where that
    block ran, else the discovery row."""
    rows: dict[str, dict] = {}
    for f in sorted(VERDICTS.glob("*/claims.json")):
        name = f.parent.name.rsplit("-", 1)[0]
        for r in json.loads(f.read_text()):
            cid = r["id"] if r["id"].startswith(("llm.", name + ".")) else f"{name}.{r['id']}"
            if cid not in rows or (r["block"] == "confirmation" and rows[cid]["block"] != "confirmation"):
                rows[cid] = dict(r, id=cid)
    return rows


def _recount():
    by_key: dict[tuple, Counter] = {}
    apart: dict[tuple, int] = Counter()
    total = Counter()
    for r in _decided_rows().values():
        key = tuple(r["key"]) if r.get("key") else None
        counted = (key is not None and r["role"] == "test" and r["form"] in COUNTED_FORMS
                   and r["block"] == "confirmation")
        if counted:
            by_key.setdefault(key, Counter())[r["verdict"]] += 1
            total[r["verdict"]] += 1
        else:
            apart[key] += 1
    return by_key, apart, total


def _readme_block() -> str:
    text = (ROOT / "README.md").read_text()
    start, end = "<!-- claims-table: generated, do not edit by hand -->", "<!-- /claims-table -->"
    return text[text.index(start) + len(start):text.index(end)]


def test_the_readme_headline_equals_an_independent_recount():
    by_key, apart, total = _recount()
    block = _readme_block()
    head = block.strip().splitlines()[0]
    m = re.match(r"(\d+) claims hold, (\d+) do not hold, (\d+) are inconclusive", head)
    assert m, head
    assert tuple(map(int, m.groups())) == (total["holds"], total["does not hold"], total["inconclusive"])
    table = {}
    for line in block.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if not line.startswith("| ") or line.startswith("| paper") or cells[0] == "-":
            continue
        paper, statement, holds, dnh, inc, rest = cells
        table[(paper, statement.split(":", 1)[0])] = (int(holds.split(":")[0]), int(dnh.split(":")[0]), int(inc),
                                                      int(rest))
    keyed = set(by_key) | {k for k in apart if k is not None}
    assert set(table) == keyed, set(table) ^ keyed
    for key, got in table.items():
        c = by_key.get(key, Counter())
        assert got == (c["holds"], c["does not hold"], c["inconclusive"], apart[key]), key
    (none,) = [ln for ln in block.splitlines() if ln.startswith("| - |")]
    assert none.rstrip(" |").endswith(str(apart[None]))


def test_the_readme_names_every_counted_row_that_holds_or_does_not():
    block = _readme_block()
    for r in _decided_rows().values():
        counted = (r.get("key") and r["role"] == "test" and r["form"] in COUNTED_FORMS and r["block"] == "confirmation")
        line = next((ln for ln in block.splitlines() if r.get("key") and f"| {r['key'][0]} | {r['key'][1]}:" in ln), "")
        if counted and r["verdict"] in ("holds", "does not hold"):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            cell = cells[2] if r["verdict"] == "holds" else cells[3]
            if int(cell.split(":")[0]) <= 4:
                assert r["id"] in cell, (r["id"], line)
        elif line:
            assert f" {r['id']}," not in line and not line.endswith(f" {r['id']} |"), (r["id"], line)


def test_claims_md_lists_every_decided_row_with_its_verdict():
    text = (ROOT / "docs" / "claims.md").read_text()
    cells = {}
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("| paper statement"):
            row = [c.strip() for c in line.strip().strip("|").split(" | ")]
            cells[row[1]] = row
    rows = _decided_rows()
    assert set(cells) == set(rows), set(cells) ^ set(rows)
    for cid, r in rows.items():
        assert cells[cid][7] == r["verdict"] and cells[cid][9] == r["block"] and cells[cid][3] == r["form"], cid
    identity = text[text.index("## Identity and derived rows"):]
    broken = [cid for cid, r in rows.items() if r["form"] == "identity" and r["verdict"] == "does not hold"]
    for cid in (c for c, r in rows.items() if r["form"] in ("identity", "derived")):
        assert f"| {cid} |" in identity, cid
    for cid in broken:  # a broken identity is named, not only listed
        assert cid in identity.split("\n\n")[1], cid


def test_the_committed_block_is_what_the_command_renders():
    """README block and docs/claims.md regenerated by `gapdyn claims --runs docs/verdicts ...` from these files."""
    from paper_figs import report

    claims = report.read_runs([VERDICTS])
    assert report.readme_headline(claims) in _readme_block()
    assert report.readme_table(claims) in (ROOT / "docs" / "claims.md").read_text()
