"""Cui et al.'s entropy dynamics, tested per visited state on the tiny Qwen (SGD at 5 lrs, Adam at 4e-4).

    gapdyn train entropy-lemma --mode full --out docs/verdicts/llm-entropy-lemma

The statements (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models",
arXiv 2505.22617, §3; numbering of its v1), for one state s, pi = softmax(z), H(s) = -sum_a pi(a) log pi(a):

- Lemma 1 (entropy difference of a softmax policy; optimizer-free): a logit change dz gives, to first order,
  dH(s) = H(softmax(z + dz)) - H(softmax(z)) ~ -Cov_{a~pi(.|s)}(log pi(a|s), dz(a)).
  Exact derivative: dH/dz_a = -pi(a) (log pi(a) + H), so the first-order term is that covariance.
- Theorem 1 (tabular softmax, vanilla policy gradient dz(s, a) = eta pi(a|s) A(s, a)):
  dH(s) ~ -eta Cov_{a~pi}(log pi(a|s), pi(a|s) A(s, a)).
- Theorem 2 (tabular softmax, natural policy gradient dz(s, a) = eta A(s, a)):
  dH(s) ~ -eta Cov_{a~pi}(log pi(a|s), A(s, a)).

What is measured here (one process, from the pinned warm model llm_probe.experiments.pinned.pinned_warm('tiny');
the training trajectory is llm_probe.trainer.Trainer's, GRPO). At every ``every``-th step the batch's visited states
(prompt + completion prefix, every position whose next token was sampled; identical prefixes of one prompt are one
state, :func:`visited_states`) are scored in float64 on a copy of the weights before and after the step (eval mode,
llm_probe.model.completion_logits), so dz is the realised logit change of the real update, and per state:

- ``exact``: H(pi_after) - H(pi_before) (:func:`entropy`);
- ``lemma``: -Cov_{pi}(log pi, dz) over the whole vocabulary (:func:`vocab_cov`);
- ``pg``: Theorem 1's form with the tabular logit change of plain SGD on the trainer's own loss and batch,
  dz_tab(s, .) = -eta sum_{visits i of s} g_i (e_{a_i} - pi(.|s)), g_i = dL/dlog pi(a_i|s) (the per-token GRPO
  weight times -A_i: visit weights and the loss's normalisation included); its expectation over the sampled token is
  eta n_s w pi(a) (A(s, a) - E_pi A), Theorem 1's pi A with the advantage centred under pi;
- ``npg``: Theorem 2's form with dz = eta A_hat(s, .), A_hat(s, a) = (1/n_s) sum_i A_i 1[a_i = a] / pi(a|s), the
  importance-weighted Monte Carlo estimate of A(s, .) from the n_s visits (natural gradient of one sampled tabular
  term: F^+ (e_a - pi) = e_a / pi(a) + const, F = diag(pi) - pi pi^T), so -eta Cov = -(eta/n_s) sum_i A_i
  (log pi(a_i) + H(s)). A_i is the GRPO advantage of the visit's completion (the group's advantages).

Where this departs from the paper: the policy is a shared-parameter network, so the realised dz of an SGD step is
-eta J J^T grad_z L (the logit-space kernel), not the tabular -eta grad_z L; Theorems 1-2 then fix the sign of the
prediction only through that kernel's alignment, and their scale (eta) is not the network's. Adam's update is
neither plain nor natural PG; its first step is sign-like (every parameter moves by about lr), reported apart.

Claims (:data:`SPECS`, frozen at import with :data:`CRITERIA_HASH`; no primaries, no Holm): per run, the OLS slope
of ``exact`` on each prediction over the run's states, a CR1 cluster t interval with the step as cluster
(gapdyn.evidence.stats.t_interval_cluster_slope; Adam's step 0: the prompt as cluster); Spearman's rho and the sign
agreement are reported beside it. The lemma is a law with the band [0.8, 1.2] on its 90 % interval, written before
any run: the remainder of the first-order term is second order in dz, O(max_a |dz(a) - E_pi dz|^2), so a slope
within 20 % of 1 is what "the first-order term dominates" means at logit changes of a few hundredths; the band is
applied at every lr, where the larger lrs test where it stops holding. The PG forms are laws with a sign
criterion (slope interval above 0), since their scale is not the network's.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from gapdyn.evidence.claims import Claim, ClaimSpec, Criterion, claims_markdown, claims_to_json, criteria_hash, keyed_specs
from gapdyn.evidence.stats import Estimate, t_interval_cluster_slope

from ._study import RESULT, AdditionBatch, SplitAddition, run_name
from ._study import run_study as run_folders

__all__ = ["entropy", "vocab_cov", "lemma_dH", "States", "visited_states", "pg_logit_change", "npg_logit_change",
           "state_rows", "StudyConfig", "CONFIGS", "SPECS", "CRITERIA", "TEST_TEXT", "CRITERIA_HASH", "cells", "cell_name",
           "run_cell", "run_study",
           "claims_from_states", "write_results"]

SRC = "Cui et al. 2025 (arXiv 2505.22617)"
SPECS = {
    "llm.entropy_lemma": ClaimSpec(
        f"{SRC}, Lemma 1", "Per visited state, the entropy change of one step equals -Cov_{a~pi}(log pi, dz) to "
        "first order (dz: the realised logit change)", "derived", Criterion.equivalence(0.8, 1.2)),
    "llm.entropy_pg_form_sgd": ClaimSpec(
        f"{SRC}, Theorem 1 (tabular softmax, plain PG), on a network under SGD",
        "Per visited state, the entropy change of an SGD step follows -eta Cov(log pi, pi A) in sign", "law",
        Criterion.above(0.0)),
    "llm.entropy_npg_form_sgd": ClaimSpec(
        f"{SRC}, Theorem 2 (tabular softmax, natural PG), on a network under SGD",
        "Per visited state, the entropy change of an SGD step follows -eta Cov(log pi, A) in sign", "law",
        Criterion.above(0.0)),
    "llm.entropy_lemma_adam": ClaimSpec(
        f"{SRC}, Lemma 1, under Adam (exploratory)",
        "Per visited state, the entropy change of an Adam step equals -Cov(log pi, dz) to first order", "derived",
        Criterion.equivalence(0.8, 1.2)),
    "llm.entropy_pg_form_adam": ClaimSpec(
        f"{SRC}, Theorem 1 transferred to Adam (exploratory: beyond the paper's setting)",
        "Per visited state, the entropy change of an Adam step follows -eta Cov(log pi, pi A) in sign", "law",
        Criterion.above(0.0)),
    "llm.entropy_npg_form_adam": ClaimSpec(
        f"{SRC}, Theorem 2 transferred to Adam (exploratory: beyond the paper's setting)",
        "Per visited state, the entropy change of an Adam step follows -eta Cov(log pi, A) in sign", "law",
        Criterion.above(0.0)),
}
SPECS = keyed_specs(SPECS, {  # (statement key, role) per claim: the Adam rows leave the papers' setting
    "llm.entropy_lemma": (("Cui et al.", "Lemma 1"), "test"),
    "llm.entropy_lemma_adam": (("Cui et al.", "Lemma 1"), "exploratory"),
    **{f"llm.entropy_{f}_form_{o}": (("Cui et al.", "Theorems 1-2"), "test" if o == "sgd" else "exploratory")
       for f in ("pg", "npg") for o in ("sgd", "adam")}})
"""claim id -> ClaimSpec, frozen at import before any run (ids get ``@<run>`` suffixes: one row per run and, for
Adam, per step block ``step0`` / ``later``). The lemma rows are of form "derived": Lemma 1 is a first-order Taylor
identity of the softmax entropy, so its rows say whether a step is small enough for the first order to describe it
(a check of the regime and of the measurement), shown and never counted as evidence about the dynamics; the PG
forms are the statements about training dynamics."""
TEST_TEXT = {
    "llm.entropy_lemma": "OLS slope of the exact dH(s) on -Cov_pi(log pi, dz) over the run's visited states, "
                         "CR1 t interval, step clusters",
    "llm.entropy_pg_form_sgd": "OLS slope of the exact dH(s) on -Cov_pi(log pi, dz_tab), dz_tab the tabular plain-SGD "
                               "logit change of the same loss and batch, CR1 t interval, step clusters",
    "llm.entropy_npg_form_sgd": "OLS slope of the exact dH(s) on -eta Cov_pi(log pi, A_hat), A_hat the "
                                "importance-weighted advantage estimate of the visits, CR1 t interval, step clusters",
}
TEST_TEXT.update({"llm.entropy_lemma_adam": TEST_TEXT["llm.entropy_lemma"],
                  "llm.entropy_pg_form_adam": TEST_TEXT["llm.entropy_pg_form_sgd"],
                  "llm.entropy_npg_form_adam": TEST_TEXT["llm.entropy_npg_form_sgd"]})
CRITERIA = {cid: spec.criterion for cid, spec in SPECS.items()}
"""claim id -> Criterion (the specs' criteria)."""
CRITERIA_HASH = criteria_hash(CRITERIA)
"""Stamped on every claim of the study (gapdyn.criteria_hash of :data:`CRITERIA`), computed at import."""


# ---- the formulas (float64 torch, last axis = vocabulary) ------------------------------------------------------
def _check_logits(z, name: str) -> torch.Tensor:
    if not torch.is_tensor(z) or z.ndim < 1 or z.shape[-1] < 2 or not bool(torch.isfinite(z).all()):
        raise ValueError(f"{name} must be a finite tensor [..., V] with V >= 2")
    return z.double()


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """H = -sum_a pi(a) log pi(a), pi = softmax(logits) over the last axis. [...]"""
    logp = torch.log_softmax(_check_logits(logits, "logits"), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def vocab_cov(logp: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Cov_{a~pi}(log pi(a), x(a)) = sum_a pi log pi x - (sum_a pi log pi)(sum_a pi x), pi = exp(logp), over the
    whole vocabulary (the last axis). [...]"""
    if logp.shape != x.shape:
        raise ValueError(f"logp and x must share one shape, got {tuple(logp.shape)} and {tuple(x.shape)}")
    p = logp.exp()
    return (p * logp * x).sum(-1) - (p * logp).sum(-1) * (p * x).sum(-1)


def lemma_dH(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """Cui et al. (arXiv 2505.22617), Lemma 1: dH ~ -Cov_{a~pi}(log pi(a), dz(a)), dz = after - before. [...]"""
    before, after = _check_logits(before, "before"), _check_logits(after, "after")
    if before.shape != after.shape:
        raise ValueError(f"before and after must share one shape, got {tuple(before.shape)} and {tuple(after.shape)}")
    return -vocab_cov(torch.log_softmax(before, -1), after - before)


class States(NamedTuple):
    """The distinct visited states of a batch and their visits (rows prompt-major, row n belongs to prompt n // G).

    row, pos: [S] where state s is scored (completion_logits[row, pos]); n_visits [S];
    visit_state, visit_row, visit_pos, visit_token: [Nv] one entry per sampled (masked) completion token."""

    row: np.ndarray
    pos: np.ndarray
    n_visits: np.ndarray
    visit_state: np.ndarray
    visit_row: np.ndarray
    visit_pos: np.ndarray
    visit_token: np.ndarray


def visited_states(completion_ids: torch.Tensor, completion_mask: torch.Tensor, G: int) -> States:
    """Every position whose next token was sampled (completion_mask > 0) is a visit of the state (prompt n // G,
    completion prefix o_<t); visits with the same prompt and prefix share one state (the first visit scores it)."""
    if completion_ids.ndim != 2 or completion_mask.shape != completion_ids.shape:
        raise ValueError(f"completion_ids and completion_mask must share one [N, T] shape, got "
                         f"{tuple(completion_ids.shape)} and {tuple(completion_mask.shape)}")
    if isinstance(G, bool) or not isinstance(G, int) or G < 1 or completion_ids.shape[0] % G:
        raise ValueError(f"G must be a positive integer dividing N = {completion_ids.shape[0]}, got {G!r}")
    ids, mask = completion_ids.tolist(), (completion_mask > 0).tolist()
    index, rows, poss, counts, vs, vr, vp, vt = {}, [], [], [], [], [], [], []
    for n, (seq, m) in enumerate(zip(ids, mask)):
        for t, on in enumerate(m):
            if not on:
                continue
            key = (n // G, tuple(seq[:t]))
            if key not in index:
                index[key] = len(rows)
                rows.append(n), poss.append(t), counts.append(0)
            s = index[key]
            counts[s] += 1
            vs.append(s), vr.append(n), vp.append(t), vt.append(seq[t])
    a = lambda v: np.asarray(v, dtype=np.int64)  # noqa: E731
    return States(a(rows), a(poss), a(counts), a(vs), a(vr), a(vp), a(vt))


def pg_logit_change(logp: torch.Tensor, st: States, g: torch.Tensor, eta: float) -> torch.Tensor:
    """Tabular softmax under plain SGD on the batch's loss: dz(s, .) = -eta sum_{visits i of s} g_i (e_{a_i} - pi(.|s)),
    g_i = dL/dlog pi(a_i|s) (one value per visit, [Nv]); logp [S, V] at the states. [S, V]"""
    S, V = logp.shape
    e = torch.zeros(len(st.visit_state), V, dtype=torch.float64)
    e[torch.arange(len(st.visit_state)), torch.as_tensor(st.visit_token)] = 1.0
    vs = torch.as_tensor(st.visit_state)
    per_visit = g.double()[:, None] * (e - logp.exp()[vs])
    return -eta * torch.zeros(S, V, dtype=torch.float64).index_add_(0, vs, per_visit)


def npg_logit_change(logp: torch.Tensor, st: States, adv: torch.Tensor, eta: float) -> torch.Tensor:
    """Tabular softmax under natural PG: dz(s, .) = eta A_hat(s, .), A_hat(s, a) = (1/n_s) sum_i A_i 1[a_i = a] /
    pi(a|s) (importance-weighted Monte Carlo estimate from the visits; adv [Nv] the visits' advantages). [S, V]"""
    S, V = logp.shape
    vs, vt = torch.as_tensor(st.visit_state), torch.as_tensor(st.visit_token)
    w = adv.double() / logp[vs, vt].exp() / torch.as_tensor(st.n_visits, dtype=torch.float64)[vs]
    out = torch.zeros(S, V, dtype=torch.float64)
    out.index_put_((vs, vt), w, accumulate=True)
    return eta * out


def state_rows(before: torch.Tensor, after: torch.Tensor, st: States, g: torch.Tensor, adv: torch.Tensor,
               eta: float) -> dict:
    """Per state: exact dH, Lemma 1's prediction, Theorems 1-2's (pg, npg), n_visits, H, the spread of dz
    (max_a |dz - E_pi dz|). before, after: completion logits [N, T, V]; g [N, T] = dL/dlog pi; adv [N]."""
    if before.shape != after.shape or before.ndim != 3:
        raise ValueError(f"before and after must share one [N, T, V] shape, got {tuple(before.shape)}, "
                         f"{tuple(after.shape)}")
    if not (math.isfinite(eta) and eta > 0):
        raise ValueError(f"eta must be finite and > 0, got {eta}")
    zb, za = before[st.row, st.pos].double(), after[st.row, st.pos].double()  # [S, V]
    logp = torch.log_softmax(zb, -1)
    dz = za - zb
    spread = (dz - (logp.exp() * dz).sum(-1, keepdim=True)).abs().amax(-1)
    gv = g.double()[st.visit_row, st.visit_pos]
    av = adv.double()[st.visit_row]
    pred = {"lemma": lemma_dH(zb, za),
            "pg": -vocab_cov(logp, pg_logit_change(logp, st, gv, eta)),
            "npg": -vocab_cov(logp, npg_logit_change(logp, st, av, eta))}
    out = {"exact": entropy(za) - entropy(zb), **pred, "H": entropy(zb), "dz_spread": spread}
    return {k: v.numpy() for k, v in out.items()} | {"n_visits": st.n_visits.copy()}


# ---- the study -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StudyConfig(AdditionBatch):
    """The runs (optimizer, lr) from one pinned warm model, each ``steps`` GRPO steps, measured every ``every``."""

    runs: tuple = (("sgd", 1e-5), ("sgd", 1e-4), ("sgd", 1e-3), ("sgd", 3e-3), ("sgd", 1e-2), ("adam", 4e-4))
    """(optimizer, lr). First declared: SGD 1e-3, 3e-3, 1e-2 (at the warm model |grad| ~ 8, so lr |grad| spans about
    1/10, 1/3 and 1 of Adam 4e-4's update norm, ~0.1-0.14). Their first run showed logit changes of order 1 already
    at 1e-3 (outside the first-order regime the band is for), so 1e-5 and 1e-4 were added afterwards; the
    criteria did not change and the first three runs are kept as they were (docs/llm_probe.md)."""
    steps: int = 30
    every: int = 1
    method: str = "grpo"
    seeds: tuple[int, ...] = (0,)
    """Stream seeds: every run of :attr:`runs` on each (``--seeds``; the study's own is seed 0, whose run folders
    and claim ids carry no seed label)."""
    shape: str = "tiny"  # the pinned warm checkpoint (llm_probe.experiments.pinned)

    def __post_init__(self):
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds must name at least one seed, none twice, got {self.seeds!r}")

    def label(self, optimizer: str, lr: float, seed: int) -> str:
        """A run's name (its folder under ``runs`` and its claim ids' suffix): ``<optimizer>_lr<lr>``, and
        ``_s<seed>`` unless the study runs its own seed only."""
        return run_name(optimizer, lr=lr, seed=None if self.seeds == (0,) else seed)


CONFIGS = {
    "test": StudyConfig(runs=(("sgd", 3e-3), ("adam", 4e-4)), steps=3, prompts_per_step=4, group_size=4),
    "full": StudyConfig(),  # 6 runs x 30 steps: about 2 min of one core
}
CONFIGS["quick"] = CONFIGS["full"]
"""Mode -> StudyConfig (test: seconds, the machinery; quick = full: the claims' size)."""


def _make_recorder():
    """A Trainer that keeps the batch of each measured step and its float64 logits at theta_k (a copy of the
    weights: the training model, its generators and so its trajectory are untouched)."""
    from ..losses import policy_loss
    from ..model import completion_logits
    from ..trainer import Trainer

    class Recorder(Trainer):
        every = 1
        pending = None

        def score(self, ro) -> torch.Tensor:
            if not hasattr(self, "_m64"):
                self._m64 = copy.deepcopy(self.model).double().eval()
            self._m64.load_state_dict(self.model.state_dict())
            with torch.no_grad():
                return completion_logits(self._m64, ro.prompt_ids, ro.prompt_mask, ro.completion_ids,
                                         ro.completion_mask).double()

        def rollout(self, problems, G, generator):
            ro = super().rollout(problems, G, generator)
            if generator is self.gen and self.step % self.every == 0:  # the training batch of a measured step
                before = self.score(ro)
                mask = ro.completion_mask.double()
                logp = (torch.log_softmax(before, -1).gather(-1, ro.completion_ids.unsqueeze(-1)).squeeze(-1)
                        * mask).requires_grad_(True)
                res = policy_loss(self.cfg.method, logp, logp.detach(), mask, ro.rewards.double(),
                                  max_completion_length=self.cfg.max_new_tokens, eps_low=self.cfg.eps_low,
                                  eps_high=self.cfg.eps_high)
                res.loss.backward()
                self.pending = (ro, before, logp.grad.detach(), res.advantages.detach().double())
            return ro

    return Recorder


def _run_one(cfg: StudyConfig, warm_dir, folder: Path, optimizer: str, lr: float, seed: int):
    """One run: (per-state rows, per-step rows) as pandas DataFrames."""
    import pandas as pd

    from ..config import TrainConfig

    name = cfg.label(optimizer, lr, seed)
    tc = TrainConfig(out_dir=str(folder), method=cfg.method, lr=lr, seed=seed, steps=cfg.steps,
                     prompts_per_step=cfg.prompts_per_step, group_size=cfg.group_size,
                     max_new_tokens=cfg.max_new_tokens, optimizer=optimizer, init_from=str(warm_dir),
                     probe_every=0, probe_prompts=0, num_threads=1, progress=False, device="cpu")
    tr = _make_recorder()(tc, task=SplitAddition())
    tr.every = cfg.every
    states, steps = [], []

    def after_step(trainer, k, m):
        if trainer.pending is None:
            return
        ro, before, g, adv = trainer.pending
        trainer.pending = None
        if m.get("skipped"):
            return
        st = visited_states(ro.completion_ids, ro.completion_mask, ro.G)
        r = state_rows(before, trainer.score(ro), st, g, adv, lr)
        d = pd.DataFrame(r).assign(step=k, prompt=st.row // ro.G)
        states.append(d)
        steps.append({"run": name, "optimizer": optimizer, "lr": lr, "step": k,
                      "reward": m["reward"], "n_states": len(d), "n_visits": int(d.n_visits.sum()),
                      "H_mean": d.H.mean(), **{f"sum_{c}": d[c].sum() for c in ("exact", "lemma", "pg", "npg")},
                      "dz_spread_median": d.dz_spread.median(), "dz_spread_max": d.dz_spread.max(),
                      "update_norm": m.get("update_norm", math.nan), "grad_norm": m.get("grad_norm", math.nan)})

    tr.run(on_step=after_step, checkpoint=False)
    s = pd.concat(states, ignore_index=True).assign(run=name, optimizer=optimizer, lr=lr)
    return s, pd.DataFrame(steps)


def cells(cfg: StudyConfig, instances=None) -> list[dict]:
    """One cell per (seed, optimizer, lr) (instances: the seeds, default ``cfg.seeds``), each with the study's
    settings (the StudyConfig fields but ``runs`` and ``seeds``)."""
    seeds = cfg.seeds if instances is None else tuple(int(s) for s in instances)
    settings = {k: v for k, v in asdict(cfg).items() if k not in ("runs", "seeds")}
    return [{"optimizer": o, "lr": lr, "seed": int(s), "settings": settings, "seeds": list(seeds)}
            for s in seeds for o, lr in cfg.runs]


def cell_name(cell: dict) -> str:
    """A cell's run folder under ``<out>/runs`` (:meth:`StudyConfig.label`)."""
    return _cell_config(cell).label(cell["optimizer"], cell["lr"], cell["seed"])


def _cell_config(cell: dict) -> StudyConfig:
    return StudyConfig(**cell["settings"], runs=((cell["optimizer"], cell["lr"]),), seeds=tuple(cell["seeds"]))


def run_cell(*, optimizer: str, lr: float, seed: int, settings: dict, seeds: list, out, warm_dir=None) -> dict:
    """One run into the run folder ``out`` (the trainer's files, states.parquet and steps.parquet: the rows of
    :func:`state_rows` and the per-step summaries), done.json last; returns done.json."""
    from gapdyn.io import atomic_write_json, write_parquet

    from .pinned import pinned_warm

    cfg = _cell_config({"optimizer": optimizer, "lr": lr, "settings": settings, "seeds": seeds})
    out = Path(out)
    states, steps = _run_one(cfg, pinned_warm(cfg.shape) if warm_dir is None else warm_dir, out, optimizer, lr, seed)
    write_parquet(out / "states.parquet", states)
    write_parquet(out / "steps.parquet", steps)
    done = {"run": cfg.label(optimizer, lr, seed), "optimizer": optimizer, "lr": lr, "seed": seed,
            "states": len(states), "steps": len(steps)}
    atomic_write_json(out / RESULT, done, indent=1)
    return done


def run_study(cfg: StudyConfig, out) -> tuple:
    """Every cell of ``cfg`` through the runner (_study.run_study: run folders under ``out/runs``, finished ones
    read back); (states, steps) of every run, in the cells' order."""
    import pandas as pd

    from ..threads import use_threads
    from .pinned import pinned_warm

    use_threads(1)
    warm = pinned_warm(cfg.shape)
    todo = cells(cfg)
    run_folders(todo, out, name=cell_name, progress=False, describe=lambda r: f"{r['states']} states",
                run=lambda c, d: run_cell(**c, out=d, warm_dir=warm))
    folders = [Path(out) / "runs" / cell_name(c) for c in todo]
    return tuple(pd.concat([pd.read_parquet(d / f) for d in folders], ignore_index=True)
                 for f in ("states.parquet", "steps.parquet"))


# ---- claims ----------------------------------------------------------------------------------------------------
CLAIM_OF = {("sgd", "lemma"): "llm.entropy_lemma", ("sgd", "pg"): "llm.entropy_pg_form_sgd",
            ("sgd", "npg"): "llm.entropy_npg_form_sgd", ("adam", "lemma"): "llm.entropy_lemma_adam",
            ("adam", "pg"): "llm.entropy_pg_form_adam", ("adam", "npg"): "llm.entropy_npg_form_adam"}
"""(optimizer kind, prediction) -> claim id of :data:`SPECS`."""
PRED = {"lemma": "-Cov(log pi, dz)", "pg": "-eta Cov(log pi, dz_tab) [plain PG]", "npg": "-eta Cov(log pi, A_hat) [NPG]"}


def _spearman(x, y) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(x, y).statistic) if len(x) > 2 and np.ptp(x) > 0 and np.ptp(y) > 0 else math.nan


def _fit_row(d, pred: str, cluster: str) -> dict:
    """Slope of exact on ``pred`` over the rows of ``d``, CR1 t (90 % and 95 %), Spearman, sign agreement."""
    x, y, c = d[pred].to_numpy(), d["exact"].to_numpy(), d[cluster].to_numpy()
    nz = (x != 0) & (y != 0)
    row = {"pred": pred, "n_states": len(d), "clusters": int(len(np.unique(c))), "cluster": cluster,
           "dz_spread_median": float(d["dz_spread"].median()),
           "spearman": _spearman(x, y), "sign_agreement": float(np.mean(np.sign(x[nz]) == np.sign(y[nz])))
           if nz.any() else math.nan, "est90": None, "est95": None}
    if row["clusters"] >= 3 and np.ptp(x) > 0:
        row["est90"] = t_interval_cluster_slope(x, y, c, confidence=0.90)
        row["est95"] = t_interval_cluster_slope(x, y, c, confidence=0.95)
    return row


def claims_from_states(states, cfg: StudyConfig) -> tuple[list, list]:
    """(claims, fit rows): per SGD run the lemma, pg and npg rows; per Adam run the same for step 0 (prompt
    clusters) and the later steps (step clusters). A fit with fewer than 3 clusters is an unmeasured claim."""
    claims, fits = [], []
    for run, d in states.groupby("run", sort=False):
        opt, lr = d.optimizer.iloc[0], float(d.lr.iloc[0])
        blocks = [("all", d, "step")] if opt == "sgd" else [("step0", d[d.step == 0], "prompt"),
                                                             ("later", d[d.step > 0], "step")]
        for block, b, cluster in blocks:
            if b.empty:
                continue
            for pred in ("lemma", "pg", "npg"):
                cid = CLAIM_OF[("sgd" if opt == "sgd" else "adam", pred)]
                spec = SPECS[cid]
                f = _fit_row(b, pred, cluster)
                fits.append({"run": run, "block": block, **{k: v for k, v in f.items() if not k.startswith("est")},
                             "slope": f["est95"].estimate if f["est95"] else math.nan,
                             "lo95": f["est95"].lo if f["est95"] else math.nan,
                             "hi95": f["est95"].hi if f["est95"] else math.nan})
                steps_txt = f"steps {int(b.step.min())}-{int(b.step.max())}" if block != "step0" else "step 0"
                setting = (f"tiny Qwen (pinned warm), {cfg.method}, {opt} lr {lr:g}, {steps_txt}, "
                           f"{len(b)} states in {f['clusters']} {cluster} clusters; Spearman {f['spearman']:.3f}, "
                           f"sign agreement {f['sign_agreement']:.3f}")
                est = f["est90"] if spec.criterion.kind == "equivalence" else f["est95"]
                common = dict(id=f"{cid}@{run}" + ("" if block == "all" else f"_{block}"), source=spec.source,
                              statement=spec.statement, setting=setting,
                              statistic=f"OLS slope of exact dH(s) on {PRED[pred]}",
                              criterion_text=f"{TEST_TEXT[cid]}: {spec.criterion_text}", criterion=spec.criterion,
                              form=spec.form, key=spec.key, role=spec.role, criteria_hash=CRITERIA_HASH)
                if est is None:
                    claims.append(Claim(estimate=0.0, interval=(0.0, 0.0), n=max(1, f["clusters"]), measured=False,
                                        reason="fewer than 3 clusters or a constant prediction",
                                        confidence=0.90 if spec.criterion.kind == "equivalence" else 0.95, **common))
                else:
                    claims.append(Claim.from_estimate(est, **common))
    return claims, fits


def write_results(out, claims, fits, steps, *, command: str, wall_s: float) -> None:
    """claims.json, claims.md (the claims, the fit table with Spearman and sign agreement, the command and its wall
    time) and steps.csv (per-step summaries) into ``out``."""
    import pandas as pd

    from gapdyn.evidence.claims import markdown_table
    from gapdyn.io import atomic_write_text

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "claims.json", claims_to_json(claims))
    fit_df = pd.DataFrame(fits)
    md = (f"# Cui et al. 2025 (arXiv 2505.22617): entropy dynamics per visited state, tiny Qwen\n\n"
          f"Regenerate: `{command}` (measured wall time {wall_s:.0f} s, one process, 1 torch thread). "
          f"Criteria hash {CRITERIA_HASH}. The statements and what is measured: llm_probe/experiments/entropy_lemma.py.\n\n"
          f"{claims_markdown(claims)}\n\n## Fits (slope of exact dH on each prediction, 95 % CR1 t)\n\n"
          f"{markdown_table(fit_df.round(4))}\n")
    atomic_write_text(out / "claims.md", md)
    steps.to_csv(out / "steps.csv", index=False, float_format="%.6g")


def main_study(mode: str, out, *, command: str, runs_dir=None, seeds=None) -> list:
    """Run the study of ``mode`` (on ``seeds`` when given: :attr:`StudyConfig.seeds`) and write its results into
    ``out``; the run folders go to ``runs_dir/runs`` (None: a temporary folder, removed after; a given one is
    resumable); returns the claims."""
    import tempfile
    from dataclasses import replace

    if mode not in CONFIGS:
        raise ValueError(f"mode must be one of {sorted(CONFIGS)}, got {mode!r}")
    t0 = time.perf_counter()
    cfg = CONFIGS[mode] if seeds is None else replace(CONFIGS[mode], seeds=tuple(int(s) for s in seeds))
    with tempfile.TemporaryDirectory() as tmp:
        states, steps = run_study(cfg, tmp if runs_dir is None else runs_dir)
    claims, fits = claims_from_states(states, cfg)
    write_results(out, claims, fits, steps, command=command, wall_s=time.perf_counter() - t0)
    return claims
