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
# # 04 · Probing a tiny Qwen run
#
# An online RLVR run of a ~124k-parameter Qwen2 on 2-digit addition (`llm_probe`): G completions per
# prompt, binary exact-match reward, GRPO vs WAPO at a normal and a large Adam learning rate. At every
# probe step the trainer measures per-prompt Gradient Gaps, the alignment Δμ_q of the update with each,
# the cumulative alignment M_q of fixed probe prompts, the entropy by advantage sign, the WAPO token
# bins, and applies the toolkit's documented collapse rule. `llm_probe.experiments.demo.run_demo` runs the grid into
# a temporary folder; this notebook reads it back (`paper_figs.data.read_llm_results`) and plots it.

# %% tags=["parameters"]
# parameters: the test suite sets GAPDYN_NB_MODE=test (small sizes); "quick" by default, "full" for paper scale
import os
import tempfile

from gapdyn.cmdline import MODES

MODE = os.environ.get("GAPDYN_NB_MODE", "quick")
assert MODE in MODES, MODE
OUT = os.environ.get("GAPDYN_NB_LLM_DIR") or tempfile.mkdtemp(prefix="gapdyn_nb04_")

# %%
# %matplotlib inline
from llm_probe.experiments.demo import run_demo
from paper_figs import data, plots
from paper_figs.style import label, new_figure, set_style

set_style()

# %% [markdown]
# ## Run the demo grid
# Sizes follow MODE (`paper_figs.data.llm_demo_config`): in "test" a 30-step warm-up and 8 RL steps
# (the model barely answers: the curves are flat), in "quick" 2 seeds x 60 steps after the warm-up.

# %%
runs = run_demo(data.llm_demo_config(MODE, OUT))
runs[["method", "lr", "seed", "reward_first25", "reward_last25", "entropy_last25", "alerted", "alert_rule"]]

# %%
res = data.read_llm_results(OUT)

# %% [markdown]
# ## Reward per step
# Colour = method, line style = learning rate (mean over seeds, 5-step rolling mean). Read: at the
# normal lr both learn slowly; at the large lr the reward drops to 0 within a few steps and stays there
# (collapse is absorbing with binary rewards: all-zero groups give no gradient).

# %%
fig, ax = new_figure(width=5)
plots.plot_run_curves(res.metrics, ax[0, 0], y="reward")
ax[0, 0].set_ylabel(label("reward"));

# %% [markdown]
# ## Entropy of completions by advantage sign
# Solid: tokens of completions with A > 0, dashed: A < 0, at the largest lr. Read with the taxonomy of
# notebook 03: positive updates on peak tokens sharpen (entropy falls), negative updates on peak tokens
# spread mass (entropy rises).

# %%
fig, ax = new_figure(width=5)
plots.plot_entropy_by_sign(res.metrics, ax[0, 0], lr=float(res.metrics["lr"].max()));

# %% [markdown]
# ## Per-prompt accuracy against cumulative alignment M_q
# One point per probe prompt and probe step (colour: lr); the logistic fit uses the normal-lr runs and
# the dashed line is Theorem 1's bound at their median initial accuracy. Read: whether M_q orders the
# prompts' progress, and whether the bound holds for Adam steps (it is not guaranteed: Adam's steps do
# not satisfy the theorem's step condition).

# %%
fig, ax = new_figure(width=5)
plots.plot_prompt_alignment(res.probes, ax[0, 0]);

# %% [markdown]
# ## WAPO token bins and collapse alerts
# Left: share of completion tokens in each bin (colour) per method (line style). Right: each run's
# steps (bar) and the alerts of `llm_probe`'s collapse rule (markers).

# %%
fig, ax = new_figure(1, 2, width=5, layout="constrained")
plots.plot_bin_shares(res.metrics, ax[0, 0])
plots.plot_alerts(res.runs, res.alerts, ax[0, 1]);
