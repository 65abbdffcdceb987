"""Write the tutorial notebooks (``notebooks/*.ipynb``) from the cell lists below, without outputs.

    python notebooks/make_notebooks.py          regenerate every notebook
    python notebooks/make_notebooks.py --check  exit 1 if a committed notebook differs from its source here

Each notebook calls package functions only (gapdyn, bandits, llm_probe, paper_figs.plots), one idea
per cell, with a markdown cell saying how to read each plot. The first code cell is tagged
``parameters``: it reads ``GAPDYN_NB_MODE`` ("test" in the test suite, "quick" by default, "full")
so the same notebook runs at small sizes in ``tests/test_notebooks.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

PARAMS = """# parameters: the test suite sets GAPDYN_NB_MODE=test (small sizes); "quick" by default, "full" for paper scale
import os
MODE = os.environ.get("GAPDYN_NB_MODE", "quick")
assert MODE in ("test", "quick", "full"), MODE"""

IMPORTS = """%matplotlib inline
import numpy as np
import pandas as pd
import gapdyn
from paper_figs import plots
from paper_figs.style import new_figure, set_style
set_style()"""


def md(text: str):
    return new_markdown_cell(text.strip("\n"))


def code(text: str, *, tags: tuple[str, ...] = ()):
    cell = new_code_cell(text.strip("\n"))
    if tags:
        cell.metadata["tags"] = list(tags)
    return cell


# --------------------------------------------------------------------------------------------------
NB01 = [
    md("""
# 01 · Gradient-gap basics

The Gradient Gap g+ − g− (Suk & Duan) is the difference between the mean score of correct and of
incorrect responses. This notebook builds a 100-arm log-linear bandit and checks, with gapdyn's
functions, the identities the rest of the toolkit relies on (THEORY.md §1-2):
the Gap is exactly ∇Φ, every method's expected step points along it, and sampled steps are noisy
around that direction.
"""),
    code(PARAMS + """
N_GROUPS = {"test": 300, "quick": 3000, "full": 30000}[MODE]""", tags=("parameters",)),
    code(IMPORTS),
    md("""
## A log-linear bandit
K = 100 arms with d = 16 Gaussian features, 10 correct arms, a small random θ. π(a) ∝ exp(θ·φ(a)),
scores s(a) = φ(a) − E_π[φ]. `INSTANCE = 2` is an instance whose one-step threshold is finite (last
section); many instances (e.g. 0) have none: Φ keeps rising along the Gap for every step size.
"""),
    code("""
INSTANCE = 2
rng = np.random.default_rng(INSTANCE)
K, d = 100, 16
features = rng.standard_normal((K, d))
rewards = np.zeros(K); rewards[:10] = 1.0
theta = 0.3 * rng.standard_normal(d)
probs = gapdyn.loglinear_probs(features, theta)
scores = gapdyn.loglinear_scores(features, theta)
J, Phi = gapdyn.success_rate(probs, rewards), gapdyn.log_odds(probs, rewards)
gap = gapdyn.gradient_gap(probs, rewards, scores)
print(f"J = {J:.4f}, Phi = {Phi:.4f}, ||g+ - g-|| = {np.linalg.norm(gap):.4f}")"""),
    md("""
## The Gap is the gradient of the log-odds
Central finite differences of Φ (gapdyn.loglinear_logodds_fn) against g+ − g−: the printed relative
error should be at the level of the finite-difference error (~1e-9), not of a modelling error.
"""),
    code("""
phi_fn = gapdyn.loglinear_logodds_fn(features, rewards)
h = 1e-5
fd = np.array([(phi_fn(theta + h * e) - phi_fn(theta - h * e)) / (2 * h) for e in np.eye(d)])
print("relative error |fd - gap| / |gap| =", np.linalg.norm(fd - gap) / np.linalg.norm(gap))"""),
    md("""
## How far each method's expected step goes along the Gap
E[w] = c(J, G)·(g+ − g−) for every method; the plot shows c against J for G = 8. Read it as the
"effective step" multiplier: GRPO's std normalisation (c_G ≈ √(J(1−J))) makes its step largest at
extreme J; WAPO's extra factor (1 − J) shuts the step off as a prompt gets solved.
"""),
    code("""
fig, ax = new_figure()
plots.plot_expected_scalars(ax[0, 0], group_size=8);"""),
    md("""
## Sampled steps are noisy: the gap alignment Δμ = ⟨w, g+ − g−⟩
N groups of G = 8 sampled responses, GRPO advantages. The histogram is the per-group Δμ; the solid
line is its Monte-Carlo mean and the dashed line the closed form c_G(J)·‖gap‖². They should agree;
the mass below 0 is the share of steps that move Φ the wrong way to first order.
"""),
    code("""
dmus = np.array([
    gapdyn.gap_alignment(gapdyn.sampled_direction("grpo", probs, rewards, scores, group_size=8, rng=rng), gap)
    for _ in range(N_GROUPS)
])
expected = gapdyn.gap_alignment(gapdyn.expected_direction("grpo", probs, rewards, scores, group_size=8), gap)
print(f"share of groups with dmu < 0: {np.mean(dmus < 0):.3f};  all-equal groups give dmu = 0: {np.mean(dmus == 0):.3f}")
fig, ax = new_figure(width=5)
plots.plot_dmu_samples(dmus, expected, ax[0, 0], method="grpo");"""),
    md("""
## One step along the Gap: where Φ stops rising
Φ(θ + η w) − Φ(θ) for the unit Gap direction w. It rises for small η (slope ‖gap‖) and eventually
falls below its start: the crossing is the sharp step threshold (gapdyn.sharp_step_threshold), the
one-step version of the collapse threshold studied in notebook 02.
"""),
    code("""
w = gap / np.linalg.norm(gap)
eta_sharp = gapdyn.sharp_step_threshold(phi_fn, theta, w)
print(f"sharp one-step threshold along the Gap: eta = {eta_sharp:.4g}")
fig, ax = new_figure(width=5)
plots.plot_logodds_along_direction(ax[0, 0], phi_fn, theta, w, etas=np.geomspace(1e-2, 1e4, 200), threshold=eta_sharp);"""),
]


# --------------------------------------------------------------------------------------------------
NB03 = [
    md("""
# 03 · The WAPO token taxonomy

One token update on logits z with step a = η·A (THEORY.md §4, gapdyn.token_step_effects):
Δlog p_s = a(1 − 2p_s + C) and ΔH = −a[p_s(log p_s + H) − Σ p_k²(log p_k + H)], with C = Σ p_k².
WAPO sorts tokens into **peak** (p_s ≥ C) and **valley** (p_s < C), crossed with the sign of A.
This notebook checks how often that bin predicts the sign of ΔH, and where it fails.
"""),
    code(PARAMS + """
N_TOKENS = {"test": 3000, "quick": 40000, "full": 200000}[MODE]""", tags=("parameters",)),
    code(IMPORTS + """
from paper_figs import data"""),
    md("""
## Random positions, first-order effects
Logits z = σ·N(0, I) with log σ uniform (flat to peaked), V = 32, the token sampled from p as in
training, A = ±1 and η = 1. One row per (position, sign of A).
"""),
    code("""
table = data.taxonomy_table(N_TOKENS, vocab=32, seed=0)
table.head()"""),
    md("""
## ΔH over (p_s, C)
Left: A > 0, right: A < 0. Colour = mean ΔH per unit step in each (p_s, C) cell; the dashed line is
p_s = C. Read: for A > 0 peak tokens (below the line) lower the entropy (sharpening) and valley tokens
raise it; a negative advantage flips both.
"""),
    code("""
fig, ax = new_figure(1, 2, width=4.6)
for a, sign in zip(ax[0], (+1, -1)):
    fig.colorbar(plots.plot_taxonomy_effect(table, a, value="dH", sign=sign), ax=a)"""),
    md("""
## Δp_s over (p_s, C)
The sampled token's probability always moves with the sign of A; the step is largest for mid-range
p_s, and tiny at p_s → 1 (the softmax saturates).
"""),
    code("""
fig, ax = new_figure(1, 2, width=4.6)
for a, sign in zip(ax[0], (+1, -1)):
    fig.colorbar(plots.plot_taxonomy_effect(table, a, value="dp_s", sign=sign), ax=a)"""),
    md("""
## Where the bin mispredicts the sign of ΔH
Left: share of mispredicted tokens per cell (dark = always wrong). Right: histogram of the margin
p_s − C, all tokens in grey, mispredicted in orange. Read: misses live on a thin band just above
p_s = C (peak side); valley tokens never disagree.
"""),
    code("""
summary = data.taxonomy_summary(table)
print(summary)
fig, ax = new_figure(1, 2, width=4.6)
fig.colorbar(plots.plot_taxonomy_misses(table, ax[0, 0]), ax=ax[0, 0])
plots.plot_miss_share_vs_margin(table, ax[0, 1]);"""),
    md("""
## First order vs a finite step
The formulas are first order in a = η·A. For a finite step of η = 0.5 the exact change
(gapdyn.exact_token_step) should lie close to the diagonal; curvature bends the largest changes.
"""),
    code("""
rng = np.random.default_rng(1)
z = 2.0 * rng.standard_normal((min(N_TOKENS, 3000), 32))
tok = gapdyn.sample_group(gapdyn.softmax(z), 2, rng)[:, 0]
first = gapdyn.token_step_effects(z, tok, 1.0, 0.5).dH
exact = gapdyn.exact_token_step(z, tok, 1.0, 0.5).dH
print("sign agreement first order vs exact:", np.mean(np.sign(first) == np.sign(exact)))
fig, ax = new_figure()
plots.plot_first_order_vs_exact(first, exact, ax[0, 0]);"""),
]


# --------------------------------------------------------------------------------------------------
NB02 = [
    md("""
# 02 · Step-size thresholds and collapse

Suk & Duan's Theorem 2: above a threshold set by the Gap's magnitude, even a well-aligned step
makes J fall, down to 0. This notebook runs the bandit engine (`bandits.run_grid`, exact and sampled
GRPO on a 100-arm log-linear bandit) over a grid of step sizes and compares where collapse starts with
gapdyn's computable thresholds (THEORY.md §3). Instance 2 is one of the minority of instances that has
a finite threshold (SIMULATIONS.md: most converge for every η).
"""),
    code(PARAMS + """
STEPS = {"test": 80, "quick": 300, "full": 1000}[MODE]
N_ETAS = {"test": 13, "quick": 41, "full": 81}[MODE]
N_SEEDS = {"test": 4, "quick": 16, "full": 64}[MODE]""", tags=("parameters",)),
    code(IMPORTS + """
from bandits import Dynamics, make_bandit, run_grid
from paper_figs import data
from paper_figs.style import label"""),
    md("""
## J over steps at a few fixed η (exact GRPO: the expected update, no sampling noise)
Read: small η rise slowly, mid-range η converge fast; past the threshold J drops within the first
steps and stays at 0 (collapse is absorbing).
"""),
    code("""
bandit = make_bandit(seed=2)
exact = Dynamics(method="grpo", mode="exact", steps=STEPS)
traj, E, S = run_grid(bandit, exact, etas=[1.0, 10.0, 100.0, 300.0, 3000.0], seeds=[0])
curves = data.trajectory_frame(traj, E, S)
fig, ax = new_figure(width=5)
plots.plot_trajectories(curves, ax[0, 0], x="step", y="J", hue="eta", band=False)
ax[0, 0].set_xscale("symlog", linthresh=1); ax[0, 0].set_xlabel(label("step")); ax[0, 0].set_ylabel(label("J"))
ax[0, 0].legend(frameon=False);"""),
    md("""
## Final J against η: exact vs sampled groups (G = 8)
Exact GRPO (one run per η) jumps from J ≈ 1 to J = 0 at a sharp η*; sampled GRPO (N_SEEDS runs per
η) has a soft transition: the curve is the mean final J, so 1 − mean = share of collapsed runs.
The dashed line is the sharp one-step threshold at θ0 along the expected direction
(gapdyn.sharp_step_threshold): a one-step predictor, which SIMULATIONS.md found off by 5-40x.
"""),
    code("""
etas = np.geomspace(0.1, 1e4, N_ETAS)
tr_exact, E1, S1 = run_grid(bandit, exact, etas=etas, seeds=[0])
sampled = Dynamics(method="grpo", mode="sampled", steps=STEPS)
tr_samp, E2, S2 = run_grid(bandit, sampled, etas=etas, seeds=np.arange(N_SEEDS))
final = pd.concat([data.final_frame(tr_exact, E1, S1).assign(method="exact GRPO"),
                   data.final_frame(tr_samp, E2, S2).assign(method="sampled GRPO")])
theta0 = bandit.zeros()[0]
probs = gapdyn.loglinear_probs(bandit.features[0], theta0)
scores = gapdyn.loglinear_scores(bandit.features[0], theta0)
w0 = gapdyn.expected_direction("grpo", probs, bandit.rewards[0], scores, group_size=8)
eta_sharp = gapdyn.sharp_step_threshold(gapdyn.loglinear_logodds_fn(bandit.features[0], bandit.rewards[0]), theta0, w0)
fig, ax = new_figure(width=5)
plots.plot_method_curves(final, ax[0, 0], x="eta", y="J_final", method="method",
                         colors={"exact GRPO": "#D55E00", "sampled GRPO": "#0072B2"})
ax[0, 0].axvline(eta_sharp, color="black", ls="--", label="one-step sharp threshold")
ax[0, 0].set_xlabel(label("eta")); ax[0, 0].set_ylabel("final " + label("J")); ax[0, 0].legend(frameon=False);"""),
    md("""
## How far apart are the predictors?
The measured critical η* (first grid η where exact GRPO ends below J = 0.01), the one-step sharp
threshold, and Theorem 1's worst-case step condition (gapdyn.theorem1_step_bound with the log-linear
constants). Read the ratios: SIMULATIONS.md found the Theorem-1 bound 3-5 orders of magnitude too small.
"""),
    code("""
fe = final[final["method"] == "exact GRPO"].sort_values("eta")
collapsed = fe[fe["J_final"] < 0.01]
eta_star = float(collapsed["eta"].iloc[0]) if len(collapsed) else float("inf")
gap0 = gapdyn.gradient_gap(probs, bandit.rewards[0], scores)
w_unit = w0 / np.linalg.norm(w0)
G_o, L_o = gapdyn.loglinear_bound_constants(bandit.features[0])
thm1 = float(gapdyn.theorem1_step_bound(gapdyn.gap_alignment(w_unit, gap0), L_o=L_o, G_o=G_o)) / np.linalg.norm(w0)
print(f"measured eta* (grid) = {eta_star:.4g}")
print(f"one-step sharp threshold = {eta_sharp:.4g}  (ratio {eta_sharp / eta_star:.3g})")
print(f"Theorem-1 step bound     = {thm1:.3g}  (ratio {thm1 / eta_star:.3g})")"""),
    md("""
## Accuracy against cumulative alignment M (Theorem 1's logistic bound)
Every recorded (step, run) of the converging exact runs: J against M = Σ η [Δμ]₊. The orange curve
is the least-squares fit σ(aM + b) (gapdyn.fit_logistic_accuracy); the dashed curve Theorem 1's
lower bound σ(logit J0 + M/2). Points below the dashed curve would violate the bound.
"""),
    code("""
ok = data.trajectory_frame(tr_exact, E1, S1)
ok = ok[ok["eta"] < 0.5 * eta_star]
J0 = float(ok["J"].iloc[0])
fig, ax = new_figure(width=5)
fit = plots.plot_logistic_fit(ok, ax[0, 0], M="M", acc="J", J0=J0)
print(f"fit: slope a = {fit.slope:.3f} (theory: >= 1/2 as a bound), intercept b = {fit.intercept:.3f}, "
      f"logit J0 = {np.log(J0 / (1 - J0)):.3f}")"""),
]

# --------------------------------------------------------------------------------------------------
NB04 = [
    md("""
# 04 · Probing a tiny Qwen run

An online RLVR run of a ~124k-parameter Qwen2 on 2-digit addition (llm_probe): G completions per
prompt, binary exact-match reward, GRPO vs WAPO at a normal and a large Adam learning rate. At every
probe step the trainer measures per-prompt Gradient Gaps, the alignment Δμ_q of the update with each,
the cumulative alignment M_q of fixed probe prompts, the entropy by advantage sign, the WAPO token bins,
and applies a documented collapse rule. `llm_probe.demo.run_demo` runs the grid; this notebook reads its
output folder (paper_figs.data.read_llm_results) and plots it.
"""),
    code(PARAMS + """
import tempfile
OUT = os.environ.get("GAPDYN_NB_LLM_DIR") or tempfile.mkdtemp(prefix="gapdyn_nb04_")""", tags=("parameters",)),
    code(IMPORTS + """
from llm_probe.demo import run_demo
from paper_figs import data
from paper_figs.style import label"""),
    md("""
## Run the demo grid
Sizes follow MODE (paper_figs.data.llm_demo_config): in "test" a 30-step warm-up and 8 RL steps (the
model barely answers: the curves are flat), in "quick" 2 seeds x 60 steps after a 400-step warm-up.
"""),
    code("""
cfg = data.llm_demo_config(MODE, OUT)
runs = run_demo(cfg)
res = data.read_llm_results(OUT)
runs[["method", "lr", "seed", "reward_first25", "reward_last25", "entropy_last25", "collapsed", "collapse_rule"]]"""),
    md("""
## Reward per step
Colour = method, line style = learning rate (mean over seeds, 5-step rolling mean). Read: at the normal
lr both learn slowly; at the large lr the reward drops to 0 within a few steps and stays there
(collapse is absorbing with binary rewards: all-zero groups give no gradient).
"""),
    code("""
fig, ax = new_figure(width=5)
plots.plot_run_curves(res.metrics, ax[0, 0], y="reward")
ax[0, 0].set_ylabel(label("reward"));"""),
    md("""
## Entropy of completions by advantage sign
Solid: tokens of completions with A > 0, dashed: A < 0, at the largest lr. Read with the taxonomy of
notebook 03: positive updates on peak tokens sharpen (entropy falls), negative updates on peak tokens
spread mass (entropy rises).
"""),
    code("""
fig, ax = new_figure(width=5)
plots.plot_entropy_by_sign(res.metrics, ax[0, 0], lr=float(res.metrics["lr"].max()));"""),
    md("""
## Per-prompt accuracy against cumulative alignment M_q
One point per probe prompt and probe step (colour: lr); the logistic fit uses the normal-lr runs and
the dashed line is Theorem 1's bound at their median initial accuracy. Read: whether M_q orders the
prompts' progress, and whether the bound holds for Adam steps (it is not guaranteed: Adam's steps do
not satisfy the theorem's step condition).
"""),
    code("""
fig, ax = new_figure(width=5)
plots.plot_prompt_alignment(res.probes, ax[0, 0]);"""),
    md("""
## WAPO token bins and collapse alerts
Left: share of completion tokens in each bin (colour) per method (line style). Right: each run's steps
(bar) and the alerts of llm_probe's collapse rule (markers).
"""),
    code("""
fig, ax = new_figure(1, 2, width=5)
plots.plot_bin_shares(res.metrics, ax[0, 0])
plots.plot_alerts(res.runs, res.alerts, ax[0, 1]);"""),
]

NOTEBOOKS: dict[str, list] = {
    "01_gradient_gap_basics.ipynb": NB01,
    "02_thresholds_and_collapse.ipynb": NB02,
    "03_token_taxonomy.ipynb": NB03,
    "04_probing_a_tiny_qwen_run.ipynb": NB04,
}


def build(cells) -> nbformat.NotebookNode:
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    for i, cell in enumerate(nb.cells):  # stable ids so regeneration gives identical files
        cell["id"] = f"c{i:02d}"
    return nb


def render(name: str) -> str:
    return nbformat.writes(build(NOTEBOOKS[name])) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    check = "--check" in argv
    bad = []
    for name in NOTEBOOKS:
        text, path = render(name), HERE / name
        if check:
            if not path.exists() or path.read_text() != text:
                bad.append(name)
        else:
            path.write_text(text)
            print(f"wrote {path}")
    if bad:
        print(f"out of date (run python notebooks/make_notebooks.py): {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
