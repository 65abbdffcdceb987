"""The learning-rate number scored against measured critical lrs: the dose-response ground truth of a testbed
study, the lr suggested from a run's first K steps, and the predictor table.

Ground truth, per setting (method, length, size; the random-advantage control apart): the lr of 10 % and 50 %
collapse (gapdyn.evidence.dose.fit_dose_response on the runs' ``collapsed`` labels, profile-likelihood 95 % intervals),
P(learned) per tested lr with Wilson intervals, and the best tested lr (highest P(learned), ties by mean final
held-out accuracy) -- what a user tuning by hand would pick, with hindsight.

Predictions: from each run at an lr below the setting's lr10, the suggestion of llm_probe.lr_finder.lr_suggestion
over its probed steps k < K (the study probes every 5th step: K = 20 gives 4 values, the finder's own runs give K).
Scored per setting: predicted / lr10 (median and quartiles over runs), the safe share (runs whose prediction lies
below lr10, i.e. fitted P(collapse) < 10 %, Wilson interval), and P(learned) at the prediction (the tested lr
nearest below it) against P(learned) at the best tested lr. Baselines in the same table: the best tested lr and
TRL's default GRPO lr (1e-6, GRPOConfig), each placed on the same dose-response.

The length scaling (Suk & Duan, arXiv 2510.08539, Thm 3: eta* proportional to (1 - J) / T) as a predictor: its
constant is fixed on one setting (the reference length) and predicts lr10 of the other lengths from their T
(median completion tokens) and J (pre-RL held-out accuracy).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import numpy as np
import tyro

__all__ = ["TRL_DEFAULT_LR", "SETTING_KEYS", "CRITERIA", "lr_criteria_hash", "ground_truth", "predictions",
           "predictor_table", "length_scaling", "reproduction", "decide", "write_report", "main", "load_study"]

TRL_DEFAULT_LR = 1e-6
"""TRL GRPOConfig's default learning_rate (TRL 0.14-1.x)."""
SETTING_KEYS = ("method", "length", "size", "control")
CRITERIA = {
    "probe_lr": 1e-4, "K": 20,
    "safe": {"share": 0.8, "rule": "Wilson 95 % interval of the share of runs whose suggestion lies below lr10: "
                                    "holds if its lower end >= share, does not hold if its upper end < share"},
    "informative": {"ratio_lo": 0.25, "learn_margin": 0.2,
                    "rule": "median suggestion / lr10 >= ratio_lo and P(learned) at the median suggestion >= "
                            "P(learned) at the best tested lr - learn_margin: holds if both, else does not hold"},
    "length_scaling": {"rule": "Thm 3's (1-J)/T prediction of lr10 at the other length inside the measured lr10's "
                               "95 % profile interval: holds if inside, does not hold if outside"},
    "reproduces": {"factor": 1.1,
                   "rule": "lr10 of a setting on the held-out block (new seeds, the long grid shifted) against the "
                           "calibration block's: holds if the two 95 % profile intervals overlap and the ratio lies "
                           "within [1/factor, factor], does not hold if the intervals are disjoint, else undecided"},
}
"""The lr number's pre-declared criteria (fixed before the held-out block; :func:`lr_criteria_hash`): the primary
predictor is the headroom suggestion from the first K = 20 steps at the documented learning lr 1e-4."""


def lr_criteria_hash(criteria: dict = CRITERIA) -> str:
    """The criteria's hash (gapdyn.evidence.claims.canonical_hash: SHA-256 of the canonical JSON, first 16 hex digits)."""
    from gapdyn.evidence.claims import canonical_hash

    return canonical_hash(criteria)


def _key(summary: dict) -> tuple:
    return tuple(summary["setting"][k] for k in SETTING_KEYS)


def ground_truth(summaries: list[dict]) -> dict:
    """Per setting key: ``{"lr10": DoseFit, "lr50": DoseFit, "per_lr": DataFrame, "best_lr": float, "n": int,
    "T": median completion tokens before RL, "J": mean pre-RL held-out accuracy}`` (failed runs left out)."""
    import pandas as pd

    from gapdyn.evidence.dose import fit_dose_response
    from gapdyn.evidence.stats import wilson_interval

    groups: dict[tuple, list[dict]] = {}
    for s in summaries:
        if s["outcome"] != "failed":
            groups.setdefault(_key(s), []).append(s)
    out = {}
    for key, runs in sorted(groups.items(), key=lambda kv: str(kv[0])):
        lrs = np.array([r["setting"]["lr"] for r in runs])
        collapsed = np.array([r["outcome"] == "collapsed" for r in runs], dtype=int)
        rows = []
        for lr in sorted(set(lrs.tolist())):
            at = [r for r in runs if r["setting"]["lr"] == lr]
            k = sum(r["outcome"] == "learned" for r in at)
            kc = sum(r["outcome"] == "collapsed" for r in at)
            ci, cc = wilson_interval(k, len(at)), wilson_interval(kc, len(at))
            rows.append({"lr": lr, "n": len(at), "learned": k, "P_learned": k / len(at), "P_learned_lo": ci.lo,
                         "P_learned_hi": ci.hi, "collapsed": kc, "P_collapsed": kc / len(at),
                         "P_collapsed_lo": cc.lo, "P_collapsed_hi": cc.hi,
                         "acc_after": float(np.mean([r["heldout_acc_after"] for r in at]))})
        per_lr = pd.DataFrame(rows)
        best = per_lr.sort_values(["P_learned", "acc_after"], ascending=False).iloc[0]
        out[key] = {"lr10": fit_dose_response(lrs, collapsed, p=0.1), "lr50": fit_dose_response(lrs, collapsed, p=0.5),
                    "per_lr": per_lr, "best_lr": float(best["lr"]), "n": len(runs),
                    "T": float(np.median([r["completion_tokens_median_before"] for r in runs])),
                    "J": float(np.mean([r["heldout_acc_before"] for r in runs]))}
    return out


def _rows(run_dir: Path) -> list[dict]:
    p = run_dir / "metrics.jsonl"
    return [json.loads(ln) for ln in p.read_text().splitlines() if ln.strip()] if p.is_file() else []


def load_study(root: str | Path) -> list[tuple[dict, list[dict]]]:
    """(summary, metrics rows) per finished run of a study folder, or of its exported record (runs.csv +
    steps.csv, llm_probe.testbed.study.export_study: the summary's fields this module reads, the rows' logged
    statistics)."""
    import pandas as pd

    from .run import SUMMARY

    root = Path(root)
    if not (root / "runs.csv").is_file():
        return [(json.loads(p.read_text()), _rows(p.parent)) for p in sorted(root.glob(f"*/{SUMMARY}"))]
    runs, steps = pd.read_csv(root / "runs.csv"), pd.read_csv(root / "steps.csv")
    by_run = {name: g.drop(columns="run") for name, g in steps.groupby("run")}
    out = []
    for r in runs.to_dict("records"):
        s = {"setting": {k: r[k] for k in ("method", "lr", "length", "size", "control")}, "seed": int(r["seed"]),
             "outcome": r["outcome"], "heldout_acc_before": r["acc_before"], "heldout_acc_after": r["acc_after"],
             "completion_tokens_median_before": r["tokens_median_before"]}
        s["setting"]["control"] = str(s["setting"]["control"]).lower() == "true"
        g = by_run.get(r["run"])
        rows = [] if g is None else [{k: v for k, v in row.items() if not (isinstance(v, float) and math.isnan(v))}
                                     for row in g.to_dict("records")]
        out.append((s, rows))
    return out


def predictions(study, *, K: int = 20) -> list[dict]:
    """One row per finished run of ``study`` (a study folder, its exported record, or :func:`load_study`'s list):
    its setting key, lr, seed and the lr suggested from its probed steps k < K (llm_probe.suggest.lr_suggestion)."""
    from ..suggest import lr_suggestion

    out = []
    for s, all_rows in (load_study(study) if isinstance(study, (str, Path)) else study):
        rows = [r for r in all_rows if int(r.get("step", K)) < K and not r.get("skipped")]
        sug = lr_suggestion(rows)
        out.append({"key": _key(s), "lr": s["setting"]["lr"], "seed": s["seed"], "outcome": s["outcome"],
                    "suggested_lr": sug["suggested_lr"], "steps": sug["steps"]})
    return out


def _p_learned_at(per_lr, lr: float) -> float:
    """P(learned) at the tested lr nearest below ``lr`` (NaN below the grid)."""
    below = per_lr[per_lr["lr"] <= lr * (1 + 1e-9)]
    return float(below.iloc[-1]["P_learned"]) if len(below) else math.nan


def predictor_table(truth: dict, preds: list[dict]):
    """Per setting and probe lr below lr10 (the point estimate): runs, predicted / lr10 median and quartiles,
    the safe share with its Wilson interval, P(learned) at the median prediction; and the two baselines (best
    tested lr, TRL's default) as rows of the same table. A pandas DataFrame."""
    import pandas as pd

    from gapdyn.evidence.stats import wilson_interval

    rows = []
    for key, gt in truth.items():
        lr10 = gt["lr10"].lr
        if not math.isfinite(lr10):
            continue
        setting = dict(zip(SETTING_KEYS, key))
        for probe_lr in sorted({p["lr"] for p in preds if p["key"] == key and p["lr"] < lr10}):
            ps = [p for p in preds if p["key"] == key and p["lr"] == probe_lr and math.isfinite(p["suggested_lr"])]
            if not ps:
                continue
            ratio = np.array([p["suggested_lr"] / lr10 for p in ps])
            safe = int((ratio < 1).sum())
            ci = wilson_interval(safe, len(ps))
            med = float(np.median([p["suggested_lr"] for p in ps]))
            rows.append({**setting, "predictor": f"headroom at {probe_lr:g}", "runs": len(ps),
                         "steps_median": float(np.median([p["steps"] for p in ps])), "lr": med, "lr10": lr10,
                         "ratio_median": float(np.median(ratio)), "ratio_q25": float(np.quantile(ratio, 0.25)),
                         "ratio_q75": float(np.quantile(ratio, 0.75)), "safe": safe, "safe_share": safe / len(ps),
                         "safe_lo": ci.lo, "safe_hi": ci.hi, "P_learned_at": _p_learned_at(gt["per_lr"], med),
                         "P_learned_best": float(gt["per_lr"]["P_learned"].max())})
        for name, lr in (("best tested lr", gt["best_lr"]), ("TRL default", TRL_DEFAULT_LR)):
            rows.append({**setting, "predictor": name, "runs": math.nan, "steps_median": math.nan, "lr": lr,
                         "lr10": lr10, "ratio_median": lr / lr10, "ratio_q25": math.nan, "ratio_q75": math.nan,
                         "safe": math.nan, "safe_share": float(lr < lr10), "safe_lo": math.nan, "safe_hi": math.nan,
                         "P_learned_at": _p_learned_at(gt["per_lr"], lr),
                         "P_learned_best": float(gt["per_lr"]["P_learned"].max())})
    return pd.DataFrame(rows)


def length_scaling(truth: dict, *, reference: str = "long"):
    """Thm 3's (1 - J) / T scaling as a predictor of lr10 across lengths: c = lr10_ref T_ref / (1 - J_ref) fixed on
    the reference length of each (method, size, control), then predicted lr10 = c (1 - J) / T for the others,
    beside the measured lr10 and its interval. A pandas DataFrame."""
    import pandas as pd

    rows = []
    for key, gt in truth.items():
        setting = dict(zip(SETTING_KEYS, key))
        if setting["length"] != reference:
            continue
        c = gt["lr10"].lr * gt["T"] / (1 - gt["J"])
        for key2, gt2 in truth.items():
            s2 = dict(zip(SETTING_KEYS, key2))
            if any(s2[k] != setting[k] for k in SETTING_KEYS if k != "length"):
                continue
            pred = c * (1 - gt2["J"]) / gt2["T"]
            f = gt2["lr10"]
            rows.append({**s2, "T": gt2["T"], "J": gt2["J"], "lr10_predicted": pred, "lr10_measured": f.lr,
                         "lr10_lo": f.lo, "lr10_hi": f.hi, "inside": bool(f.lo <= pred <= f.hi),
                         "reference": s2["length"] == reference})
    return pd.DataFrame(rows)


def reproduction(truth: dict, reference: dict, criteria: dict = CRITERIA):
    """lr10 of each setting in ``truth`` (a :func:`ground_truth`, e.g. the held-out block's) against the same
    setting's in ``reference`` (the calibration block's): both estimates and intervals, the ratio and the verdict of
    ``criteria["reproduces"]``. A pandas DataFrame."""
    import pandas as pd

    f = criteria["reproduces"]["factor"]
    rows = []
    for key, gt in truth.items():
        if key not in reference:
            continue
        a, b = gt["lr10"], reference[key]["lr10"]
        if not all(map(math.isfinite, (a.lr, a.lo, a.hi, b.lr, b.lo, b.hi))):
            v = "not measured"
        else:
            overlap = a.lo <= b.hi and b.lo <= a.hi
            v = ("holds" if overlap and 1 / f <= a.lr / b.lr <= f else "does not hold" if not overlap
                 else "undecided")
        rows.append({**dict(zip(SETTING_KEYS, key)), "lr10": a.lr, "lr10_lo": a.lo, "lr10_hi": a.hi,
                     "lr10_reference": b.lr, "reference_lo": b.lo, "reference_hi": b.hi,
                     "ratio": a.lr / b.lr if b.lr else math.nan, "verdict": v})
    return pd.DataFrame(rows)


def decide(table, scaling=None, criteria: dict = CRITERIA) -> list[dict]:
    """The verdicts of :data:`CRITERIA` on a :func:`predictor_table` (rows of the primary probe lr) and a
    :func:`length_scaling` table: one dict per setting and criterion with ``verdict`` (holds / does not hold /
    undecided / not measured) and the numbers it rests on."""
    out = []
    prim = table[table["predictor"] == f"headroom at {criteria['probe_lr']:g}"]
    for _, r in prim.iterrows():
        setting = {k: r[k] for k in SETTING_KEYS}
        c = criteria["safe"]["share"]
        v = "holds" if r["safe_lo"] >= c else "does not hold" if r["safe_hi"] < c else "undecided"
        out.append({**setting, "criterion": "safe", "verdict": v, "runs": int(r["runs"]),
                    "value": f"{int(r['safe'])}/{int(r['runs'])} below lr10 [{r['safe_lo']:.2f}, {r['safe_hi']:.2f}]"})
        ci = criteria["informative"]
        learn_ok = math.isfinite(r["P_learned_at"]) and r["P_learned_at"] >= r["P_learned_best"] - ci["learn_margin"]
        if not math.isfinite(r["P_learned_at"]):
            v = "not measured"
        else:
            v = "holds" if r["ratio_median"] >= ci["ratio_lo"] and learn_ok else "does not hold"
        out.append({**setting, "criterion": "informative", "verdict": v, "runs": int(r["runs"]),
                    "value": f"ratio {r['ratio_median']:.2f}, P(learned) {r['P_learned_at']:.2f} vs best "
                             f"{r['P_learned_best']:.2f}"})
    if scaling is not None:
        for _, r in scaling[~scaling["reference"]].iterrows():
            measured = math.isfinite(r["lr10_measured"]) and math.isfinite(r["lr10_predicted"])
            out.append({**{k: r[k] for k in SETTING_KEYS}, "criterion": "length_scaling",
                        "verdict": ("holds" if r["inside"] else "does not hold") if measured else "not measured",
                        "runs": math.nan,
                        "value": f"predicted {r['lr10_predicted']:.2e}, measured {r['lr10_measured']:.2e} "
                                 f"[{r['lr10_lo']:.2e}, {r['lr10_hi']:.2e}]"})
    return out


def write_report(study: str | Path, out: str | Path, *, K: int = 20, seeds=None, reference_seeds=None) -> dict:
    """Write the lr number's tables for a study folder into ``out``: dose_response.csv (per setting and lr),
    critical_lrs.csv (lr10 / lr50 with intervals), predictor_table.csv, length_scaling.csv, verdicts.csv,
    lr_number.md (the main columns) and criteria.json (with its hash). ``seeds``: only runs with these seeds;
    ``reference_seeds``: also lr10 against the runs of these seeds (:func:`reproduction`, reproduction.csv; the
    two seed sets must not overlap). Returns {"runs": n, "hash": criteria hash}."""
    import pandas as pd

    from gapdyn.evidence.claims import markdown_table

    study, out = Path(study), Path(out)
    runs = [(s, rows) for s, rows in load_study(study) if seeds is None or s["seed"] in seeds]
    if not runs:
        raise ValueError(f"{study}: no finished run" + (" with the given seeds" if seeds is not None else ""))
    S = [s for s, _ in runs]
    gt = ground_truth(S)
    preds = predictions(runs, K=K)
    table, scaling = predictor_table(gt, preds), length_scaling(gt)
    decided = decide(table, scaling)
    repro = None
    if reference_seeds is not None:
        if seeds is None or set(seeds) & set(reference_seeds):
            raise ValueError("reference seeds need --seeds, and the two must not overlap")
        ref = [s for s, _ in load_study(study) if s["seed"] in reference_seeds]
        if not ref:
            raise ValueError(f"{study}: no finished run with the reference seeds")
        repro = reproduction(gt, ground_truth(ref))
        decided += [{**{k: r[k] for k in SETTING_KEYS}, "criterion": "reproduces", "verdict": r["verdict"],
                     "runs": math.nan, "value": f"lr10 {r['lr10']:.3g} [{r['lr10_lo']:.3g}, {r['lr10_hi']:.3g}] vs "
                                                f"{r['lr10_reference']:.3g} [{r['reference_lo']:.3g}, "
                                                f"{r['reference_hi']:.3g}]"} for _, r in repro.iterrows()]
    verdicts = pd.DataFrame(decided)
    out.mkdir(parents=True, exist_ok=True)
    if repro is not None:
        repro.to_csv(out / "reproduction.csv", index=False, float_format="%.6g")
    per_lr = pd.concat([g["per_lr"].assign(**dict(zip(SETTING_KEYS, k))) for k, g in gt.items()])
    per_lr.to_csv(out / "dose_response.csv", index=False, float_format="%.6g")
    crit = pd.DataFrame([{**dict(zip(SETTING_KEYS, k)), "runs": g["n"], "T": g["T"], "J": g["J"],
                          **{f"{name}_{f}": getattr(g[name], f) for name in ("lr10", "lr50")
                             for f in ("lr", "lo", "hi", "bounded_lo", "bounded_hi", "slope")},
                          "best_lr": g["best_lr"]} for k, g in gt.items()])
    crit.to_csv(out / "critical_lrs.csv", index=False, float_format="%.6g")
    table.to_csv(out / "predictor_table.csv", index=False, float_format="%.6g")
    scaling.to_csv(out / "length_scaling.csv", index=False, float_format="%.6g")
    verdicts.to_csv(out / "verdicts.csv", index=False)
    h = lr_criteria_hash()
    (out / "criteria.json").write_text(json.dumps({"hash": h, "criteria": CRITERIA, "K": K}, indent=1))

    tables = [(crit, ["method", "length", "control", "runs", "lr10_lr", "lr10_lo", "lr10_hi", "lr50_lr", "lr50_lo",
                      "lr50_hi", "best_lr"]),
              (table, ["method", "length", "predictor", "runs", "lr", "ratio_median", "ratio_q25", "ratio_q75",
                       "safe_share", "safe_lo", "P_learned_at", "P_learned_best"]),
              (scaling, ["method", "length", "control", "T", "J", "lr10_predicted", "lr10_measured", "lr10_lo",
                         "lr10_hi"])]
    if len(verdicts):
        tables.append((verdicts, ["method", "length", "criterion", "verdict", "value"]))
    text = (f"lr number of {study.name}: {len(S)} runs, criteria hash {h}, K = {K}.\n\n"
            + "\n\n".join(markdown_table(df, cols) for df, cols in tables) + "\n")
    (out / "lr_number.md").write_text(text)
    return {"runs": len(S), "hash": h, "text": text}


@dataclass
class LrValidationArgs:
    """Score the lr number on a testbed study folder: the critical lrs, the predictor table and the verdicts."""

    study: tyro.conf.Positional[str]
    """The study folder (one sub-folder per run)."""
    out_dir: Annotated[str, tyro.conf.arg(name="out")]
    """Where the tables go."""
    k: int = 20
    """Steps of each run the suggestion may read (k < K)."""
    seeds: str | None = None
    """Only runs with these seeds, as A-B (inclusive) or A,B,C."""
    reference_seeds: str | None = None
    """Also compare each setting's lr10 with the one on these seeds (the calibration block; needs --seeds)."""


def main(argv: list[str] | None = None) -> int:
    """``python -m llm_probe.testbed.lr_validation STUDY --out DIR [--k 20] [--seeds A-B [--reference-seeds C-D]]``."""
    import sys

    from gapdyn.cmdline import command, parse

    prog = "python -m llm_probe.testbed.lr_validation"

    @command(prog)
    def run(argv: list[str]) -> int:
        from .alarm_data import parse_seeds

        a = parse(LrValidationArgs, argv, prog=prog)
        if not 1 <= a.k <= 100:
            raise ValueError(f"--k must lie in [1, 100], got {a.k}")
        info = write_report(a.study, a.out_dir, K=a.k, seeds=set(parse_seeds(a.seeds)) if a.seeds else None,
                            reference_seeds=set(parse_seeds(a.reference_seeds)) if a.reference_seeds else None)
        print(info["text"])
        return 0

    return run(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    raise SystemExit(main())
