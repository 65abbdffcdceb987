"""Gradient-direction probes: per-prompt Gradient Gap, alignment of the update, cumulative M, token stats.

For one prompt q with sampled completions split by reward into O+ and O- (both non-empty: a "mixed" group):
- per-prompt log-odds proxy  Phi_hat_q(theta) = mean_{o in O+} log pi(o|q) - mean_{o in O-} log pi(o|q)
  (log pi(o|q) the summed token log-probs; the completions are held fixed);
- gap estimate  g_q = grad_theta Phi_hat_q, a sample of the Gradient Gap g+ - g- (Suk & Duan,
  arXiv 2510.08539; docs/equations.md); per group from its own G rows only, vmap'd over groups;
- alignment  dmu_q = <v, g_q> for a direction v: the actual parameter change delta_theta (eta = 1,
  so Adam is covered) or the raw ascent direction -grad L. Two routes: the dot product with the gap
  vectors, and a forward-mode JVP of the vector (Phi_hat_q)_q along v (all prompts in one pass);
- cumulative  M_q = sum_k [dmu_q,k]_+ with dmu from the actual change (gapdyn.cumulative_alignment with eta = 1).
Token statistics: entropy (TRL's mean over completion tokens; split by advantage sign), WAPO's peak/valley
bins (gapdyn.theory.taxonomy.token_bin_index) and gradient mass |dl/dz_s| = |dl/dlogp_s| (1 - p_s) per probability
bin (gapdyn PROB_BIN_EDGES); |dl/dlogp_s| is read off autograd, so it equals w r |A| (0 where clipped).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch.func import functional_call, jvp, vmap

from gapdyn.theory.taxonomy import BIN_NAMES, PROB_BIN_EDGES, collision_probability, token_bin_index

from .model import check_model, completion_logprobs

__all__ = [
    "select_params",
    "mixed_groups",
    "prompt_objectives",
    "GapEstimate",
    "per_prompt_gaps",
    "per_prompt_gaps_batched",
    "GapStats",
    "streamed_gap_stats",
    "gap_matrix_bytes",
    "flat",
    "dot_alignment",
    "jvp_alignment",
    "token_stats",
    "GRADMASS_NAMES",
    "alignment_metrics",
]

GRADMASS_NAMES = tuple(
    f"gradmass/p{lo:g}-{hi:g}" for lo, hi in zip(PROB_BIN_EDGES[:-1], PROB_BIN_EDGES[1:])
)


def select_params(model, subset: str = "all") -> dict[str, torch.nn.Parameter]:
    """Named trainable parameters (``requires_grad``): "all" (alias "trainable": with a frozen base, e.g. a PEFT
    LoRA model, only the adapter weights), "lm_head", or a regex on the parameter names."""
    if not isinstance(subset, str):
        raise ValueError(f"subset must be a string ('all', 'trainable', 'lm_head' or a regex), got {subset!r}")
    check_model(model)  # e.g. load_policy's (model, tokenizer) pair
    named = {n: p for n, p in model.named_parameters() if p.requires_grad}
    if subset in ("all", "trainable"):
        out = named
    elif subset == "lm_head":
        out = {n: p for n, p in named.items() if n.startswith("lm_head")}
        if not out:  # tied embeddings: the head is the input embedding
            out = {n: p for n, p in named.items() if "embed_tokens" in n}
    else:
        try:
            rx = re.compile(subset)
        except re.error as exc:
            raise ValueError(f"subset {subset!r} is neither 'all', 'lm_head' nor a valid regex: {exc}") from exc
        out = {n: p for n, p in named.items() if rx.search(n)}
    if not out:
        raise ValueError(f"subset {subset!r} selects no trainable parameter")
    return out


def mixed_groups(rewards: torch.Tensor) -> torch.Tensor:
    """Indices b of groups whose rewards [B, G] hold both a 1 and a 0."""
    pos = (rewards > 0).any(-1)
    neg = (rewards <= 0).any(-1)
    return torch.nonzero(pos & neg).flatten()


def _contrast_weights(rewards: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """[Q, B*G] weights c with Phi_hat_q = sum_n c[q, n] log pi(o_n): +1/|O+| on winners, -1/|O-| on losers."""
    B, G = rewards.shape
    W = torch.zeros(len(groups), B * G, dtype=torch.float32)
    for q, b in enumerate(groups.tolist()):
        r = rewards[b]
        pos = (r > 0).float()
        neg = 1.0 - pos
        W[q, b * G : (b + 1) * G] = pos / pos.sum() - neg / neg.sum()
    return W


def prompt_objectives(model, ro, groups: torch.Tensor, rows: torch.Tensor | None = None):
    """Phi_hat_q for each group index in ``groups`` [Q] (differentiable)."""
    W = _contrast_weights(ro.rewards, groups).to(ro.completion_ids.device)
    if rows is None:
        rows = torch.nonzero(W.abs().sum(0) > 0).flatten()
    seq_logp = completion_logprobs(model, ro.prompt_ids[rows], ro.prompt_mask[rows], ro.completion_ids[rows],
                                   ro.completion_mask[rows]).sum(-1)  # [R]
    return W[:, rows].to(seq_logp.dtype) @ seq_logp  # [Q]


def objectives_from_logprobs(rewards: torch.Tensor, groups: torch.Tensor, seq_logp: torch.Tensor) -> torch.Tensor:
    """Phi_hat_q [Q] from already computed sequence log-probs log pi(o_n) [B*G] (e.g. the training forward's),
    so no forward of its own."""
    W = _contrast_weights(rewards, groups).to(seq_logp.device)
    return W.to(seq_logp.dtype) @ seq_logp


@dataclass
class GapEstimate:
    groups: torch.Tensor  # [Q] group (prompt) indices with mixed rewards
    gaps: torch.Tensor  # [Q, P] flattened gap estimates over the selected parameters
    phi: torch.Tensor  # [Q] Phi_hat_q at the current parameters
    n_pos: torch.Tensor  # [Q]
    n_neg: torch.Tensor  # [Q]

    @property
    def norms(self) -> torch.Tensor:
        return self.gaps.norm(dim=-1)


def flat(tensors) -> torch.Tensor:
    """Concatenate tensors (an iterable or a dict's values, in order) into one vector (float32, or float64
    when any input is float64)."""
    vals = list(tensors.values() if isinstance(tensors, dict) else tensors)
    dt = torch.float64 if any(t.dtype == torch.float64 for t in vals) else torch.float32
    return torch.cat([t.reshape(-1).to(dt) for t in vals])


def per_prompt_gaps(model, ro, params: dict[str, torch.nn.Parameter], *, vectorize: bool | None = None,
                    chunk: int = 8) -> GapEstimate:
    """g_q = grad Phi_hat_q over ``params`` for every mixed group, each from that group's own G rows only
    (Phi_hat_q depends on no other row, and every row of a group shares its padded prompt, so this is the
    same function as on the whole batch). Cost ~ one forward + backward of the mixed rows, against one
    backward through all B*G rows per prompt for :func:`per_prompt_gaps_batched` (the reference route;
    equal to float round-off, tests/test_llm_probes.py).

    vectorize=True: ``chunk`` groups at a time in one pass, torch.func.vmap over groups of
    torch.func.grad (per-group gradients of a functional_call); False: one forward + backward per group
    (torch.autograd.grad); None: vmap, and the loop where the model has no vmap rule (e.g. active dropout).
    On the benchmarked tiny Qwen (BENCHMARKS.md section 3) vmap is ~1.4-2x faster than the loop but holds
    ~3.5 MiB more per group of a chunk (the loop: ~10 MiB in all), so ``chunk`` bounds the memory.
    ``p.grad`` is left untouched.
    """
    if vectorize not in (None, True, False):
        raise ValueError(f"vectorize must be None, True or False, got {vectorize!r}")
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    groups = mixed_groups(ro.rewards)
    plist = list(params.values())
    P = sum(p.numel() for p in plist)
    if len(groups) == 0:
        z = torch.zeros(0)
        return GapEstimate(groups, torch.zeros(0, P), z, z, z)
    W = _contrast_weights(ro.rewards, groups).to(ro.completion_ids.device)
    gaps = phis = None
    if vectorize is not False:
        try:
            gaps, phis = _group_gaps_vmap(model, ro, groups, params, W, chunk)
        except (RuntimeError, NotImplementedError):
            if vectorize:
                raise
    if gaps is None:
        gaps, phis = _group_gaps_loop(model, ro, groups, plist, W)
    r = ro.rewards[groups]
    return GapEstimate(groups, gaps, phis, (r > 0).sum(-1), (r <= 0).sum(-1))


def _gap_dtype(plist) -> torch.dtype:
    return torch.float64 if any(p.dtype == torch.float64 for p in plist) else torch.float32


def _group_gaps_loop(model, ro, groups, plist, W):
    """([Q, P] gaps, [Q] Phi_hat): one forward + backward per group over its G rows."""
    G = ro.G
    gaps = torch.empty(len(groups), sum(p.numel() for p in plist), dtype=_gap_dtype(plist))
    phis = []
    for q, b in enumerate(groups.tolist()):
        rows = slice(b * G, (b + 1) * G)
        lp = completion_logprobs(model, ro.prompt_ids[rows], ro.prompt_mask[rows], ro.completion_ids[rows],
                                 ro.completion_mask[rows]).sum(-1)  # [G]
        phi = W[q, rows].to(lp.dtype) @ lp
        g = torch.autograd.grad(phi, plist, allow_unused=True)
        gaps[q] = flat([torch.zeros_like(p) if gi is None else gi for gi, p in zip(g, plist)])
        phis.append(phi.detach())
    return gaps, torch.stack(phis).cpu()


def _group_gaps_vmap(model, ro, groups, params, W, chunk):
    """([Q, P] gaps, [Q] Phi_hat): torch.func.vmap over groups of grad_and_value(Phi_hat of one group)."""
    from torch.func import grad_and_value

    G = ro.G
    keys = list(params)
    plist = list(params.values())
    primals = {k: p.detach() for k, p in params.items()}
    idx = torch.stack([torch.arange(b * G, (b + 1) * G) for b in groups.tolist()]).to(W.device)  # [Q, G]
    w = torch.gather(W, 1, idx)  # [Q, G]: group q's contrast weights on its own rows

    def phi(pd, wq, a, b, c, d):
        lp = completion_logprobs(_Functional(model, pd), a, b, c, d).sum(-1)  # [G]
        return wq.to(lp.dtype) @ lp

    gaps = torch.empty(len(groups), sum(p.numel() for p in plist), dtype=_gap_dtype(plist))
    phis = []
    f = vmap(grad_and_value(phi), in_dims=(None, 0, 0, 0, 0, 0))
    for s in range(0, len(groups), chunk):
        ix = idx[s:s + chunk]
        g, v = f(primals, w[s:s + chunk], ro.prompt_ids[ix], ro.prompt_mask[ix], ro.completion_ids[ix],
                 ro.completion_mask[ix])
        n = len(ix)
        gaps[s:s + n] = torch.cat([g[k].detach().reshape(n, -1).to(gaps.dtype) for k in keys], 1).cpu()
        phis.append(v.detach())
    return gaps, torch.cat(phis).cpu()


class _Functional(torch.nn.Module):
    """``model`` run with the parameter values ``pd`` (torch.func.functional_call; the others: the module's),
    callable like the model (completion_logprobs takes it) and with the model's ``dtype``."""

    def __init__(self, model, pd: dict, *, tie_weights: bool = True):
        super().__init__()
        self._model = (model,)  # a tuple: not registered as a submodule
        self.pd = pd
        self.tie_weights = tie_weights
        self.dtype = getattr(model, "dtype", None)

    def forward(self, **kw):
        return functional_call(self._model[0], self.pd, args=(), kwargs=kw, strict=False, tie_weights=self.tie_weights)


def per_prompt_gaps_batched(model, ro, params: dict[str, torch.nn.Parameter]) -> GapEstimate:
    """Reference route for :func:`per_prompt_gaps`: one forward over all mixed rows, then one backward per
    prompt through that whole graph (each walks all rows though only G carry gradient)."""
    groups = mixed_groups(ro.rewards)
    P = sum(p.numel() for p in params.values())
    if len(groups) == 0:
        z = torch.zeros(0)
        return GapEstimate(groups, torch.zeros(0, P), z, z, z)
    phi = prompt_objectives(model, ro, groups)
    plist = list(params.values())
    gaps = []
    for q in range(len(groups)):
        g = torch.autograd.grad(phi[q], plist, retain_graph=q < len(groups) - 1, allow_unused=True)
        gaps.append(flat([torch.zeros_like(p) if gi is None else gi for gi, p in zip(g, plist)]))
    r = ro.rewards[groups]
    return GapEstimate(groups, torch.stack(gaps).cpu(), phi.detach().cpu(), (r > 0).sum(-1), (r <= 0).sum(-1))


def gap_matrix_bytes(n_prompts: int, params: dict[str, torch.Tensor]) -> int:
    """Bytes of the [n_prompts, P] gap matrix :func:`per_prompt_gaps` would hold over ``params``."""
    plist = list(params.values())
    return int(n_prompts) * sum(p.numel() for p in plist) * _gap_dtype(plist).itemsize


@dataclass
class GapStats:
    """What :func:`streamed_gap_stats` keeps of the gaps g_q: no [Q, P] matrix, only per-prompt scalars."""

    groups: torch.Tensor  # [Q] mixed group indices
    phi: torch.Tensor  # [Q] Phi_hat_q
    n_pos: torch.Tensor  # [Q]
    n_neg: torch.Tensor  # [Q]
    norms: torch.Tensor  # [Q] ||g_q||
    dots: dict  # direction name -> [Q] <v, g_q>
    mean_gap: dict | None  # name -> mean_q g_q (parameter-shaped), when asked for


def streamed_gap_stats(model, ro, params: dict[str, torch.Tensor], directions: dict | None = None, *,
                       at: dict[str, torch.Tensor] | None = None, mean_gap: bool = False) -> GapStats:
    """The per-prompt scalars of :func:`per_prompt_gaps` + :func:`dot_alignment` without the [Q, P] matrix:
    one group at a time, g_q = grad Phi_hat_q (one forward + backward over its G rows), reduced at once to
    ||g_q|| and <v, g_q> for each direction v (``directions``: name -> {parameter name -> tensor}, e.g. the
    update delta and -grad L), then dropped. Peak memory: one gradient and one group's activations, whatever Q.

    ``at``: parameter values (name -> tensor, every parameter or a subset) at which to evaluate the gaps (e.g. a
    snapshot theta_k after the optimizer already moved the module); default: the module's. ``params`` names the
    differentiated parameters. Each parameter's dot is taken in the gap dtype, the sum over parameters
    in float64.
    """
    directions = directions or {}
    for d, v in directions.items():
        missing = [n for n in params if n not in v]
        if missing:
            raise ValueError(f"directions[{d!r}] lacks parameters {missing[:3]}")
    groups = mixed_groups(ro.rewards)
    Q = len(groups)
    norms = torch.zeros(Q, dtype=torch.float64)
    dots = {d: torch.zeros(Q, dtype=torch.float64) for d in directions}
    dt = _gap_dtype(list(params.values()))
    acc = {n: torch.zeros_like(p, dtype=dt) for n, p in params.items()} if mean_gap else None
    r = ro.rewards[groups]
    if Q == 0:
        z = torch.zeros(0)
        return GapStats(groups, z, z, z, norms, dots, acc)
    W = _contrast_weights(ro.rewards, groups).to(ro.completion_ids.device)
    names = list(params)
    own = dict(model.named_parameters())  # one name per tensor (tied weights: functional_call ties the others)
    base = {} if at is None else {k: v.detach() for k, v in at.items() if k in own}
    G = ro.G
    phis = []
    for q, b in enumerate(groups.tolist()):
        leaves = {n: (base[n] if n in base else params[n]).detach().requires_grad_(True) for n in names}
        fmodel = _Functional(model, {**base, **leaves})
        rows = slice(b * G, (b + 1) * G)
        lp = completion_logprobs(fmodel, ro.prompt_ids[rows], ro.prompt_mask[rows], ro.completion_ids[rows],
                                 ro.completion_mask[rows]).sum(-1)
        phi = W[q, rows].to(lp.dtype) @ lp
        grads = torch.autograd.grad(phi, [leaves[n] for n in names], allow_unused=True)
        sq = 0.0
        for n, g in zip(names, grads):
            if g is None:
                continue
            g = g.detach().reshape(-1)
            sq += float(torch.dot(g, g))
            for d, v in directions.items():
                dots[d][q] += float(torch.dot(g, v[n].detach().reshape(-1).to(g.device, g.dtype)))
            if acc is not None:
                acc[n] += g.view(acc[n].shape).to(acc[n].dtype) / Q
        norms[q] = sq ** 0.5
        phis.append(phi.detach())
        del grads, leaves, fmodel
    return GapStats(groups, torch.stack(phis).cpu(), (r > 0).sum(-1), (r <= 0).sum(-1), norms, dots, acc)


def dot_alignment(gaps: torch.Tensor, direction: torch.Tensor) -> torch.Tensor:
    """dmu_q = <direction, g_q> (reference route), [Q]."""
    return gaps @ direction.to(gaps.dtype).cpu()


def jvp_alignment(model, ro, groups: torch.Tensor, params: dict[str, torch.Tensor],
                  tangents: dict[str, torch.Tensor], *, base: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
    """dmu_q = d/ds Phi_hat_q(theta + s v) at s = 0 for all q in one forward-mode pass (torch.func.jvp).

    ``params`` are the (detached) values theta of the selected parameters, ``tangents`` v on the same keys;
    the other parameters take their values from ``base`` (name -> tensor, e.g. a snapshot of theta_k), else
    the module's. ``tangents`` may also be a list of K such dicts: then all K directions go through one
    forward-mode pass (torch.func.vmap over the JVP) and the result is [K, Q].

    Equals <v, g_q> with g_q from backward (:func:`per_prompt_gaps`), tied embeddings included: each name a
    tied weight goes by gets its own forward-mode input, and only the input-embedding use drops the
    ``padding_idx`` row (backward gives that use an exact zero there; the output layer's use keeps it).
    """
    many = isinstance(tangents, (list, tuple))
    if len(groups) == 0:
        return torch.zeros(len(tangents), 0) if many else torch.zeros(0)
    W = _contrast_weights(ro.rewards, groups).to(ro.completion_ids.device)
    rows = torch.nonzero(W.abs().sum(0) > 0).flatten()
    args = (ro.prompt_ids[rows], ro.prompt_mask[rows], ro.completion_ids[rows], ro.completion_mask[rows])
    alias = _tied_names(model)
    modules = dict(model.named_modules())
    slots = [(k, a) for k in params for a in alias.get(k, (k,))]  # (parameter, each name it goes by)
    const = {}
    if base is not None:  # every name of every other parameter, at its base value
        const = {a: base[k] for k, names in alias.items() if k not in params and k in base for a in names}

    def f(*vals):
        pd = {**const, **{a: v for (_, a), v in zip(slots, vals)}}
        lp = completion_logprobs(_Functional(model, pd, tie_weights=False), *args).sum(-1)
        return W[:, rows].to(lp.dtype) @ lp

    primals = tuple(params[k].detach() for k, _ in slots)

    def tan(t, k, a):
        return _input_side_tangent(modules, a, t[k].detach().to(params[k].dtype))

    if not many:
        _, out = jvp(f, primals, tuple(tan(tangents, k, a) for k, a in slots))
        return out.detach().cpu()
    stacked = tuple(torch.stack([tan(t, k, a) for t in tangents]) for k, a in slots)
    out = vmap(lambda *tv: jvp(f, primals, tv)[1])(*stacked)  # [K, Q]
    return out.detach().cpu()


def _tied_names(model) -> dict[str, tuple[str, ...]]:
    """Each parameter's name (as ``named_parameters`` gives it) -> every name it goes by (tied weights)."""
    by_tensor: dict[int, list[str]] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        by_tensor.setdefault(id(p), []).append(n)
    return {names[0]: tuple(names) for names in by_tensor.values()}


def _input_side_tangent(modules: dict, name: str, tangent: torch.Tensor) -> torch.Tensor:
    """The tangent for the use of a weight under ``name``: an nn.Embedding's padding_idx row is zeroed (backward
    gives that row an exact zero gradient, torch's padding_idx convention; forward mode would not), so both
    routes differentiate the same function; any other use keeps the whole tangent."""
    mod = modules.get(name.rsplit(".", 1)[0])
    if isinstance(mod, torch.nn.Embedding) and mod.padding_idx is not None:
        tangent = tangent.clone()
        tangent[mod.padding_idx] = 0
    return tangent


def token_stats(logp_all, completion_ids, mask, advantages, dloss_dlogp=None) -> dict:
    """Entropy (mean and split by advantage sign), WAPO bin counts and gradient mass per probability bin.

    logp_all [N, T, V] log-probs at the scored positions, completion_ids/mask [N, T], advantages [N],
    dloss_dlogp [N, T] = dL/dlogp_t (its |.| is w r |A|, 0 where clipped), optional.
    """
    with torch.no_grad():
        m = mask > 0
        p_all = logp_all.exp()
        ent = -(p_all * logp_all).sum(-1)  # [N, T]
        A = advantages.view(-1, 1).expand_as(mask)
        out = {"entropy": float(ent[m].mean()) if m.any() else float("nan")}
        for nm, sel in (("entropy/pos_adv", A > 0), ("entropy/neg_adv", A < 0), ("entropy/zero_adv", A == 0)):
            s = m & sel
            out[nm] = float(ent[s].mean()) if s.any() else float("nan")
        p_s = p_all.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)  # [N, T]
        C = collision_probability(p_all)  # [N, T]
        bins = token_bin_index(p_s, C, A)
        kept = m if dloss_dlogp is None else m & (dloss_dlogp.abs() > 0)
        for i, name in enumerate(BIN_NAMES):
            out[f"taxonomy/{name}"] = int(((bins == i) & m).sum())
            out[f"taxonomy/{name}_kept"] = int(((bins == i) & kept).sum())
        if dloss_dlogp is not None:
            mass = dloss_dlogp.abs() * (1 - p_s) * m
            edges = list(PROB_BIN_EDGES)
            for j, name in enumerate(GRADMASS_NAMES):
                hi_ok = p_s <= edges[j + 1] if j == len(GRADMASS_NAMES) - 1 else p_s < edges[j + 1]
                out[name] = float(mass[(p_s >= edges[j]) & hi_ok].sum())
        return out


def alignment_metrics(prefix: str, dmu_update, dmu_grad=None, gaps=None, update=None, grad_dir=None, *,
                      norms=None) -> dict:
    """Summary scalars of per-prompt alignments (mean, positive fraction) and, with gap vectors (or their
    ``norms`` [Q], e.g. from :func:`streamed_gap_stats`), norms and cosines; ``update`` / ``grad_dir``: the
    directions (flat vectors) or just their norms (floats)."""
    out = {}
    if dmu_update is None or len(dmu_update) == 0:
        return {f"{prefix}/n_prompts": 0}
    out[f"{prefix}/n_prompts"] = int(len(dmu_update))
    out[f"{prefix}/dmu_update_mean"] = float(dmu_update.mean())
    out[f"{prefix}/dmu_update_pos_frac"] = float((dmu_update > 0).float().mean())
    out[f"{prefix}/dmu_update_pos_sum"] = float(dmu_update.clamp(min=0).sum())
    out[f"{prefix}/dmu_update_neg_sum"] = float(dmu_update.clamp(max=0).sum())
    if dmu_grad is not None:
        out[f"{prefix}/dmu_grad_mean"] = float(dmu_grad.mean())
    if gaps is not None or norms is not None:
        n = gaps.norm(dim=-1) if gaps is not None else norms.to(dmu_update.dtype)
        out[f"{prefix}/norm_mean"] = float(n.mean())
        for nm, v, d in (("update", update, dmu_update), ("grad", grad_dir, dmu_grad)):
            if v is not None and d is not None:
                den = n * (v.norm() if torch.is_tensor(v) else float(v))
                cos = torch.where(den > 0, d / den.clamp(min=1e-30), torch.zeros_like(d))
                out[f"{prefix}/cos_{nm}_mean"] = float(cos.mean())
    return out
