"""The Gradient-Gap probe of one optimizer step, shared by :class:`llm_probe.Trainer` and
:class:`llm_probe.GapProbeCallback` (so every ``gap/*`` metric is defined here once).

Suk & Duan (arXiv 2510.08539): the alignment of a step w with the Gradient Gap is dmu = <w, g+ - g->, and
the cumulative alignment is M(K) = sum_k eta_k [dmu_k]_+ (Thm 1: J(K) >= sigmoid(logit J0 + M/2)). Here,
per prompt q with a mixed group, g_q = grad Phi_hat_q (llm_probe.probes) and w the real parameter change
with eta = 1, so any optimizer (Adam included) is covered. A step k is probed in two calls:

- :meth:`GapProbe.before` (the step hook of llm_probe.step_hook) at theta_k, after backward and gradient clipping (the gradient is read from
  ``p.grad``, never changed): gaps g_q of the batch's mixed groups (``dot`` route) and of the fixed probe
  prompts, -grad L, Phi_hat_q(theta_k);
- :meth:`GapProbe.after` at theta_{k+1}: delta = theta_{k+1} - theta_k, dmu_q = <delta, g_q>,
  dmu_grad_q = <-grad L, g_q> (dot products, or forward-mode JVPs evaluated at theta_k: ``jvp``; ``both``
  logs their largest difference; ``stream``: the same numbers as ``dot`` with one gap in memory at a time,
  evaluated at a snapshot of theta_k, chosen by itself when the gap matrix would exceed ``max_gap_bytes``),
  M_batch += mean_q [dmu_q]_+, M_q += [dmu_q]_+ per probe prompt, and the
  realised change of Phi_hat_q on the same completions (first order: dmu_q).

The metric names are those of docs/llm_probe.md ("Metrics").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .collectives import RankFailure, agree, gather_by_index
from .model import eval_mode as _eval_mode
from .probes import (
    alignment_metrics,
    dot_alignment,
    flat,
    jvp_alignment,
    mixed_groups,
    objectives_from_logprobs,
    per_prompt_gaps,
    prompt_objectives,
    gap_matrix_bytes,
    select_params,
    streamed_gap_stats,
)
from .step_hook import Step, check_step

__all__ = ["GapProbe", "ProbeResult", "ALIGNMENT_ROUTES"]

ALIGNMENT_ROUTES = ("dot", "jvp", "both", "stream")
DEFAULT_MAX_GAP_BYTES = 2**30  # above this the dot route streams (gap matrix of batch + probe prompts)


@dataclass(frozen=True)
class ProbeResult:
    """What :meth:`GapProbe.after` measured for one step."""

    metrics: dict  # gap/* scalars (docs/llm_probe.md)
    dmu_update: torch.Tensor | None  # [Q] <delta, g_q> per mixed batch prompt (None: no mixed group)
    dmu_grad: torch.Tensor | None  # [Q] <-grad L, g_q>
    update_norm: float  # ||theta_{k+1} - theta_k|| over the probed parameters
    grad_norm: float  # ||grad L|| over the probed parameters (after clipping)
    prompts: list  # [n_probe_prompts] dicts: J_hat, mixed, dmu_update, M (empty without probe prompts)
    gap_norms: torch.Tensor | None = None  # [Q] ||g_q|| (dot and stream routes)


@dataclass
class _Pending:
    """State recorded by before() at theta_k for after()."""

    ro: object  # the batch Rollout
    groups: torch.Tensor  # [Q] mixed batch groups
    old: dict  # probed parameters at theta_k
    theta_k: dict | None  # every parameter at theta_k (forward-mode routes evaluate there); None: dot only
    ascent: dict  # -grad L on the probed parameters
    batch_gap: object  # GapEstimate or None (jvp route)
    phi_old: torch.Tensor  # [Q] Phi_hat_q(theta_k)
    probe_ro: object  # Rollout of the fixed probe prompts or None
    probe_gap: object  # GapEstimate or None
    stream: bool = False  # gaps recomputed one at a time in after(), at theta_k
    shard_index: torch.Tensor | None = None  # [B] global group of each of ro's groups (this rank's share), or None


class GapProbe:
    """Per-step Gradient-Gap alignment of a policy ``model`` over the parameters ``params`` selects.

    alignment: "dot" (gap vectors, then dot products: also norms and cosines), "jvp" (forward mode, no gap
    vectors: least memory), "both" (dot values, plus ``gap/jvp_dot_maxdiff``) or "stream" (dot's numbers without the
    [prompts x parameters] matrix; "dot" and "both" switch to it by themselves for a step whose matrix would
    exceed ``max_gap_bytes``; None: never). Parameters: ``params`` is a :func:`select_params` subset ("all" =
    every ``requires_grad`` parameter, so a PEFT model probes its adapter only). n_probe_prompts: size of the
    fixed probe-prompt set whose M_q is tracked (0: none). ``M_batch`` and ``M_probe`` are the running sums
    (a checkpoint saves and restores them).
    """

    def __init__(self, model, params: str = "all", *, alignment: str = "dot", n_probe_prompts: int = 0,
                 max_gap_bytes: int | None = DEFAULT_MAX_GAP_BYTES):
        if alignment not in ALIGNMENT_ROUTES:
            raise ValueError(f"alignment must be one of {ALIGNMENT_ROUTES}, got {alignment!r}")
        if isinstance(n_probe_prompts, bool) or not isinstance(n_probe_prompts, int) or n_probe_prompts < 0:
            raise ValueError(f"n_probe_prompts must be an integer >= 0, got {n_probe_prompts!r}")
        if max_gap_bytes is not None and (isinstance(max_gap_bytes, bool) or not isinstance(max_gap_bytes, int)
                                          or max_gap_bytes < 0):
            raise ValueError(f"max_gap_bytes must be an integer >= 0 or None, got {max_gap_bytes!r}")
        self.model = model
        self.max_gap_bytes = max_gap_bytes
        self.params = select_params(model, params)
        self.alignment = alignment
        self.M_batch = 0.0
        self.M_probe = np.zeros(n_probe_prompts)
        self._pending: _Pending | None = None

    @property
    def pending(self) -> bool:
        """True between :meth:`before` and :meth:`after` (or :meth:`cancel`)."""
        return self._pending is not None

    def before(self, step: Step) -> dict:
        """Record step k at theta_k: call after backward and clipping, before ``optimizer.step()`` (the step hook
        of llm_probe.step_hook); returns {} (nothing is logged at theta_k).

        step.ro: the batch Rollout; step.probe_ro: the fixed probe prompts' Rollout at theta_k (or None);
        step.seq_logp [B*G]: log pi(o_n) of the batch from the training forward (the jvp route's Phi_hat(theta_k)
        without a forward of its own); step.theta_k: every named parameter at theta_k (reused, else cloned when a
        forward-mode route needs it); step.shard_index [B]: ``ro`` is this rank's share of a batch split by prompt
        over the processes (llm_probe.collectives), shard_index[b] the global group of its group b: :meth:`after`
        then gathers every rank's per-prompt scalars (a collective) and returns the whole batch's numbers.
        """
        step = check_step(step, "GapProbe")
        ro, probe_ro, seq_logp, theta_k, shard_index = (step.ro, step.probe_ro, step.seq_logp, step.theta_k,
                                                        step.shard_index)
        if shard_index is not None and (probe_ro is not None or len(shard_index) != ro.B):
            raise ValueError(f"shard_index must hold one global group per group of ro ({ro.B}) and needs "
                             f"probe_ro=None, got {len(shard_index)} entries")
        if probe_ro is not None and probe_ro.B != len(self.M_probe):
            raise ValueError(f"probe_ro holds {probe_ro.B} prompts, the probe tracks {len(self.M_probe)}")
        stream = self.alignment == "stream" or (
            self.alignment != "jvp" and self.max_gap_bytes is not None and gap_matrix_bytes(
                len(mixed_groups(ro.rewards)) + (0 if probe_ro is None else len(mixed_groups(probe_ro.rewards))),
                self.params) > self.max_gap_bytes)
        dot = self.alignment != "jvp" and not stream
        names = list(self.params)
        keep = self.alignment != "dot" or stream  # forward-mode and streamed routes evaluate at theta_k later
        if keep and theta_k is None:  # frozen parameters (a LoRA base) do not move: kept uncopied
            theta_k = {n: p.detach().clone() if p.requires_grad else p.detach()
                       for n, p in self.model.named_parameters()}
        old = {n: (theta_k[n] if theta_k is not None else self.params[n].detach().clone()) for n in names}
        ascent = {n: -(p.grad.detach() if p.grad is not None else torch.zeros_like(p)) for n, p in self.params.items()}
        with _eval_mode(self.model):  # no dropout in the probe's forwards
            batch_gap = per_prompt_gaps(self.model, ro, self.params) if dot else None
            groups = batch_gap.groups if dot else mixed_groups(ro.rewards)
            if dot:
                phi_old = batch_gap.phi
            elif stream:
                phi_old = None  # streamed_gap_stats returns it in after()
            elif seq_logp is not None:
                phi_old = objectives_from_logprobs(ro.rewards, groups, seq_logp.detach()).cpu()
            else:
                with torch.no_grad():
                    phi_old = prompt_objectives(self.model, ro, groups).cpu() if len(groups) else torch.zeros(0)
            probe_gap = per_prompt_gaps(self.model, probe_ro, self.params) if dot and probe_ro is not None else None
        self._pending = _Pending(ro, groups, old, theta_k if keep else None, ascent, batch_gap, phi_old, probe_ro,
                                 probe_gap, stream, None if shard_index is None else torch.as_tensor(shard_index))
        return {}

    def cancel(self) -> None:
        """Drop the step recorded by :meth:`before` (the step was skipped)."""
        self._pending = None

    def after(self) -> ProbeResult:
        """Measure step k at theta_{k+1} (call right after ``optimizer.step()``) and update M. On a shard
        (``shard_index``), an error in this rank's own part is announced to every rank before the gather
        (llm_probe.collectives.agree): every rank then raises :class:`llm_probe.collectives.RankFailure` instead of
        waiting in the gather."""
        if self._pending is None:
            raise RuntimeError("GapProbe.after() called without a matching before()")
        s, self._pending = self._pending, None
        state = {"agreed": False}
        try:
            return self._after(s, state)
        except Exception as exc:
            if s.shard_index is None or state["agreed"] or isinstance(exc, RankFailure):
                raise
            agree(f"{type(exc).__name__}: {exc}".splitlines()[0][:300])  # raises on every rank
            raise

    def _after(self, s: _Pending, state: dict) -> ProbeResult:
        delta_d = {n: self.params[n].detach() - s.old[n] for n in s.old}
        # flat copies only for the gap-matrix products; the streamed route works per parameter
        delta = flat(delta_d) if s.batch_gap is not None or s.probe_gap is not None else None
        ascent = flat(s.ascent) if s.batch_gap is not None else None
        delta_norm, ascent_norm = _norm(delta_d), _norm(s.ascent)
        out = {}
        dmu_u = dmu_g = norms = jv_diff = None
        if s.stream:
            with _eval_mode(self.model):
                st = streamed_gap_stats(self.model, s.ro, self.params, {"u": delta_d, "g": s.ascent}, at=s.theta_k)
            dt = _dtype(delta_d)
            dmu_u, dmu_g, norms = st.dots["u"].to(dt), st.dots["g"].to(dt), st.norms
            s.phi_old = st.phi
        if s.batch_gap is not None:
            dmu_u, dmu_g = dot_alignment(s.batch_gap.gaps, delta), dot_alignment(s.batch_gap.gaps, ascent)
        batch_jvp = self.alignment in ("jvp", "both") and len(s.groups) > 0
        probe_jvp = s.probe_ro is not None and s.probe_gap is None and not s.stream
        probe_groups = s.probe_gap.groups if s.probe_gap is not None else (
            mixed_groups(s.probe_ro.rewards) if s.probe_ro is not None else None)
        dmu_probe = None
        if s.probe_gap is not None and len(probe_groups):
            dmu_probe = dot_alignment(s.probe_gap.gaps, delta)
        if s.stream and s.probe_ro is not None and len(probe_groups):
            with _eval_mode(self.model):
                st_p = streamed_gap_stats(self.model, s.probe_ro, self.params, {"u": delta_d}, at=s.theta_k)
            dmu_probe = st_p.dots["u"].to(_dtype(delta_d))
        with _eval_mode(self.model):
            if batch_jvp:  # both directions (update, -grad) in one vmap'd forward-mode pass at theta_k
                jv_u, jv_g = jvp_alignment(self.model, s.ro, s.groups, s.old, [delta_d, s.ascent], base=s.theta_k)
                if dmu_u is not None:
                    jv_diff = (jv_u - dmu_u).abs()
                else:
                    dmu_u, dmu_g = jv_u, jv_g
            if probe_jvp:
                dmu_probe = jvp_alignment(self.model, s.probe_ro, probe_groups, s.old, delta_d, base=s.theta_k)
            gaps = s.batch_gap.gaps if s.batch_gap is not None else None
            if gaps is not None:
                norms = s.batch_gap.norms
            dphi = None
            if dmu_u is not None and len(dmu_u):
                with torch.no_grad():  # realised change of Phi_hat on the same completions (first order: dmu)
                    dphi = prompt_objectives(self.model, s.ro, s.groups).cpu() - s.phi_old
        if s.shard_index is not None:  # every rank's per-prompt scalars, in the one-process order
            agree(None)  # every rank's own part done (or a RankFailure here on every rank)
            state["agreed"] = True
            dmu_u, dmu_g, norms, dphi, jv_diff = self._gather(s, dmu_u, dmu_g, norms, dphi, jv_diff)
            gaps = None
        if jv_diff is not None and len(jv_diff):
            out["gap/jvp_dot_maxdiff"] = float(torch.max(jv_diff))
        out.update(alignment_metrics("gap", dmu_u, dmu_g, gaps, delta_norm, ascent_norm, norms=norms))
        if dmu_u is not None and len(dmu_u):
            self.M_batch += float(dmu_u.clamp(min=0).mean())
            out["gap/dphi_mean"] = float(dphi.mean())
        out["gap/M_batch"] = self.M_batch
        prompts = []
        if s.probe_ro is not None:
            out_p, prompts = self._probe_prompts(s.probe_ro, probe_groups, dmu_probe)
            out.update(out_p)
        return ProbeResult(out, dmu_u, dmu_g, delta_norm, ascent_norm, prompts, norms)

    def _gather(self, s, dmu_u, dmu_g, norms, dphi, jv_diff):
        """The per-prompt scalars of every rank's share (llm_probe.collectives.gather_by_index), sorted by global
        group: the values the one-process probe of the whole batch computes. A collective: every rank calls it."""
        empty = torch.zeros(0, dtype=torch.float64)
        vals = {"dmu_u": dmu_u, "dmu_g": dmu_g, "dphi": dphi}
        if self.alignment != "jvp":
            vals["norms"] = norms
        if self.alignment == "both":
            vals["jv_diff"] = jv_diff
        vals = {k: empty if v is None else v for k, v in vals.items()}
        _, got = gather_by_index(s.shard_index[s.groups], vals)
        return got["dmu_u"], got["dmu_g"], got.get("norms"), got["dphi"], got.get("jv_diff")

    def _probe_prompts(self, probe_ro, groups, dmu_probe):
        """M_q += [dmu_q]_+ over the fixed probe prompts (0 for a prompt without a mixed group)."""
        n = len(self.M_probe)
        dmu = torch.zeros(n)
        if len(groups):
            dmu[groups] = dmu_probe.to(dmu.dtype)
        self.M_probe += dmu.clamp(min=0).numpy()
        J_hat = probe_ro.rewards.mean(-1).numpy()
        mixed = np.zeros(n, dtype=bool)
        mixed[groups.numpy()] = True
        metrics = {
            "gap/M_mean": float(self.M_probe.mean()),
            "gap/probe_J_mean": float(J_hat.mean()),
            "gap/probe_n_mixed": int(mixed.sum()),
            "gap/probe_dmu_update_mean": float(dmu[mixed].mean()) if mixed.any() else float("nan"),
        }
        rows = [{"prompt_id": i, "J_hat": float(J_hat[i]), "mixed": bool(mixed[i]), "dmu_update": float(dmu[i]),
                 "M": float(self.M_probe[i])} for i in range(n)]
        return metrics, rows


def _norm(tensors: dict) -> float:
    """The Euclidean norm of the concatenation of ``tensors``' values, without concatenating them."""
    return sum(float(torch.linalg.vector_norm(t)) ** 2 for t in tensors.values()) ** 0.5


def _dtype(tensors: dict) -> torch.dtype:
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors.values()) else torch.float32
