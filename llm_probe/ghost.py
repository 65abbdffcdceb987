"""Per-prompt Gradient-Gap inner products from one forward + one backward, no per-prompt gradient vectors.

For the mixed groups q of a rollout (llm_probe.probes), g_q = grad Phi_hat_q with Phi_hat_q = sum_n c_qn log pi(o_n),
c_qn = +1/|O+_q| on the group's winners and -1/|O-_q| on its losers (the weights of llm_probe.probes, so the same
g_q as :func:`llm_probe.probes.per_prompt_gaps`). Every row n belongs to one group, so ONE backward of
S = sum_q Phi_hat_q folds each group's weights into the output gradients: at every token t of row n, the gradient
d_t of a layer's output is c_qn d(log pi(o_n))/dz_t (rows never see each other). For a linear layer z = W a + b
over the tokens t of group q, the group's weight gradient is G_q = sum_{t in q} d_t a_t^T, hence (Wang et al.,
ICLR 2025, "Data Shapley in One Training Run", the ghost dot product):

    <G_q, G_r> = sum_{t in q, s in r} (a_t . a_s)(d_t . d_s),      <G_q, V> = sum_{t in q} d_t^T V a_t.

Per parameter the cheaper exact route is taken (``route="auto"``): ``ghost`` (the token-pair sums; cost
N^2 (d_in + d_out) for the N tokens with a non-zero output gradient) when N (d_in + d_out) < d_in d_out, else
``grad``: the per-group block D_q^T A_q of that parameter, rows (e.g. the LM head's vocabulary) in chunks of at
most ``chunk_bytes``, dropped after its Gram and dot products. An nn.Embedding's gradient is the scatter of d_t
into row id_t (its ``padding_idx`` row gets none, as in torch); a tied embedding / LM-head weight has the sum of
both uses' blocks. Biases: sum_{t in q} d_t. Any other module with parameters of its own (RMSNorm weights) gets
its small per-group gradients from torch.func (vmap over groups of the gradient of <d, module(x)>), which needs
the module to act on each row by itself.

Exactness: this backward is the probe's own, so the numbers are exact for any training loss (float rounding).
Folding the weights into the *training* backward instead (no backward of the probe's own) is exact only where
that backward's output gradient on every row is a per-row multiple of d log pi(o_n)/dz: dL/dlog pi_{n,t} the
same for all tokens t of row n (the linear loss types at num_iterations mu = 1, where the ratio is 1 and no clip
acts, and beta = 0: no KL term) and, where a group's rows share their prompt's forward (llm_probe.sampler), the
same ratio c_qn / (dL/dlog pi_n) on the group's rows; otherwise the probe needs a backward of its own (this
module's). Directions known only later (the update theta_{k+1} - theta_k) are dotted by :meth:`GhostGaps.dot`
from what ``keep`` holds: "captures" (the layer inputs and output gradients, N (d_in + d_out) numbers a layer:
one matmul a layer per direction, no forward), "blocks" (the per-group gradients of every parameter, Q copies of
the parameters: a dot product per direction) or "auto": per parameter the smaller of the two where the
per-group-gradient route formed the block anyway, the captures where the ghost route ran. Captures a parameter
does not hold are dropped as soon as its contribution is summed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.func import functional_call, grad, vmap

from .model import completion_logprobs, eval_mode
from .probes import _contrast_weights, mixed_groups, select_params

__all__ = ["GhostGaps", "ghost_gaps", "GhostProbe", "ROUTES", "KEEP"]

ROUTES = ("auto", "ghost", "grad")
KEEP = (None, "captures", "blocks", "auto")
DEFAULT_CHUNK_BYTES = 2**26  # largest per-group block [Q, rows, ...] held at once (64 MiB)


@dataclass
class _Use:
    """One use of a parameter in the forward: its module kind, the layer input and its output gradient."""

    kind: str  # "weight" (nn.Linear), "bias" (nn.Linear), "embed" (nn.Embedding), "module" (anything else)
    module: torch.nn.Module
    a: torch.Tensor | None  # [Q, M, d_in] inputs (weight), [Q, M] token ids (embed); None otherwise
    d: torch.Tensor | None  # [Q, M, d_out] output gradients (weight, bias, embed)
    per_group: torch.Tensor | None = None  # [Q, numel] own per-group gradient ("module" kind)


@dataclass
class GhostGaps:
    """Per-prompt Gradient-Gap inner products of the mixed groups (module doc). ``gram[q, r] = <g_q, g_r>``."""

    groups: torch.Tensor  # [Q] mixed group indices
    phi: torch.Tensor  # [Q] Phi_hat_q
    n_pos: torch.Tensor  # [Q]
    n_neg: torch.Tensor  # [Q]
    gram: torch.Tensor  # [Q, Q] float64
    dots: dict  # direction name -> [Q] float64 <v, g_q>
    routes: dict  # parameter name -> "ghost" | "grad" | "module"
    _held: dict | None = field(default=None, repr=False)  # with keep: name -> [_Use] or [Q, numel] per-group grad

    @property
    def norms(self) -> torch.Tensor:
        """||g_q|| = sqrt(gram[q, q]), [Q] float64."""
        return self.gram.diagonal().clamp(min=0).sqrt()

    def cosines(self) -> torch.Tensor:
        """cos(g_q, g_r) [Q, Q] (0 where a norm is 0)."""
        n = self.norms
        den = n[:, None] * n[None, :]
        return torch.where(den > 0, self.gram / den.clamp(min=1e-300), torch.zeros_like(self.gram))

    def dot(self, direction: dict, minus: dict | None = None) -> torch.Tensor:
        """<v, g_q> [Q] float64 for a direction v (parameter name -> tensor) from what ``keep`` held;
        with ``minus``, v = direction - minus formed one parameter at a time (e.g. the update: the module's
        parameters after the step minus a snapshot of theta_k, without a copy of the whole update)."""
        if self._held is None:
            raise RuntimeError("GhostGaps.dot needs ghost_gaps(..., keep='captures', 'blocks' or 'auto') and no "
                               "release()")
        out = torch.zeros(len(self.groups), dtype=torch.float64)
        for n, kept in self._held.items():
            if n not in direction or (minus is not None and n not in minus):
                raise ValueError(f"direction lacks parameter {n!r}")
            v = direction[n].detach() if minus is None else direction[n].detach() - minus[n].detach()
            if torch.is_tensor(kept):
                out += (kept @ v.reshape(-1).to(kept.device, kept.dtype)).to(torch.float64).cpu()
            else:
                for u in kept:
                    out += _use_dot(u, v)
        return out

    def held_bytes(self) -> int:
        """Bytes of the distinct tensor storages ``keep`` holds (0 after :meth:`release`)."""
        return _storage_bytes(t for kept in (self._held or {}).values() for t in _tensors(kept))

    def release(self) -> None:
        """Drop what ``keep`` held."""
        self._held = None


def ghost_gaps(model, ro, params="all", directions: dict | None = None, *, keep: str | None = None,
               route: str = "auto", chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> GhostGaps:
    """Gram matrix <g_q, g_r>, norms, Phi_hat_q and <v, g_q> for each of ``directions`` (name -> {parameter
    name -> tensor}, e.g. {"grad": -grad L}) over ``params`` (a llm_probe.probes.select_params subset or a name
    -> parameter dict), from one forward + backward over the mixed rows (module doc). ``keep``: None, "captures",
    "blocks" or "auto", what to hold for :meth:`GhostGaps.dot` (e.g. the update, after ``optimizer.step()``;
    module doc).
    ``p.grad`` is left untouched; the forward runs in eval mode (no dropout)."""
    if keep not in KEEP:
        raise ValueError(f"keep must be one of {KEEP}, got {keep!r}")
    if route not in ROUTES:
        raise ValueError(f"route must be one of {ROUTES}, got {route!r}")
    if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be an integer >= 1, got {chunk_bytes!r}")
    params = select_params(model, params) if isinstance(params, str) else dict(params)
    directions = directions or {}
    for name, v in directions.items():
        missing = [n for n in params if n not in v]
        if missing:
            raise ValueError(f"directions[{name!r}] lacks parameters {missing[:3]}")
    groups = mixed_groups(ro.rewards)
    Q, G = len(groups), ro.G
    r = ro.rewards[groups]
    n_pos, n_neg = (r > 0).sum(-1), (r <= 0).sum(-1)
    if Q == 0:
        z = torch.zeros(0, dtype=torch.float64)
        return GhostGaps(groups, z, n_pos, n_neg, torch.zeros(0, 0, dtype=torch.float64),
                         {k: z for k in directions}, {}, {} if keep else None)
    rows = torch.cat([torch.arange(b * G, (b + 1) * G) for b in groups.tolist()]).to(ro.completion_ids.device)
    c = _contrast_weights(ro.rewards, groups).to(ro.completion_ids.device)[:, rows].sum(0)  # [Q*G]: one group a row
    with eval_mode(model):
        phi, uses = _capture(model, ro, rows, c, params, Q)
    gram = torch.zeros(Q, Q, dtype=torch.float64)
    dots = {k: torch.zeros(Q, dtype=torch.float64) for k in directions}
    routes, held = {}, {} if keep else None
    for n in list(uses):
        us = uses.pop(n)  # this parameter's captures: dropped after its sums unless held
        routes[n], blk = _accumulate(n, params[n], us, directions, gram, dots, route, chunk_bytes, keep)
        if held is not None:
            held[n] = us if blk is None else blk
        del us
    return GhostGaps(groups, phi, n_pos, n_neg, gram, dots, routes, held)


def _capture(model, ro, rows, c, params, Q):
    """Forward over ``rows`` with hooks on every module owning a selected parameter, backward of
    S = sum_n c_n log pi(o_n) to the hooked outputs only (no weight gradient is formed). Returns (Phi_hat [Q],
    parameter name -> [_Use])."""
    owner = {id(p): n for n, p in params.items()}
    uses: dict[str, list] = {n: [] for n in params}
    pending = []  # (output tensor, [uses reading its gradient])
    handles = []

    def hook(mod, args, out):
        if not torch.is_tensor(out) or not out.requires_grad:
            return
        mine = {k: p for k, p in mod.named_parameters(recurse=False) if id(p) in owner}
        if not mine:
            return
        x = args[0] if args else None
        if isinstance(mod, torch.nn.Linear):
            got = []
            for k, p in mine.items():
                u = _Use("weight", mod, x.detach(), None) if k == "weight" else _Use("bias", mod, None, None)
                uses[owner[id(p)]].append(u)
                got.append(u)
        elif isinstance(mod, torch.nn.Embedding):
            got = [_Use("embed", mod, x.detach(), None)]
            uses[owner[id(mod.weight)]].append(got[0])
        else:
            if len(args) != 1 or not torch.is_tensor(x):
                raise ValueError(f"ghost_gaps: module {type(mod).__name__} with parameters takes {len(args)} "
                                 "inputs; only one tensor input is supported")
            got = [_Use("module", mod, x.detach(), None)]
            for k, p in mine.items():
                uses[owner[id(p)]].append((got[0], k))
        pending.append((out, got))

    for mod in model.modules():
        if any(id(p) in owner for p in mod.parameters(recurse=False)):
            handles.append(mod.register_forward_hook(hook))
    try:
        lp = completion_logprobs(model, ro.prompt_ids[rows], ro.prompt_mask[rows], ro.completion_ids[rows],
                                 ro.completion_mask[rows]).sum(-1)  # [Q*G]
    finally:
        for h in handles:
            h.remove()
    S = (c.to(lp.dtype) * lp).sum()
    ds = torch.autograd.grad(S, [o for o, _ in pending], allow_unused=True) if pending else []
    for (o, got), d in zip(pending, ds):
        d = torch.zeros_like(o) if d is None else d.detach()
        for u in got:
            if u.kind == "module":  # rows grouped: [Q, G, ...]
                u.a, u.d = u.a.reshape(Q, -1, *u.a.shape[1:]), d.reshape(Q, -1, *d.shape[1:])
            else:  # tokens grouped: [Q, M, features]
                u.d = d.reshape(Q, -1, d.shape[-1])
                if u.kind == "weight":
                    u.a = u.a.reshape(Q, -1, u.a.shape[-1])
                elif u.kind == "embed":
                    u.a = u.a.reshape(Q, -1)
    out = {}
    for n, us in uses.items():
        if not us:
            raise ValueError(f"ghost_gaps: parameter {n!r} is used by no hooked module call in the forward")
        flat_uses = []
        for u in us:
            if isinstance(u, tuple):  # a "module" use: its own per-group gradient of this parameter
                u, k = u
                flat_uses.append(_Use("module", u.module, None, None, _module_grads(u, k, Q)))
            else:
                flat_uses.append(u)
        out[n] = flat_uses
    phi = (c.to(lp.dtype) * lp).detach().view(Q, -1).sum(-1).cpu()
    return phi, out


def _module_grads(u: _Use, key: str, Q: int) -> torch.Tensor:
    """[Q, numel] per-group gradient of sum_{t in q} <d_t, module(x_t)> w.r.t. the module's parameter ``key``
    (torch.func: vmap over groups of grad; the module must act on each row by itself)."""
    own = {k: p.detach() for k, p in u.module.named_parameters(recurse=False)}

    def f(w, x, d):
        return (functional_call(u.module, {**own, key: w}, (x,)) * d).sum()

    try:
        g = vmap(grad(f), in_dims=(None, 0, 0))(own[key], u.a, u.d)
    except (RuntimeError, NotImplementedError) as exc:
        raise ValueError(f"ghost_gaps: no per-group gradient for {type(u.module).__name__}.{key} "
                         f"({type(exc).__name__})") from exc
    return g.reshape(Q, -1)


def _use_dot(u: _Use, v: torch.Tensor) -> torch.Tensor:
    """<G_q, v> [Q] float64 of one use: sum_t d_t^T V a_t (weight), sum_t d_t . b (bias), sum_t d_t . V[id_t]
    (embedding, padding_idx excluded), per_group @ v (module)."""
    if u.kind == "module":
        return (u.per_group.to(torch.float64) @ v.reshape(-1).to(u.per_group.device, torch.float64)).cpu()
    v = v.to(u.d.device, u.d.dtype)
    if u.kind == "weight":
        return (torch.matmul(u.a.to(u.d.dtype), v.T) * u.d).sum((1, 2)).to(torch.float64).cpu()
    if u.kind == "bias":
        return (u.d * v).sum((1, 2)).to(torch.float64).cpu()
    rows = v[u.a]  # [Q, M, d]
    if u.module.padding_idx is not None:
        rows = rows * (u.a != u.module.padding_idx).unsqueeze(-1).to(rows.dtype)
    return (rows * u.d).sum((1, 2)).to(torch.float64).cpu()


def _accumulate(name, p, uses, directions, gram, dots, route, chunk_bytes, keep=None):
    """Add one parameter's contribution to ``gram`` and ``dots``; returns (the route taken, its per-group gradient
    [Q, numel] when ``keep`` holds it: "blocks", or "auto" where it is no larger than the captures, else None)."""
    if len(uses) == 1 and uses[0].kind == "weight" and route != "grad" and keep != "blocks":
        u = uses[0]
        live = u.d.abs().amax(-1) > 0  # [Q, M] tokens with a non-zero output gradient
        N = int(live.sum())
        d_out, d_in = p.shape
        if route == "ghost" or N * (d_in + d_out) < d_in * d_out:
            _ghost_gram(u, live, gram, chunk_bytes)
            for k, v in directions.items():
                dots[k] += _use_dot(u, v[name].detach())
            return "ghost", None
    Q = gram.shape[0]
    hold = keep == "blocks" or (keep == "auto" and Q * p.numel() * p.element_size()
                                <= _storage_bytes(t for u in uses for t in _tensors([u])))
    per_row = max(1, p[0].numel()) * Q * p.element_size()
    step = max(1, chunk_bytes // per_row)
    vs = {k: v[name].detach().to(p.device, p.dtype) for k, v in directions.items()}
    parts = []
    for r0 in range(0, p.shape[0] if p.dim() else 1, step):
        r1 = min(r0 + step, p.shape[0]) if p.dim() else 1
        blk = sum(_block(u, p, r0, r1) for u in uses).reshape(Q, -1)
        gram += (blk @ blk.T).to(torch.float64).cpu()
        if hold:
            parts.append(blk)
        for k, v in vs.items():
            vk = (v[r0:r1] if p.dim() else v).reshape(-1)
            dots[k] += (blk @ vk).to(torch.float64).cpu()
    kept = (parts[0] if len(parts) == 1 else torch.cat(parts, 1)) if hold else None
    return ("module" if all(u.kind == "module" for u in uses) else "grad"), kept


def _tensors(kept):
    """The tensors a held entry refers to: a per-group gradient, or the captures of a list of uses."""
    if torch.is_tensor(kept):
        return [kept]
    return [t for u in kept for t in (u.a, u.d, u.per_group) if t is not None]


def _storage_bytes(tensors) -> int:
    """Bytes of the distinct storages under ``tensors``."""
    seen = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(seen.values())


def _block(u: _Use, p, r0: int, r1: int) -> torch.Tensor:
    """[Q, r1 - r0, ...] per-group gradient of the parameter's rows r0..r1-1 from one use."""
    Q = u.d.shape[0] if u.d is not None else u.per_group.shape[0]
    if u.kind == "weight":
        return torch.bmm(u.d[..., r0:r1].transpose(1, 2), u.a.to(u.d.dtype))
    if u.kind == "bias":
        return u.d[..., r0:r1].sum(1)
    if u.kind == "embed":
        dim = u.d.shape[-1]
        ids = u.a
        keep = (ids >= r0) & (ids < r1)
        if u.module.padding_idx is not None:
            keep &= ids != u.module.padding_idx
        slot = (torch.arange(Q, device=ids.device)[:, None] * (r1 - r0) + ids - r0)[keep]
        out = torch.zeros(Q * (r1 - r0), dim, dtype=u.d.dtype, device=u.d.device)
        out.index_add_(0, slot, u.d[keep])
        return out.view(Q, r1 - r0, dim)
    return u.per_group.view(Q, *p.shape)[:, r0:r1] if p.dim() else u.per_group.view(Q)


def _ghost_gram(u: _Use, live, gram, chunk_bytes: int) -> None:
    """gram[q, r] += sum_{t in q, s in r} (a_t . a_s)(d_t . d_s) over the live tokens, in row blocks."""
    Q = live.shape[0]
    grp = torch.arange(Q, device=live.device)[:, None].expand_as(live)[live]  # [N]
    A = u.a.to(u.d.dtype)[live]
    D = u.d[live]
    N = len(grp)
    if N == 0:
        return
    onehot = torch.nn.functional.one_hot(grp, Q).to(torch.float64)  # [N, Q]
    step = max(1, chunk_bytes // (2 * N * D.element_size()))
    for i in range(0, N, step):
        K = (A[i:i + step] @ A.T) * (D[i:i + step] @ D.T)  # [n, N]
        gram += (onehot[i:i + step].T @ K.to(torch.float64) @ onehot).cpu()


class GhostProbe:
    """The ``gap/*`` metrics of :class:`llm_probe.gap_probe.GapProbe` (dot route: dmu_update, dmu_grad, norms,
    cosines, dphi, M_batch) by :func:`ghost_gaps`, behind the step hook of llm_probe.step_hook: ``before`` at
    theta_k (Gram matrix, <-grad L, g_q>, kept ``keep`` for the update), ``after`` at theta_{k+1}
    (<theta_{k+1} - theta_k, g_q> one parameter at a time, Phi_hat's realised change by a no-grad forward).
    ``keep=None`` holds nothing across the optimizer step: <theta_{k+1} - theta_k, g_q> is then one forward-mode
    pass at theta_k along the update (:func:`llm_probe.probes.jvp_alignment`; theta_k from the host's
    ``Step.theta_k``, else copied), extra memory one parameter-sized copy (the update) and the pass's activations.
    Stage 1: no fixed probe prompts and no DDP shard (each refused in one line)."""

    def __init__(self, model, params: str = "all", *, n_probe_prompts: int = 0, keep: str | None = "auto",
                 route: str = "auto"):
        import numpy as np

        if n_probe_prompts:
            raise ValueError("GhostProbe: fixed probe prompts are not supported yet (use n_probe_prompts=0)")
        if keep not in KEEP:
            raise ValueError(f"keep must be one of {KEEP}, got {keep!r}")
        if route not in ROUTES:
            raise ValueError(f"route must be one of {ROUTES}, got {route!r}")
        self.model, self.keep, self.route = model, keep, route
        self.params = select_params(model, params)
        self.M_batch = 0.0
        self.M_probe = np.zeros(0)
        self._pending = None
        self._reused = (None, None)  # what the host handed over for the pending step (reuse)

    @property
    def pending(self) -> bool:
        return self._pending is not None

    def before(self, step) -> dict:
        from .step_hook import check_step

        step = check_step(step, "GhostProbe")
        if step.shard_index is not None or step.probe_ro is not None:
            raise ValueError("GhostProbe: DDP shards and probe prompts are not supported yet")
        grads = {n: p.grad.detach() if p.grad is not None else torch.zeros_like(p) for n, p in self.params.items()}
        gg = ghost_gaps(self.model, step.ro, self.params, {"grad": grads}, keep=self.keep, route=self.route)
        theta_k = step.theta_k
        if theta_k is None and self.keep is None:  # the JVP runs at theta_k: every moving parameter copied
            theta_k = {n: p.detach().clone() if p.requires_grad else p.detach()
                       for n, p in self.model.named_parameters()}
        theta_k = theta_k or {}
        old = {n: theta_k[n] if n in theta_k else p.detach().clone() for n, p in self.params.items()}
        grad_norm = sum(float(torch.linalg.vector_norm(g)) ** 2 for g in grads.values()) ** 0.5
        self._pending = (step.ro, gg, old, grad_norm, theta_k if self.keep is None else None)
        self._reused = (None, None)
        return {}

    def cancel(self) -> None:
        self._pending, self._reused = None, (None, None)

    def reuse(self, x: torch.Tensor | None = None, seq_logp_next: torch.Tensor | None = None) -> None:
        """Hand the pending step what the host already computed, for the next :meth:`after` (between the optimizer
        step and ``after``), for the rows of the ``before`` batch (prompt-major, [B*G]): ``x``, the first-order
        change of each completion's log-prob along the update theta_{k+1} - theta_k over exactly this probe's
        parameters (the headroom meter's forward-mode pass, llm_probe.headroom.step_headroom_x), so
        <theta_{k+1} - theta_k, g_q> = sum_n c_qn x_n needs neither what ``keep`` holds nor a pass of its own;
        ``seq_logp_next``, log pi_{k+1}(o_n) from a no-grad forward at theta_{k+1} (the ``warn/*`` forward,
        llm_probe.warning.forward_at_current), so Phi_hat_q(theta_{k+1}) = sum_n c_qn log pi_{k+1}(o_n) needs no
        forward of its own."""
        if self._pending is None:
            raise RuntimeError("GhostProbe.reuse() called without a matching before()")
        N = self._pending[0].rewards.numel()
        for name, v in (("x", x), ("seq_logp_next", seq_logp_next)):
            if v is not None and tuple(v.shape) != (N,):
                raise ValueError(f"GhostProbe.reuse: {name} must be [B*G] = [{N}], got {tuple(v.shape)}")
        self._reused = (x, seq_logp_next)

    def after(self):
        from .gap_probe import ProbeResult
        from .probes import alignment_metrics, jvp_alignment, objectives_from_logprobs, prompt_objectives

        if self._pending is None:
            raise RuntimeError("GhostProbe.after() called without a matching before()")
        (ro, gg, old, grad_norm, theta_k), self._pending = self._pending, None
        (x, seq_logp_next), self._reused = self._reused, (None, None)
        upd = sum(float(torch.linalg.vector_norm(p.detach() - old[n])) ** 2 for n, p in self.params.items()) ** 0.5
        Q = len(gg.groups)
        if not Q:
            dmu_u = torch.zeros(0, dtype=torch.float64)
        elif x is not None:  # the host's x_n along the update: sum_n c_qn x_n
            dmu_u = objectives_from_logprobs(ro.rewards, gg.groups, x.detach().cpu().to(torch.float64))
        elif theta_k is not None:  # keep=None: one forward-mode pass at theta_k along the update
            delta = {n: p.detach() - old[n] for n, p in self.params.items()}
            with eval_mode(self.model):
                dmu_u = jvp_alignment(self.model, ro, gg.groups, old, delta, base=theta_k).to(torch.float64)
            del delta
        else:
            dmu_u = gg.dot(self.params, minus=old)
        gg.release()
        dmu_g = -gg.dots["grad"]
        out = alignment_metrics("gap", dmu_u if Q else None, dmu_g, None, upd, grad_norm, norms=gg.norms)
        if Q:
            if seq_logp_next is not None:
                phi_next = objectives_from_logprobs(ro.rewards, gg.groups,
                                                    seq_logp_next.detach().cpu().to(torch.float64))
            else:
                with torch.no_grad(), eval_mode(self.model):
                    phi_next = prompt_objectives(self.model, ro, gg.groups).cpu().to(torch.float64)
            dphi = phi_next - gg.phi.to(torch.float64)
            self.M_batch += float(dmu_u.clamp(min=0).mean())
            out["gap/dphi_mean"] = float(dphi.mean())
        out["gap/M_batch"] = self.M_batch
        return ProbeResult(out, dmu_u if Q else None, dmu_g if Q else None, upd, grad_norm, [], gg.norms if Q else None)
