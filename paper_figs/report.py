"""REPORT.md and the README's "What it found" table: renderings of the run's claims, nothing decided here.

Every verdict is a :class:`gapdyn.Claim` made by an experiment's ``analyse`` (or :func:`paper_figs.llm.llm_claims`)
through :func:`gapdyn.decide_verdict`. This module only lays claims out: the decided block of each claim id
(confirmation when it ran, else discovery), each row under the registered statement its own key names
(:data:`gapdyn.evidence.claims.STATEMENTS`) and counted there only as a confirmation-block test
(:func:`gapdyn.evidence.claims.listing`); premise checks, exploratory, discovery-only, identity and derived rows listed apart
with their verdicts; the replication table with disagreement flags.
``results/claims.json`` (:func:`gapdyn.claims_to_json`) and ``results/claims.csv`` hold the same claims, so a
test can check that the report quotes the run and nothing else.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import numpy as np
import tyro

import gapdyn
from gapdyn.evidence.claims import STATEMENTS, listing
from gapdyn.cmdline import Mode, command, output_dir, parse, say
from gapdyn.io import atomic_write_text, check_output_path, write_with

__all__ = ["fmt", "CLAIM_COLUMNS", "LISTED_APART", "decided_claims", "coverage_table", "statement_label",
           "write_results", "read_claims", "read_runs", "render_report", "readme_table", "readme_headline",
           "llm_block", "LLM_MARKERS", "main"]

CLAIM_COLUMNS = ("id", "block", "form", "source", "statistic", "estimate", "lo", "hi", "n", "n_planned", "criterion",
                 "verdict", "why", "p_adjusted")
"""Columns of the claim tables in REPORT.md."""

LISTED_APART = (("premise", "Premise checks", "checks that a test's premise holds (e.g. that the constant step "
                 "does collapse before a rule is said to prevent it)"),
                ("exploratory", "Exploratory rows", "beyond a statement's premise or form, or about no registered "
                 "statement (\"beyond the papers\")"),
                ("discovery only", "Discovery-only rows", "no confirmation block ran for them: indicative"))
"""The listings of :func:`gapdyn.evidence.claims.listing` shown apart from the counted rows (not counted), with a title and
what they hold; identity and derived rows have their own section."""


def statement_label(key) -> str:
    """"paper: item: statement" of a registered statement key; rows without a key name none."""
    if key is None:
        return "(no registered statement)"
    st = STATEMENTS[tuple(key)]
    return f"{st.paper}: {st.item}: {st.text}"


def fmt(x) -> str:
    """How a number appears in the report (the same rule as gapdyn's claim tables: 4 significant digits)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    if isinstance(x, (bool, np.bool_)):
        return "yes" if x else "no"
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    if isinstance(x, (float, np.floating)):
        return f"{float(x):.4g}"
    return str(x)


def decided_claims(claims: Iterable[gapdyn.Claim]) -> list[gapdyn.Claim]:
    """One claim per id: the confirmation block's when it ran, else the discovery block's (first-seen order)."""
    out: dict[str, gapdyn.Claim] = {}
    for c in claims:
        if c.id not in out or (c.block == "confirmation" and out[c.id].block != "confirmation"):
            out[c.id] = c
    return list(out.values())


def _confirmation_only(claims) -> bool:
    """Count only confirmation rows when the confirmation block ran; a quick run's discovery rows are indicative."""
    return any(c.block == "confirmation" for c in claims)


def coverage_table(claims: Iterable[gapdyn.Claim]) -> list[list[str]]:
    """Rows (paper, statement, claim ids, verdict counts): per registered statement, the decided claims whose key
    is that statement; those that count (:func:`gapdyn.evidence.claims.listing`) by verdict, the rest named apart."""
    claims = list(claims)
    shown = decided_claims(claims)
    conf = _confirmation_only(claims)
    rows = []
    for key, st in STATEMENTS.items():
        got = [c for c in shown if c.key == key]
        if not got:
            rows.append([st.paper, f"{st.item}: {st.text}", "-", st.note or "not in this run"])
            continue
        where = [listing(c, confirmation_only=conf) for c in got]
        counts = gapdyn.count_verdicts([c for c, w in zip(got, where) if w == "counted"])
        text = "; ".join(f"{k}: {v}" for k, v in counts.items() if v and k not in ("identity", "derived"))
        text = text or "no counted claim"
        apart = [f"{where.count(k)} {k}" for k in ("premise", "exploratory", "discovery only", "identity", "derived")
                 if where.count(k)]
        if apart:
            text += f" (+{', '.join(apart)}: shown, not counted)"
        rows.append([st.paper, f"{st.item}: {st.text}", ", ".join(c.id for c in got), text])
    return rows


def write_results(results_dir: Path, claims: Iterable[gapdyn.Claim]) -> list[Path]:
    """``claims.json`` (every claim of every block, reloadable) and ``claims.csv`` under ``results_dir``."""
    claims = list(claims)
    results_dir = Path(results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    cj, cc = check_output_path(results_dir / "claims.json"), check_output_path(results_dir / "claims.csv")
    atomic_write_text(cj, gapdyn.claims_to_json(claims))
    table = gapdyn.claims_table(claims)
    write_with(cc, lambda tmp: table.to_csv(tmp, index=False))
    return [cj, cc]


def read_claims(path: Path) -> list[gapdyn.Claim]:
    """Claims from a ``claims.json`` (or the ``results`` folder / output folder holding one); a file that is not a
    list of valid claim records is refused with one ValueError naming it."""
    path = Path(path)
    for cand in (path, path / "claims.json", path / "results" / "claims.json"):
        if cand.is_file():
            try:
                return gapdyn.claims_from_json(cand.read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError and UnicodeDecodeError included
                raise ValueError(f"{cand}: not a claims file: {' '.join(str(exc).split())}") from None
    raise ValueError(f"path must be a claims.json or a folder holding results/claims.json, got {path}")


def _run_name(f: Path) -> str:
    """The experiment of ``<out>/<experiment>-<mode>/claims.json``."""
    return f.parent.name.rsplit("-", 1)[0]


def read_runs(paths: Iterable[str | Path]) -> list[gapdyn.Claim]:
    """The claims of `gapdyn bandit run` outputs: each path a claims.json or a folder searched for them; ids
    qualified by the experiment (``<experiment>.<id>``) as reproduce does. One file per run: two files holding a
    claim of the same id and block are two copies of one run, read once when equal and refused (both paths
    named) when they differ; a file with no claims is refused."""
    files: list[Path] = []
    for r in paths:
        p = Path(r)
        found = [p] if p.is_file() else sorted(p.glob("**/claims.json"))
        if not found:
            raise ValueError(f"--runs: no claims.json in {p}")
        files += [f for f in found if f.resolve() not in {g.resolve() for g in files}]
    by_file: dict[Path, list[gapdyn.Claim]] = {}
    owner: dict[tuple[str, str], Path] = {}
    out: list[gapdyn.Claim] = []
    for f in files:
        name = _run_name(f)
        claims = [c if c.id.startswith(("llm.", f"{name}.")) else dataclasses.replace(c, id=f"{name}.{c.id}")
                  for c in read_claims(f)]
        if not claims:
            raise ValueError(f"{f}: holds no claims")
        same = sorted({str(owner[(c.id, c.block)]) for c in claims if (c.id, c.block) in owner})
        for g in same:
            if by_file[Path(g)] != claims:
                raise ValueError(f"--runs: two claims files of the same run disagree: {g} and {f}; pass one")
        by_file[f] = claims
        if same:  # an identical copy: read once
            continue
        owner.update({(c.id, c.block): f for c in claims})
        out += claims
    return out


def _md(rows: list[list[str]], header: list[str]) -> str:
    import pandas as pd  # here, not at the top: `gapdyn claims --help` and its argument errors load no pandas

    return gapdyn.markdown_table(pd.DataFrame(rows, columns=header))


def _claims_md(claims: list[gapdyn.Claim]) -> str:
    """The claim table; an unmeasured claim shows "not measured: <reason>" where its estimate would be and no
    interval (never a placeholder number)."""
    table = gapdyn.claims_table(claims).astype({"estimate": object})
    for i, c in enumerate(claims):
        if not c.measured:
            table.loc[i, ["estimate", "lo", "hi"]] = [f"not measured: {c.reason}", math.nan, math.nan]
    return gapdyn.markdown_table(table, CLAIM_COLUMNS)


_MODE_NOTE = {
    "test": "Mode `test` uses the smallest sizes (a plumbing check for the test suite): the verdicts below are "
            "not evidence either way.",
    "quick": "Quick mode runs the discovery block only (seeds 0-19, small sweeps): the verdicts are indicative; "
             "`gapdyn reproduce --mode full` adds the confirmation block (seeds 1000-1019) that decides.",
    "full": "Full mode: discovery and confirmation blocks; each claim's verdict is the confirmation block's.",
}


def render_report(*, mode: str, seconds: float, seed, claims: Iterable[gapdyn.Claim], figures: Mapping[str, object],
                  captions: Mapping[str, str], unavailable: Mapping[str, str]) -> str:
    """The markdown text of REPORT.md: coverage, counted claims (tests of a registered statement), the rows listed
    apart, identity and derived rows, replication, figures."""
    claims = list(claims)
    shown = decided_claims(claims)
    conf_only = _confirmation_only(claims)
    where = {id(c): listing(c, confirmation_only=conf_only) for c in shown}
    counted = [c for c in shown if where[id(c)] == "counted"]
    identities = [c for c in shown if not c.counts_as_evidence]  # identity and derived forms
    out = [
        "# gapdyn reproduction: report", "",
        f"Mode `{mode}`, seed {'default' if seed is None else seed}, wall time {seconds:.0f} s. Every row below is a "
        "claim computed in this run (all blocks in `results/claims.json` and `results/claims.csv`); verdicts are "
        "decided by `gapdyn.decide_verdict` from the interval and the criterion frozen before the run "
        "(docs/evidence.md). " + _MODE_NOTE.get(mode, ""), "",
        "## Coverage: the statements of both papers", "",
        _md(coverage_table(claims), ["paper", "statement", "claims", "verdicts in this run"]), "",
        "## Claims", "",
    ]
    if counted:
        counts = gapdyn.count_verdicts(counted)
        out += ["Summary: " + ", ".join(f"{k}: {v}" for k, v in counts.items() if k not in ("identity", "derived"))
                + ".", "",
                _claims_md(counted), ""]
    else:
        out += ["(no counted claims: no row of this run tests a registered statement as its test)" if shown else
                "(no claims: no experiment was available)", ""]
    for kind, title, what in LISTED_APART:
        rows = [c for c in shown if where[id(c)] == kind]
        if rows:
            out += [f"## Listed apart: {title.lower()} ({what}; shown, not counted)", "", _claims_md(rows), ""]
    out += ["## Identity and derived rows (true by construction, or consequences of the model's own equations; "
            "shown, never counted)", ""]
    out += [_claims_md(identities) if identities else "(none in this run)", ""]
    conf = [c for c in claims if c.block == "confirmation"]
    if conf:
        rep = gapdyn.replication_table([c for c in claims if c.block == "discovery"], conf)
        out += ["## Replication: discovery vs confirmation", "",
                gapdyn.markdown_table(rep, ["id", "discovery", "confirmation", "verdict", "flag"]), ""]
    out += ["## Figures", ""]
    for name, made in figures.items():
        if isinstance(made, str):
            out.append(f"- **{name}**: {made}")
        else:
            files = ", ".join(f"`{Path(p).name}`" for p in made)
            out.append(f"- **{name}** ({files}): {captions.get(name, '')}")
    out.append("")
    if unavailable:
        out += ["## Not available in this run", ""]
        out += [f"- {k}: {v}" for k, v in unavailable.items()]
        out.append("")
    return "\n".join(out)


def claim_value(c: gapdyn.Claim) -> str:
    """"estimate [lo, hi] (95 %)" of a measured claim, else "not measured: <reason>" (the tables' one rule)."""
    if not c.measured:
        return f"not measured: {c.reason}"
    return f"{fmt(c.estimate)} [{fmt(c.interval[0])}, {fmt(c.interval[1])}] ({c.confidence * 100:g} %)"


_REASON_N = re.compile(r"\(n = (\d+)[;)]|every one of the (\d+) ")
"""The n a 'not measured' reason names: gapdyn.evidence.coverage.too_few_reason's "(n = 20; ...)" or "every one of the 40
instances has the same value"."""


def claim_n(c: gapdyn.Claim) -> str:
    """n used, and planned where the planner sized it. A claim not measured shows the n its reason names (the
    sample it had); else its n when above 1, else "-" (an unmeasured estimate's n of 1 is a placeholder)."""
    n = str(c.n)
    if not c.measured:
        m = _REASON_N.search(c.reason or "")
        n = next(g for g in m.groups() if g) if m else (n if c.n > 1 else "-")
    return n + ("" if c.n_planned is None else f" / {c.n_planned} planned")


README_COLUMNS = ("paper statement", "claim", "role", "form", "estimate [interval]", "n used / planned", "criterion",
                  "verdict", "why inconclusive", "block")
"""Columns of the tables of docs/claims.md (:func:`readme_table`)."""


def _statement_order(c: gapdyn.Claim) -> int:
    keys = list(STATEMENTS)
    return keys.index(c.key) if c.key is not None else len(keys)


def readme_table(claims: Iterable[gapdyn.Claim]) -> str:
    """docs/claims.md: every decided row (the confirmation block's where it ran) in one of its listings
    (:func:`gapdyn.evidence.claims.listing`): the counted tests of each registered statement, then the premise checks,
    exploratory and discovery-only rows, then the identity and derived rows with their verdicts (a broken identity
    reads "does not hold" and is named). When no confirmation block ran, a note says the verdicts are indicative
    (quick mode) and discovery rows count."""
    claims = list(claims)
    conf_only = _confirmation_only(claims)
    shown = sorted(decided_claims(claims), key=_statement_order)  # stable: run order within a statement
    where = {id(c): listing(c, confirmation_only=conf_only) for c in shown}

    def table(rows):
        return _md([[statement_label(c.key), c.id, c.role, c.form, claim_value(c), claim_n(c), c.criterion_text,
                     c.verdict, c.why, c.block] for c in rows], list(README_COLUMNS))

    note = ("Verdicts from the confirmation block (held-out seeds from 1000 on). A row counts under a statement only "
            "when its key is that statement, its role is `test` and its block is confirmation; every other row is "
            "listed apart below, with its verdict." if conf_only else
            "**Indicative verdicts (quick mode):** only the discovery block ran; `gapdyn reproduce --mode full` "
            "adds the confirmation block that decides.")
    counted = [c for c in shown if where[id(c)] == "counted"]
    out = [note, "", "## Counted: tests of a registered statement", "",
           table(counted) if counted else "(none)", ""]
    for kind, title, what in LISTED_APART:
        rows = [c for c in shown if where[id(c)] == kind]
        if rows:
            out += [f"## Listed apart: {title.lower()}", "", f"{title}: {what}. Shown, not counted.", "",
                    table(rows), ""]
    rest = [c for c in shown if where[id(c)] in ("identity", "derived")]
    broken = [c.id for c in rest if c.form == "identity" and c.verdict == "does not hold"]
    out += ["## Identity and derived rows", "",
            "True by construction, or consequences of the model's own equations: shown with their verdicts, never "
            "counted. " + (f"Broken identities (a defect, verdict \"does not hold\"): {', '.join(broken)}." if broken
                           else "No identity is broken."), "", table(rest) if rest else "(none)"]
    return "\n".join(out)


def readme_headline(claims: Iterable[gapdyn.Claim], *, claims_page: str = "docs/claims.md") -> str:
    """The README's headline: per registered statement, how its counted rows came out (rows whose key is that
    statement, role `test`, block confirmation where that block ran), the rows that hold / do not hold named, and
    how many rows of that statement are listed apart; a last row for the rows that name no statement. The full
    listing is on ``claims_page``."""
    claims = list(claims)
    conf_only = _confirmation_only(claims)
    shown = decided_claims(claims)
    where = {id(c): listing(c, confirmation_only=conf_only) for c in shown}
    lines = ["| paper | statement | holds | does not hold | inconclusive | listed apart |", "|---|---|---|---|---|---|"]

    def cell(ids):
        return f"{len(ids)}" + (f": {', '.join(ids)}" if 0 < len(ids) <= 4 else "")

    for key, st in STATEMENTS.items():
        got = [c for c in shown if c.key == key]
        if not got:
            continue
        counted = [c for c in got if where[id(c)] == "counted"]
        by = {v: [c.id for c in counted if c.verdict == v] for v in ("holds", "does not hold", "inconclusive")}
        text = f"{st.item}: {st.text}".replace("|", chr(92) + "|")
        lines.append(f"| {st.paper} | {text} | {cell(by['holds'])} | {cell(by['does not hold'])} "
                     f"| {len(by['inconclusive'])} | {len(got) - len(counted)} |")
    none = [c for c in shown if c.key is None]
    if none:
        lines.append(f"| - | rows that name no registered statement (beyond the papers) | - | - | - | {len(none)} |")
    counted = [c for c in shown if where[id(c)] == "counted"]
    counts = gapdyn.count_verdicts(counted)
    kinds = [where[id(c)] for c in shown]
    broken = [c.id for c in shown if c.form == "identity" and c.verdict == "does not hold"]
    apart = (f"{kinds.count('premise')} premise checks, {kinds.count('exploratory')} exploratory rows, "
             f"{kinds.count('discovery only')} discovery-only rows, {kinds.count('identity')} identity rows"
             + (f" ({len(broken)} broken: {', '.join(broken)})" if broken else "")
             + f" and {kinds.count('derived')} derived rows")
    head = (f"{counts['holds']} claims hold, {counts['does not hold']} do not hold, {counts['inconclusive']} are "
            f"inconclusive: the confirmation-block tests of a registered statement (a row counts under a statement "
            f"only when its key is that statement and its role is `test`). Listed apart, not counted: {apart}. Every "
            f"row, with its form, role, estimate, interval, n used / planned, criterion, verdict and why an "
            f"inconclusive row is inconclusive: [{Path(claims_page).name}]({claims_page}).")
    if not conf_only:
        head = head.replace("the confirmation-block tests", "indicative (no confirmation block ran): the tests")
    return head + "\n\n" + "\n".join(lines)


LLM_MARKERS = ("<!-- llm-table: generated, do not edit by hand -->", "<!-- /llm-table -->")
"""The README's generated block of tiny-Qwen study results (:func:`llm_block`)."""


def llm_block(folders: Iterable[Path]) -> str:
    """The README's tiny-Qwen block from committed study folders (each: claims.json, run.json with the command, wall
    time, load and warm checkpoint hash of the run that made it, and where the study has one, survival.csv and the
    pilot's plan.json): per study, the survival table of the confirmation block (alerted / recovered / ends
    collapsed / failed; discovery when no confirmation ran), its primaries with estimate, interval, Holm-adjusted
    p, n used / planned and verdict (or its verdict counts when it has none), and the plan's reasons."""
    import json

    import pandas as pd

    parts = []
    for d in folders:
        d = Path(d)
        if not ((d / "survival.csv").is_file() or (d / "run.json").is_file()):
            continue
        meta = json.loads((d / "run.json").read_text()) if (d / "run.json").is_file() else {}
        surv = pd.read_csv(d / "survival.csv") if (d / "survival.csv").is_file() else pd.DataFrame()
        if "block" in surv and (surv["block"] == "confirmation").any():
            surv = surv[surv["block"] == "confirmation"]
        head = f"**{meta.get('title', d.name)}** (`{meta.get('command', '?')}`"
        if "wall_min" in meta:
            head += f"; {meta['wall_min']:.0f} min wall, load {meta.get('load', '?')}"
        if meta.get("warm_sha256"):
            head += f"; warm checkpoint sha256 {meta['warm_sha256'][:12]}…"
        head += f"; [{d.name}]({d.as_posix()}))"
        cols = [c for c in ("method", "arm", "lr", "n", "alerted", "recovered", "collapsed", "failed") if c in surv]
        rows = []
        for _, r in surv.iterrows():
            rate = "" if "cp_lo" not in surv else f"{fmt(r['rate'])} [{fmt(r['cp_lo'])}, {fmt(r['cp_hi'])}]"
            rows.append([fmt(r[c]) if not isinstance(r[c], str) else r[c] for c in cols] + [rate] +
                        ([fmt(r["reward_last25"])] if "reward_last25" in surv else []))
        names = [{"collapsed": "ends collapsed"}.get(c, c) for c in cols] + ["collapse rate [CP 95 %]"] + (
            ["reward, last 25 steps"] if "reward_last25" in surv else [])
        every = decided_claims(read_claims(d / "claims.json")) if (d / "claims.json").is_file() else []
        prim = [c for c in every if c.primary]
        plines = [f"- `{c.id}`: {claim_value(c)}, p (Holm) {fmt(c.p_adjusted)}, n {claim_n(c)} → **{c.verdict}**"
                  for c in prim]
        plan = json.loads((d / "plan.json").read_text()) if (d / "plan.json").is_file() else None
        if plan and "rows" in plan:
            plines += [f"- plan from the pilot: {plan['n']} seeds per arm (floor {plan.get('n_min', '?')}, budget "
                       f"{plan.get('n_max', '?')}); " + "; ".join(f"`{r['id']}`: {r['reason']}" for r in plan["rows"])]
        if not prim and every:
            n = gapdyn.count_verdicts(every)
            plines.append("- no primary; " + ", ".join(f"{v} {k}" for k, v in n.items() if v) + " (every row: claims.md)")
        table = [_md(rows, names)] if len(surv) else []
        parts.append("\n".join([head, ""] + table + (["", "Primaries:" if prim else "Claims:"] + plines if plines else [])))
    return "\n\n".join(parts) if parts else "No tiny-Qwen study is committed under docs/verdicts."


@dataclass
class ClaimsArgs:
    """Print the claims table (docs/claims.md's: every row under its listing, counted rows per statement key)
    from a reproduction's claims (confirmation verdicts where the confirmation block ran, else indicative
    discovery verdicts) and write it to <out>/README_table.md."""

    out_dir: Annotated[str | None, tyro.conf.arg(name="out")] = None
    """A `gapdyn reproduce` output folder (or a claims.json) to read (default ./gapdyn_out/reproduce)."""
    from_store: bool = False
    """Instead of reading claims.json: re-judge every experiment of --mode from the sweep store (cached runs)."""
    mode: Mode = "quick"
    """The experiments' sizes, with --from-store."""
    store: str | None = None
    """Sweep store for --from-store (default: the reproduction's, <out>/store)."""
    llm_study: str | None = None
    """A `gapdyn train ablation` folder (or its claims.json): its claims replace the reproduction's tiny-Qwen
    claims (ids llm.*)."""
    runs: tuple[str, ...] = ()
    """Instead of a reproduction: the claims.json files (or folders searched for them) of `gapdyn bandit run`
    outputs, merged in the order given, one file per run (an identical copy read once, two that disagree refused)."""
    write: str | None = None
    """Also write the table to this markdown file (e.g. docs/claims.md), with the command that made it."""
    readme: str | None = None
    """Also replace the generated headline block of this README (between its claims-table markers)."""


@command("gapdyn claims")
def main(argv: list[str]) -> int:
    """``gapdyn claims [--out DIR]``: the README table of a reproduction's claims."""
    args = parse(ClaimsArgs, argv, prog="gapdyn claims")
    out = output_dir("reproduce", args.out_dir, announce=False)
    if args.runs:
        claims = read_runs(args.runs)
    elif not args.from_store:
        claims = read_claims(out)
        if not claims:
            raise ValueError(f"{out}: its claims file holds no claims")
    else:
        from bandits.experiments import EXPERIMENTS

        from .data import NotAvailable, Sources

        sources = Sources(args.mode, store=Path(args.store) if args.store else out / "store")
        claims = []
        for name in EXPERIMENTS:
            try:
                claims += sources.claims(name)
            except NotAvailable as exc:
                say("claims", f"{name}: not available ({exc})")
    if args.llm_study:
        study = read_claims(Path(args.llm_study))
        if not study:
            raise ValueError(f"--llm-study: {args.llm_study} holds no claims")
        claims = [c for c in claims if not c.id.startswith("llm.")] + study
        say("claims", f"tiny-Qwen claims from {args.llm_study} ({len(study)})")
    table = readme_table(claims)
    print(table)
    if args.write:
        import shlex

        cmd = "gapdyn claims " + " ".join(shlex.quote(a) for a in argv)
        dest = Path(args.write)
        atomic_write_text(dest, "# Claims: every tested statement with its verdict\n\n"
                        f"Generated by `{cmd}`; do not edit by hand. How a verdict is decided: "
                        "[evidence.md](evidence.md).\n\n" + table + "\n")
        say("claims", f"wrote {dest}")
    if args.readme:
        import shlex

        readme = Path(args.readme)
        text = readme.read_text()
        start, end = "<!-- claims-table: generated, do not edit by hand -->", "<!-- /claims-table -->"
        if start not in text or end not in text:
            raise ValueError(f"--readme: {readme} has no {start} ... {end} block")
        cmd = "gapdyn claims " + " ".join(shlex.quote(a) for a in argv)
        page = args.write or "docs/claims.md"
        block = f"{start}\n{readme_headline(claims, claims_page=page)}\n\nGenerated by `{cmd}`.\n{end}"
        text = text[:text.index(start)] + block + text[text.index(end) + len(end):]
        lo, hi = LLM_MARKERS
        if lo in text and hi in text:
            folders = sorted({f.parent for r in args.runs for pat in ("*/survival.csv", "*/run.json")
                              for f in Path(r).glob(pat)})
            block = f"{lo}\n{llm_block(folders)}\n\nGenerated by `{cmd}`.\n{hi}"
            text = text[:text.index(lo)] + block + text[text.index(hi) + len(hi):]
        atomic_write_text(readme, text)
        say("claims", f"updated {readme}")
    if out.is_dir():
        atomic_write_text(out / "README_table.md", table + "\n")
        say("claims", f"wrote {out / 'README_table.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
