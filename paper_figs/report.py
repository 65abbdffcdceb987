"""REPORT.md and the README's "What holds" table: renderings of the run's claims, nothing decided here.

Every verdict is a :class:`gapdyn.Claim` made by an experiment's ``analyse`` (or :func:`paper_figs.llm.llm_claims`)
through :func:`gapdyn.decide_verdict`. This module only lays claims out: the decided block of each claim id
(confirmation when it ran, else discovery), identity rows apart (shown, never counted), the replication
table with disagreement flags, and :data:`PAPER_CLAIMS` (which claim ids test which statement of the papers).
``results/claims.json`` (:func:`gapdyn.claims_to_json`) and ``results/claims.csv`` hold the same claims, so a
test can check that the report quotes the run and nothing else.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import numpy as np
import pandas as pd
import tyro

import gapdyn
from gapdyn.cmdline import Mode, command, output_dir, parse, say
from gapdyn.io import atomic_write_text, check_output_path, write_with

__all__ = ["fmt", "PAPER_CLAIMS", "CLAIM_COLUMNS", "covers", "decided_claims", "coverage_table",
           "write_results", "read_claims", "render_report", "readme_table", "llm_block", "LLM_MARKERS", "main"]

CLAIM_COLUMNS = ("id", "block", "form", "source", "statistic", "estimate", "lo", "hi", "n", "n_planned", "criterion",
                 "verdict", "why", "p_adjusted")
"""Columns of the claim tables in REPORT.md."""

_NEEDS_ABLATION = "not run: needs `gapdyn train ablation`"
"""What the report says for claim ids that only the tiny-Qwen study (``gapdyn train ablation``) makes."""
_UNIT_TESTS = "checked by the unit tests (closed form vs finite differences / Monte Carlo), not in this run"
_NO_CPU = "not reproducible on a CPU (model scale); the tiny-Qwen runs are the stand-in"

PAPER_CLAIMS: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    ("Suk & Duan", "grad Phi = g+ - g- (the Gradient Gap is the gradient of the log-odds); every method's "
     "expected direction is a scalar times the Gap", (), _UNIT_TESTS),
    ("Suk & Duan", "Theorem 1: J(K) >= sigmoid(logit J0 + M(K)/2) under the step condition; accuracy is "
     "logistic in M", ("logistic.",), ""),
    ("Suk & Duan", "Theorem 2: above a step-size threshold even aligned steps collapse J to 0",
     ("threshold.",), ""),
    ("Suk & Duan", "Theorem 3: eta* ~ (1 - J)/T; 1/|o| normalisation cancels one T",
     ("length.", "success_rate."), ""),
    ("Suk & Duan", "a fixed eta stagnates below J = 1; convergence must be judged by M (not gradient norms)",
     ("stagnation.",), ""),
    ("Suk & Duan", "GRPO on Qwen2.5-Math-7B (the paper's LLM runs)", (), _NO_CPU),
    ("WAPO", "token taxonomy: peak/valley x sign of A predicts the sign of the entropy change",
     ("taxonomy.",), ""),
    ("WAPO", "WAPO keeps the Gap direction and down-weights solved prompts ((1 - J) factor): more stable "
     "than GRPO / Dr. GRPO at equal step", ("methods.", "llm.wapo_fewer_collapses", "llm.wapo_higher_reward",
                                            "llm.wapo_entropy_at_matched_accuracy", "llm.wapo_passk_not_lower"), ""),
    ("WAPO", "collapse modes of RLVR runs (high-entropy off-task; repetitive malformed)", (),
     "shown in figure 7 (alerts by llm_probe's documented collapse rule); no claim: the paper's criterion is "
     "not public"),
    ("WAPO", "WAPO vs GRPO/DAPO/GSPO on 1.5B-4B models, MATH-500 etc. (the paper's LLM runs)", (), _NO_CPU),
    ("Yu et al. (DAPO, arXiv 2503.14476)", "clip-higher counters entropy collapse",
     ("llm.dapo_entropy_at_matched_accuracy",), ""),
    ("Zhu et al. (arXiv 2506.01347)", "negative samples (NSR) keep pass@k at large k better than positive ones (PSR)",
     ("llm.nsr_passk_above_psr",), ""),
    ("Cui et al. (arXiv 2505.22617)", "Lemma 1: per state, dH = -Cov(log pi, dz) to first order in the logit change",
     ("llm.entropy_lemma", "llm.entropy_lemma_adam"), ""),
    ("Cui et al. (arXiv 2505.22617)", "Theorems 1-2: under (natural) policy gradient the entropy change follows "
     "-eta Cov(log pi, pi A) (-eta Cov(log pi, A))", ("llm.entropy_pg_form_sgd", "llm.entropy_npg_form_sgd",
                                                     "llm.entropy_pg_form_adam", "llm.entropy_npg_form_adam",
                                                     "llm.entropy_follows_cov"), ""),
    ("beyond the papers (docs/theory.md section 11)", "the safe step rule keeps runs at a collapse lr from ending "
     "collapsed without slowing learning at a safe lr", ("safe_step.",), ""),
    ("beyond the papers", "a per-step statistic of the probe warns of the final collapse earlier than the falling "
     "reward", tuple(f"llm.warning.{x}_beats_reward" for x in ("M_pos", "headroom_lr", "frac_reward_zero_std",
                                                               "cov_logp_adv")), ""),
)
"""Each statement of the two papers and the claim ids that test it: an exact id, or a prefix ending in "."
(every claim of that experiment); an exact id also covers its settings "id@..." (the tiny-Qwen claims per lr).
Statements without ids say where they are covered instead, or why not. The last rows are statements of other
papers that the tiny-Qwen ablation (llm_probe.experiments.ablation) tests."""


def covers(spec: str, claim_id: str) -> bool:
    """Whether a :data:`PAPER_CLAIMS` entry ("prefix.", or an exact id with any "@setting") covers a claim id."""
    return claim_id.startswith(spec) if spec.endswith(".") else claim_id.split("@")[0] == spec


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


def coverage_table(claims: Iterable[gapdyn.Claim]) -> list[list[str]]:
    """Rows (paper, statement, claim ids, verdict counts of the decided claims, identities apart)."""
    shown = decided_claims(claims)
    rows = []
    for paper, statement, specs, note in PAPER_CLAIMS:
        if not specs:
            rows.append([paper, statement, "-", note or "not tested"])
            continue
        got = [c for c in shown if any(covers(s, c.id) for s in specs)]
        absent = [s for s in specs if s.startswith("llm.") and not any(covers(s, c.id) for c in got)]
        if not got:
            where = _NEEDS_ABLATION if len(absent) == len(specs) else "not in this run"
            rows.append([paper, statement, ", ".join(specs), where])
            continue
        counts = gapdyn.count_verdicts(got)
        text = "; ".join(f"{k}: {v}" for k, v in counts.items() if v and k not in ("identity", "derived"))
        text = text or "no counted claim"
        apart = [f"{counts[k]} {k}" for k in ("identity", "derived") if counts[k]]
        if apart:
            text += f" (+{', '.join(apart)}: shown, not counted)"
        if absent:
            text += f"; {', '.join(absent)}: {_NEEDS_ABLATION}"
        rows.append([paper, statement, ", ".join(c.id for c in got), text])
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
    """Claims from a ``claims.json`` (or the ``results`` folder / output folder holding one)."""
    path = Path(path)
    for cand in (path, path / "claims.json", path / "results" / "claims.json"):
        if cand.is_file():
            return gapdyn.claims_from_json(cand.read_text())
    raise ValueError(f"path must be a claims.json or a folder holding results/claims.json, got {path}")


def _md(rows: list[list[str]], header: list[str]) -> str:
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
    """The markdown text of REPORT.md: coverage, counted claims, identity rows, replication, figures."""
    claims = list(claims)
    shown = decided_claims(claims)
    counted = [c for c in shown if c.counts_as_evidence]
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
        out += ["(no counted claims: every claim of this run is an identity or derived row)" if shown else
                "(no claims: no experiment was available)", ""]
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


def claim_n(c: gapdyn.Claim) -> str:
    """n used, and planned where the planner sized it."""
    return f"{c.n}" + ("" if c.n_planned is None else f" / {c.n_planned} planned")


def readme_table(claims: Iterable[gapdyn.Claim]) -> str:
    """The README's "What holds" table: one row per counted claim, the confirmation verdict where it ran.

    When no confirmation block ran, a note says the verdicts are indicative (quick mode)."""
    claims = list(claims)
    shown = [c for c in decided_claims(claims) if c.counts_as_evidence]
    has_conf = any(c.block == "confirmation" for c in claims)
    def row(label, c):
        return [label, c.id, c.form, claim_value(c), claim_n(c), c.criterion_text, c.verdict, c.why, c.block]

    rows = []
    for paper, statement, specs, _ in PAPER_CLAIMS:
        for c in shown:
            if any(covers(s, c.id) for s in specs):
                rows.append(row(f"{paper}: {statement}", c))
    mapped = {r[1] for r in rows}
    rows += [row("(not mapped to a paper statement)", c) for c in shown if c.id not in mapped]
    mixed = has_conf and any(r[-1] == "discovery" for r in rows)
    note = (("Verdicts from the confirmation block (held-out seeds from 1000 on)"
             + ("; rows whose block is `discovery` come from a quick run and are indicative." if mixed else "."))
            if has_conf else
            "**Indicative verdicts (quick mode):** only the discovery block ran; `gapdyn reproduce --mode full` "
            "adds the confirmation block that decides.")
    return note + "\n\n" + _md(rows, ["paper statement", "claim", "form", "estimate [interval]", "n used / planned",
                                      "criterion", "verdict", "why inconclusive", "block"])


def readme_headline(claims: Iterable[gapdyn.Claim], *, claims_page: str = "docs/claims.md") -> str:
    """The README's headline: per statement of the papers, how its counted claims came out (confirmation
    verdicts where that block ran), and the rows that hold / do not hold named; the full table is on
    ``claims_page``."""
    shown = decided_claims(claims)
    lines = ["| paper | statement | holds | does not hold | inconclusive |", "|---|---|---|---|---|"]
    for paper, statement, specs, note in PAPER_CLAIMS:
        got = [c for c in shown if specs and any(covers(s, c.id) for s in specs) and c.counts_as_evidence]
        if not got:
            continue
        by = {v: [c.id for c in got if c.verdict == v] for v in ("holds", "does not hold", "inconclusive")}
        cell = lambda ids: f"{len(ids)}" + (f": {', '.join(ids)}" if 0 < len(ids) <= 4 else "")  # noqa: E731
        lines.append(f"| {paper} | {statement.replace('|', chr(92) + '|')} | {cell(by['holds'])} | {cell(by['does not hold'])} "
                     f"| {len(by['inconclusive'])} |")
    mapped = [c for c in shown if any(covers(s, c.id) for _, _, specs, _ in PAPER_CLAIMS for s in specs)]
    counts = gapdyn.count_verdicts(mapped)
    extra = len(shown) - len(mapped)
    head = (f"{counts['holds']} claims hold, {counts['does not hold']} do not hold, {counts['inconclusive']} are "
            f"inconclusive ({counts['identity']} identity and {counts['derived']} derived rows shown, not counted"
            + (f"; {extra} exploratory rows that test no paper statement are listed apart" if extra else "") + "). "
            f"Every row, with its form, estimate, interval, n used / planned, criterion and why an inconclusive row "
            f"is inconclusive: [{Path(claims_page).name}]({claims_page}).")
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
    """Print the README's "What holds" table from a reproduction's claims (confirmation verdicts where the
    confirmation block ran, else indicative discovery verdicts) and write it to <out>/README_table.md."""

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
    """Instead of a reproduction: the claims.json files (or folders holding one) of `gapdyn bandit run` outputs,
    merged in the order given (e.g. each experiment's full run)."""
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
        claims = []
        for r in args.runs:
            p = Path(r)
            found = [p] if p.is_file() else sorted(p.glob("**/claims.json"))
            if not found:
                raise ValueError(f"--runs: no claims.json in {p}")
            for f in found:  # <out>/<experiment>-<mode>/claims.json: ids qualified by the experiment, as reproduce does
                name = f.parent.name.rsplit("-", 1)[0]
                claims += [c if c.id.startswith(("llm.", f"{name}.")) else dataclasses.replace(c, id=f"{name}.{c.id}")
                           for c in read_claims(f)]
    elif not args.from_store:
        claims = read_claims(out)
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
