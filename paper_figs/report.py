"""REPORT.md: the headline numbers of one reproduction run and the verdict table of every claim.

Everything in the report is read from the run's own outputs (the experiments' ``analyse`` verdict
tables and the figures' ``headline`` numbers); the same numbers are written to
``results/headline.json`` and ``results/verdicts.csv`` next to it, so a test can check that the
report quotes the run and nothing else.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd

__all__ = ["fmt", "VERDICT_COLUMNS", "PAPER_CLAIMS", "coverage_table", "holds_category", "normalise_verdict",
           "write_results", "render_report"]

VERDICT_COLUMNS = ("source", "claim", "setting", "measured", "expected", "holds")


_UNIT_TESTS = "checked by the unit tests (closed form vs finite differences / Monte Carlo), not in this run"
_NO_CPU = "not reproducible on a CPU (model scale); the tiny-Qwen runs are the stand-in"

PAPER_CLAIMS: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    ("Suk & Duan", "grad Phi = g+ - g- (the Gradient Gap is the gradient of the log-odds); every method's "
     "expected direction is a scalar times the Gap", (), _UNIT_TESTS),
    ("Suk & Duan", "Theorem 1: J(K) >= sigmoid(logit J0 + M(K)/2) under the step condition; accuracy is "
     "logistic in M", ("bandit:logistic",), ""),
    ("Suk & Duan", "Theorem 2: above a step-size threshold even aligned steps collapse J to 0",
     ("bandit:threshold",), ""),
    ("Suk & Duan", "Theorem 3: eta* ~ (1 - J)/T; 1/|o| normalisation cancels one T",
     ("bandit:length", "bandit:success_rate"), ""),
    ("Suk & Duan", "a fixed eta stagnates below J = 1; convergence must be judged by M",
     ("bandit:stagnation",), ""),
    ("Suk & Duan", "GRPO on Qwen2.5-Math-7B (the paper's LLM runs)", (), _NO_CPU),
    ("WAPO", "token taxonomy: peak/valley x sign of A predicts the sign of the entropy change",
     ("gapdyn:taxonomy",), ""),
    ("WAPO", "WAPO keeps the Gap direction and down-weights solved prompts ((1 - J) factor): more stable "
     "than GRPO / Dr. GRPO at equal step", ("bandit:methods", "llm_probe"), ""),
    ("WAPO", "collapse modes of RLVR runs (high-entropy off-task; repetitive malformed)", (),
     "shown in figure 7 (alerts by rule of llm_probe's documented collapse criterion); no verdict row: the "
     "paper's criterion is not public"),
    ("WAPO", "WAPO vs GRPO/DAPO/GSPO on 1.5B-4B models, MATH-500 etc. (the paper's LLM runs)", (), _NO_CPU),
)
"""Each claim of the two papers, the verdict sources that test it in a reproduction run, and for claims
without a source where they are covered instead (or why not)."""


def coverage_table(verdicts: pd.DataFrame) -> list[list[str]]:
    """Rows (paper, claim, sources, verdicts in this run) for :data:`PAPER_CLAIMS`."""
    rows = []
    for paper, claim, sources, note in PAPER_CLAIMS:
        if not sources:
            rows.append([paper, claim, "-", note or "not tested"])
            continue
        got = verdicts[verdicts["source"].isin(sources)] if len(verdicts) else verdicts
        if not len(got):
            rows.append([paper, claim, ", ".join(sources), "not run (source not available)"])
            continue
        counts = got["holds"].map(holds_category).value_counts()
        rows.append([paper, claim, ", ".join(sources), "; ".join(f"{k}: {v}" for k, v in counts.items())])
    return rows


def fmt(x) -> str:
    """How a number appears in the report: 4 significant digits, ints as ints, booleans as yes/no."""
    if isinstance(x, (bool, np.bool_)):
        return "yes" if x else "no"
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    if isinstance(x, (float, np.floating)):
        x = float(x)
        if math.isnan(x):
            return "nan"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        if abs(x) < 1e-12:  # round-off around an exact zero
            return "0"
        return f"{x:.4g}"
    return str(x)


def _holds_text(v) -> str:
    if isinstance(v, (bool, np.bool_)):
        return "holds" if v else "does not hold"
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "not measured"
    return str(v)


def normalise_verdict(verdict: pd.DataFrame, source: str) -> pd.DataFrame:
    """An ``analyse`` verdict table with a ``source`` column and ``holds`` as text."""
    missing = [c for c in VERDICT_COLUMNS[1:] if c not in verdict.columns]
    if missing:
        raise ValueError(f"verdict table of {source!r} lacks columns {missing}")
    df = verdict.loc[:, list(VERDICT_COLUMNS[1:])].copy()
    df.insert(0, "source", source)
    df["holds"] = [_holds_text(v) for v in df["holds"]]
    df["measured"] = [fmt(v) for v in df["measured"]]
    df["expected"] = [fmt(v) for v in df["expected"]]
    return df.reset_index(drop=True)


def holds_category(h) -> str:
    """holds / holds only in a named setting / does not hold / other (n/a, inconclusive, a finding)."""
    h = str(h)
    if h.startswith("holds only"):
        return "holds only in a named setting"
    if h.startswith("holds"):
        return "holds"
    if h.startswith("does not hold"):
        return "does not hold"
    return "other (n/a, not measured, inconclusive or a finding)"


def _jsonable(x):
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.bool_,)):
        return bool(x)
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)
    return x


def write_results(results_dir: Path, headline: Mapping[str, Mapping], verdicts: pd.DataFrame) -> list[Path]:
    """``headline.json`` (section -> name -> number) and ``verdicts.csv`` under ``results_dir``."""
    results_dir = Path(results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    hj = results_dir / "headline.json"
    hj.write_text(json.dumps(_jsonable(headline), indent=2, sort_keys=True, allow_nan=True))
    vc = results_dir / "verdicts.csv"
    verdicts.to_csv(vc, index=False)
    return [hj, vc]


def _md_table(rows: list[list[str]], header: list[str]) -> str:
    def clean(s):
        return str(s).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(clean(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


_MODE_NOTE = {
    "test": "Mode `test` uses the smallest sizes (a plumbing check for the test suite): the verdicts below are "
            "not evidence either way.",
    "quick": "Quick mode uses small sweeps (CPU minutes): treat each verdict as a smoke test of the claim, not as "
             "the paper-scale measurement (`gapdyn reproduce --mode full`).",
    "full": "Full mode: the paper-scale sweeps.",
}


def render_report(
    *,
    mode: str,
    seconds: float,
    seed,
    headline: Mapping[str, Mapping],
    verdicts: pd.DataFrame,
    figures: Mapping[str, object],
    captions: Mapping[str, str],
    unavailable: Mapping[str, str],
) -> str:
    """The markdown text of REPORT.md."""
    out = [
        "# gapdyn quick reproduction: report",
        "",
        f"Mode `{mode}`, seed {'default' if seed is None else seed}, wall time {seconds:.0f} s. "
        "Every number below was computed in this run (also in `results/headline.json`; verdicts in "
        "`results/verdicts.csv`). " + _MODE_NOTE.get(mode, ""),
        "",
        "## Headline numbers",
        "",
    ]
    for section, numbers in headline.items():
        out += [f"### {section}", "", _md_table([[k, fmt(v)] for k, v in numbers.items()], ["quantity", "value"]), ""]
    if not headline:
        out += ["(no headline numbers: no data source was available)", ""]
    out += ["## Coverage: the claims of both papers", "",
            _md_table(coverage_table(verdicts), ["paper", "claim", "tested by", "verdicts in this run"]), ""]
    out += ["## Verdicts: every claim tested in this run", ""]
    if len(verdicts):
        counts = verdicts["holds"].map(holds_category).value_counts()
        out += ["Summary: " + ", ".join(f"{k}: {v}" for k, v in counts.items()) + ".", ""]
        out += [_md_table(verdicts.loc[:, list(VERDICT_COLUMNS)].astype(str).values.tolist(), list(VERDICT_COLUMNS)), ""]
    else:
        out += ["(no verdict tables: no experiment was available)", ""]
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
