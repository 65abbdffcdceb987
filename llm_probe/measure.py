"""Framework-agnostic Gradient-Gap measurement: one call on (prompts, completions, rewards) from any trainer.

:func:`measure` groups the completions by prompt, and for every mixed group q (a reward > 0 and a reward <= 0)
computes the gap estimate g_q = grad Phi_hat_q at the model's current parameters theta_k (llm_probe.probes:
Phi_hat_q = mean_{O+} log pi(o|q) - mean_{O-} log pi(o|q), Suk & Duan, arXiv 2510.08539), its norm and, given
the step's parameter change w = theta_{k+1} - theta_k, the alignment dmu_q = <w, g_q> (eta = 1, any optimizer),
cos(w, g_q) and the increment of the cumulative alignment, mean_q [dmu_q]_+ (the ``gap/M_batch`` step of
:class:`llm_probe.GapProbe`). Group sizes may differ. The gap matrix [Q, P] is kept only when it fits in
``max_gap_bytes`` (route "dot"); above that the gaps are streamed, one at a time (route "stream").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from .gap_probe import DEFAULT_MAX_GAP_BYTES, _eval_mode
from .model import scoring_temperature
from .probes import (
    _gap_dtype,
    alignment_metrics,
    dot_alignment,
    flat,
    gap_matrix_bytes,
    per_prompt_gaps,
    select_params,
    streamed_gap_stats,
)
from .rollout import Rollout

__all__ = ["measure", "encode_rollout", "parameter_change", "MEASURE_ROUTES"]

MEASURE_ROUTES = ("auto", "dot", "stream")


def parameter_change(params: Mapping[str, torch.Tensor], update) -> dict[str, torch.Tensor]:
    """The step w over ``params``' names: ``update`` is either {name: w} or a pair (state_dict_before,
    state_dict_after), then w = after - before."""
    if isinstance(update, (tuple, list)):
        if len(update) != 2 or not all(isinstance(u, Mapping) for u in update):
            raise ValueError("update must be a dict name -> tensor or a pair of state dicts (before, after)")
        before, after = update
        missing = [n for n in params if n not in before or n not in after]
        if missing:
            raise ValueError(f"update: the state dicts lack parameters {missing[:3]} (of {len(missing)})")
        return {n: (after[n].detach().to(p.device, torch.float64) - before[n].detach().to(p.device, torch.float64))
                .to(p.dtype) for n, p in params.items()}
    if not isinstance(update, Mapping):
        raise ValueError(f"update must be a dict name -> tensor or a pair of state dicts, got {type(update).__name__}")
    missing = [n for n in params if n not in update]
    if missing:
        raise ValueError(f"update lacks parameters {missing[:3]} (of {len(missing)})")
    out = {}
    for n, p in params.items():
        w = update[n].detach()
        if w.shape != p.shape:
            raise ValueError(f"update[{n!r}] has shape {tuple(w.shape)}, the parameter {tuple(p.shape)}")
        out[n] = w.to(p.device, p.dtype)
    return out


def _as_ids(x, tokenizer, what: str, i: int, special: bool = False) -> list[int]:
    if tokenizer is not None:
        if not isinstance(x, str):
            raise ValueError(f"{what}[{i}] must be a string when a tokenizer is given, got {type(x).__name__}")
        return list(tokenizer(x, add_special_tokens=special)["input_ids"])
    if isinstance(x, str) or not isinstance(x, Sequence) and not torch.is_tensor(x):
        raise ValueError(f"{what}[{i}] must be a sequence of token ids when no tokenizer is given")
    return [int(t) for t in x]


def encode_rollout(tokenizer, prompts, completions, rewards, *, pad_id: int | None = None, eos_id: int | None = None,
                   device=None, add_special_tokens: bool = False) -> tuple[list, list[Rollout], list[list[int]]]:
    """Group completions by prompt (order of first appearance) and encode them.

    Returns (keys, rollouts, members): ``keys`` [B] the distinct prompts, one :class:`Rollout` per group size
    (left-padded prompts, right-padded completions, rewards > 0 -> 1; its ``problems`` field holds the group
    indices j of its rows), and ``members[j]`` the rows of ``prompts``
    in group j. ``tokenizer`` None: prompts and completions are token-id sequences. ``eos_id``: appended to
    every completion that does not end with it (None: completions are scored as given). ``add_special_tokens``:
    prompts encoded with the tokenizer's special tokens (a BOS, as TRL encodes plain-text prompts); completions
    never are.
    """
    n = len(prompts)
    if n == 0:
        raise ValueError("prompts must not be empty")
    if len(completions) != n or len(rewards) != n:
        raise ValueError(f"prompts, completions and rewards must have one entry per completion, got "
                         f"{n}, {len(completions)}, {len(rewards)}")
    if pad_id is None:
        pad_id = getattr(tokenizer, "pad_token_id", None)
    pad_id = 0 if pad_id is None else int(pad_id)  # masked positions: their value never reaches a scored log-prob
    p_ids = [_as_ids(p, tokenizer, "prompts", i, add_special_tokens) for i, p in enumerate(prompts)]
    c_ids = [_as_ids(c, tokenizer, "completions", i) for i, c in enumerate(completions)]
    for i, (p, c) in enumerate(zip(p_ids, c_ids)):
        if not p:
            raise ValueError(f"prompts[{i}] encodes to no token")
        if eos_id is not None and (not c or c[-1] != eos_id):
            c.append(int(eos_id))
        if not c:
            raise ValueError(f"completions[{i}] encodes to no token")
    r = [float(x) for x in rewards]
    groups: dict[tuple, list[int]] = {}
    for i, p in enumerate(p_ids):
        groups.setdefault(tuple(p), []).append(i)
    keys = list(groups)
    members = [groups[k] for k in keys]
    by_size: dict[int, list[int]] = {}
    for j, m in enumerate(members):
        by_size.setdefault(len(m), []).append(j)
    rollouts = []
    for G, js in by_size.items():
        rows = [i for j in js for i in members[j]]
        P = max(len(p_ids[i]) for i in rows)
        T = max(len(c_ids[i]) for i in rows)
        pi = torch.tensor([[pad_id] * (P - len(p_ids[i])) + p_ids[i] for i in rows])
        pm = torch.tensor([[0] * (P - len(p_ids[i])) + [1] * len(p_ids[i]) for i in rows])
        ci = torch.tensor([c_ids[i] + [pad_id] * (T - len(c_ids[i])) for i in rows])
        cm = torch.tensor([[1.0] * len(c_ids[i]) + [0.0] * (T - len(c_ids[i])) for i in rows])
        rw = (torch.tensor([r[i] for i in rows]).view(len(js), G) > 0).float()
        ro = Rollout(list(js), pi.to(device), pm.to(device), ci.to(device), cm.to(device),
                     torch.ones(len(rows), dtype=torch.bool), [""] * len(rows), rw)
        rollouts.append(ro)
    return [prompts[m[0]] for m in members], rollouts, members


def measure(model, tokenizer_or_ids, prompts, completions, rewards, *, update=None, params: str = "all",
            route: str = "auto", max_gap_bytes: int = DEFAULT_MAX_GAP_BYTES, eos_id: int | None = None,
            temperature: float = 1.0, add_special_tokens: bool = False) -> dict:
    """Gradient-Gap metrics of one batch at the model's current parameters (theta_k).

    prompts, completions, rewards: one entry per completion (str with a tokenizer; token ids when
    ``tokenizer_or_ids`` is None), grouped by prompt. update: the step w = theta_{k+1} - theta_k as {name: tensor}
    or as a pair of state dicts (before, after). params: a :func:`llm_probe.probes.select_params` subset.
    route: "dot" (keep the [Q, P] gap matrix, returned as ``gaps``), "stream" (one gap at a time: memory
    independent of Q) or "auto" (dot while the matrix fits in ``max_gap_bytes``). temperature: the policy scored
    is log softmax(z / T) (the trainer's sampling / training temperature; TRL's ``args.temperature``).
    add_special_tokens: encode string prompts with the tokenizer's special tokens (TRL does; exact in every case:
    pass the token ids the trainer used, with ``tokenizer_or_ids`` None).

    Returns a dict: ``prompts`` [B] distinct prompts, ``J_hat`` [B] success rate, ``mixed`` [B];
    over the Q mixed groups (in prompt order) ``groups`` [Q] (index into ``prompts``), ``phi`` [Q] Phi_hat_q,
    ``n_pos``/``n_neg`` [Q], ``gap_norm`` [Q], ``gaps`` [Q, P] (route dot) and, with ``update``: ``dmu`` [Q],
    ``cos`` [Q], ``update_norm``, ``M_increment`` = mean_q [dmu_q]_+; ``metrics``: the ``gap/*`` scalars of
    :class:`llm_probe.GapProbe` that these determine; ``route`` the route taken.
    """
    if route not in MEASURE_ROUTES:
        raise ValueError(f"route must be one of {MEASURE_ROUTES}, got {route!r}")
    if isinstance(max_gap_bytes, bool) or not isinstance(max_gap_bytes, int) or max_gap_bytes < 0:
        raise ValueError(f"max_gap_bytes must be an integer >= 0, got {max_gap_bytes!r}")
    tok = tokenizer_or_ids
    pad_id = getattr(tok, "pad_token_id", None) if tok is not None else getattr(model.config, "pad_token_id", None)
    sel = select_params(model, params)
    dev = next(iter(sel.values())).device
    keys, rollouts, members = encode_rollout(tok, prompts, completions, rewards, pad_id=pad_id, eos_id=eos_id,
                                             device=dev, add_special_tokens=add_special_tokens)
    w = parameter_change(sel, update) if update is not None else None
    B = len(keys)
    J_hat = torch.zeros(B)
    mixed = torch.zeros(B, dtype=torch.bool)
    for ro in rollouts:
        r = ro.rewards
        J_hat[ro.problems] = r.mean(-1)
        mixed[ro.problems] = (r > 0).any(-1) & (r <= 0).any(-1)
    Q = int(mixed.sum())
    if route == "auto":
        route = "dot" if gap_matrix_bytes(Q, sel) <= max_gap_bytes else "stream"
    P = sum(p.numel() for p in sel.values())
    groups = torch.nonzero(mixed).flatten()
    where = {int(b): q for q, b in enumerate(groups.tolist())}  # prompt index -> row among the mixed groups
    phi, n_pos, n_neg, norm = (torch.zeros(Q, dtype=torch.float64) for _ in range(4))
    gaps = torch.zeros(Q, P, dtype=_gap_dtype(list(sel.values()))) if route == "dot" else None
    dmu = torch.zeros(Q, dtype=torch.float64) if w is not None else None
    w_flat = flat(w) if w is not None and route == "dot" else None
    with _eval_mode(model), scoring_temperature(temperature):
        for ro in rollouts:
            js = ro.problems
            if route == "dot":
                est = per_prompt_gaps(model, ro, sel)
                rows_g, rows_phi, rows_pos, rows_neg, rows_norm = est.groups, est.phi, est.n_pos, est.n_neg, est.norms
                rows_dmu = dot_alignment(est.gaps, w_flat) if w is not None else None
            else:
                st = streamed_gap_stats(model, ro, sel, {"w": w} if w is not None else {})
                rows_g, rows_phi, rows_pos, rows_neg, rows_norm = st.groups, st.phi, st.n_pos, st.n_neg, st.norms
                rows_dmu = st.dots["w"] if w is not None else None
            for i, b in enumerate(rows_g.tolist()):
                q = where[js[b]]
                phi[q], n_pos[q], n_neg[q], norm[q] = rows_phi[i], rows_pos[i], rows_neg[i], rows_norm[i]
                if gaps is not None:
                    gaps[q] = est.gaps[i]
                if dmu is not None:
                    dmu[q] = rows_dmu[i]
    out = {"prompts": keys, "J_hat": J_hat, "mixed": mixed, "groups": groups, "phi": phi,
           "n_pos": n_pos.long(), "n_neg": n_neg.long(), "gap_norm": norm, "route": route}
    if gaps is not None:
        out["gaps"] = gaps
    if w is not None:
        wn = sum(float(t.double().pow(2).sum()) for t in w.values()) ** 0.5
        den = norm * wn
        out["dmu"] = dmu
        out["cos"] = torch.where(den > 0, dmu / den.clamp(min=1e-300), torch.zeros_like(dmu))
        out["update_norm"] = wn
        out["M_increment"] = float(dmu.clamp(min=0).mean()) if Q else 0.0
        out["metrics"] = alignment_metrics("gap", dmu, None, None, wn, norms=norm)
    return out
