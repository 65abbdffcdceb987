# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 02 · Step-size thresholds and collapse
#
# Suk & Duan (arXiv 2510.08539), Theorem 2: above a threshold set by the Gap's magnitude, even a
# well-aligned step makes J fall, down to 0. This notebook runs the bandit engine (`bandits.run_grid`,
# exact and sampled GRPO on a 100-arm log-linear bandit) over a grid of step sizes and compares where
# collapse starts with gapdyn's computable thresholds ([docs/theory.md](../theory.md), "Computable
# step-size thresholds"). Instance 2 is one of the minority of instances with a finite threshold: most
# instances converge for every η.

# %% tags=["parameters"]
# parameters: the test suite sets GAPDYN_NB_MODE=test (small sizes); "quick" by default, "full" for paper scale
import os

from gapdyn.cmdline import MODES

MODE = os.environ.get("GAPDYN_NB_MODE", "quick")
assert MODE in MODES, MODE
STEPS = {"test": 80, "quick": 300, "full": 1000}[MODE]
N_ETAS = {"test": 13, "quick": 41, "full": 81}[MODE]
N_SEEDS = {"test": 4, "quick": 16, "full": 64}[MODE]

# %%
# %matplotlib inline
import numpy as np
import pandas as pd

import bandits
import gapdyn
from bandits.experiments.mechanisms import search_eta_star
from paper_figs import data, plots
from paper_figs.style import label, new_figure, set_style

set_style()

# %% [markdown]
# ## J over steps at a few fixed η (exact GRPO: the expected update, no sampling noise)
# Read: small η rise slowly, mid-range η converge fast; past the threshold J drops within the first
# steps and stays at 0 (collapse is absorbing).

# %%
bandit = bandits.make_bandit(seed=2)
exact = bandits.Dynamics(method="grpo", gradient="exact", steps=STEPS)
curves = data.trajectory_frame(*bandits.run_grid(bandit, exact, etas=[1.0, 10.0, 100.0, 300.0, 3000.0], seeds=[0]))

# %%
fig, ax = new_figure(width=5)
plots.plot_trajectories(curves, ax[0, 0], x="step", y="J", hue="eta", band=False)
ax[0, 0].set_xscale("symlog", linthresh=1)
ax[0, 0].set(xlabel=label("step"), ylabel=label("J"))
ax[0, 0].legend(frameon=False);

# %% [markdown]
# ## Final J against η: exact vs sampled groups (G = 8)
# Exact GRPO (one run per η) jumps from J ≈ 1 to J = 0 at a sharp η*; sampled GRPO (N_SEEDS runs per
# η) has a soft transition: the curve is the mean final J, so 1 − mean = share of collapsed runs.

# %%
etas = np.geomspace(0.1, 1e4, N_ETAS)
sampled = bandits.Dynamics(method="grpo", gradient="sampled", steps=STEPS)
exact_grid = bandits.run_grid(bandit, exact, etas=etas, seeds=[0])
sampled_grid = bandits.run_grid(bandit, sampled, etas=etas, seeds=np.arange(N_SEEDS))

# %%
final = pd.concat([data.final_frame(*exact_grid).assign(method="exact GRPO"),
                   data.final_frame(*sampled_grid).assign(method="sampled GRPO")])

# %% [markdown]
# The one-step predictor: the sharp threshold at θ0 along GRPO's expected direction
# (`gapdyn.sharp_step_threshold`), drawn as the dashed line.

# %%
theta0 = bandit.zeros()[0]
features, rewards = bandit.features[0], bandit.rewards[0]
probs, scores = gapdyn.loglinear_probs(features, theta0), gapdyn.loglinear_scores(features, theta0)
w0 = gapdyn.expected_direction("grpo", probs, rewards, scores, group_size=8)
eta_sharp = gapdyn.sharp_step_threshold(gapdyn.loglinear_logodds_fn(features, rewards), theta0, w0)

# %%
fig, ax = new_figure(width=5)
plots.plot_method_curves(final, ax[0, 0], x="eta", y="J_final", method="method",
                         colors={"exact GRPO": "#D55E00", "sampled GRPO": "#0072B2"})
ax[0, 0].axvline(eta_sharp, color="black", ls="--", label="one-step sharp threshold")
ax[0, 0].set(xlabel=label("eta"), ylabel="final " + label("J"))
ax[0, 0].legend(frameon=False);

# %% [markdown]
# ## How far apart are the predictors?
# The measured critical η* of exact GRPO (`gapdyn.find_eta_star`, the project's one estimator: a scan
# with neighbouring η 1 % apart over the whole range, then bisection to 0.1 % on the first η whose run
# ends collapsed, J < `gapdyn.COLLAPSE_J` over the last quarter of the horizon; docs/evidence.md), the one-step sharp threshold, and
# Theorem 1's worst-case step condition (`gapdyn.theorem1_step_bound` with the log-linear constants of
# `gapdyn.loglinear_bound_constants`). Read the ratios: the worst-case bound is orders of magnitude
# smaller than the measured step.

# %%
# eta* estimate: gapdyn.find_eta_star fed by the engine (bandits.experiments.mechanisms.search_eta_star)
found, _, _ = search_eta_star(bandit, exact, theta0=None, eta_lo=0.1, eta_hi=1e4, max_ratio=1.01, rtol=1e-3)
eta_star = found.eta_star
found.status, found.n_islands, found.bracket

# %%
# Theorem 1's step bound for the unit direction, rescaled to a step on w0 (theta <- theta + eta * w0)
G_o, L_o = gapdyn.loglinear_bound_constants(features)
gap0 = gapdyn.gradient_gap(probs, rewards, scores)
w_unit = w0 / np.linalg.norm(w0)
thm1 = float(gapdyn.theorem1_step_bound(gapdyn.gap_alignment(w_unit, gap0), L_o=L_o, G_o=G_o)) / np.linalg.norm(w0)

# %%
pd.DataFrame({"step size": [eta_star, eta_sharp, thm1]},
             index=["measured eta* (find_eta_star)", "one-step sharp threshold", "Theorem 1 step bound"]).assign(
    ratio_to_eta_star=lambda t: t["step size"] / eta_star)

# %% [markdown]
# ## Accuracy against cumulative alignment M (Theorem 1's logistic bound)
# Every recorded (step, run) of the exact grid runs with η < η*/2: J against M = Σ η [Δμ]₊. The orange
# curve is the least-squares fit σ(aM + b) (`gapdyn.fit_logistic_accuracy`, called by the plot); the
# dashed curve is Theorem 1's lower bound σ(logit J0 + M/2). Points below the dashed curve would
# violate the bound.

# %%
runs = data.trajectory_frame(*exact_grid).query("eta < 0.5 * @eta_star")

# %%
fig, ax = new_figure(width=5)
fit = plots.plot_logistic_fit(runs, ax[0, 0], M="M", acc="J", J0=float(runs["J"].iloc[0]))
fit
