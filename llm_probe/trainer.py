"""The online RLVR loop with probes: prompts -> G completions (temperature 1) -> binary rewards ->
advantages (gapdyn) -> loss (llm_probe.losses) -> optimizer step, with the Gradient-Gap probe of
llm_probe.gap_probe and the collapse rule of llm_probe.collapse.

One step k (theta_k the parameters before it), as :meth:`Trainer.train_step` reads:
1. sample the batch at theta_k (training torch.Generator), score it;
2. loss, backward (token statistics, with the gradient mass on probe steps);
3. clip the gradient;
4. the step hooks' before at theta_k (llm_probe.step_hook): the gap probe's per-prompt gaps of the batch's mixed
   groups and of the fixed probe prompts (sampled with their own generator, so probing never changes the training
   trajectory), the safe step's theta_k;
5. optimizer step, mu = ``num_iterations`` of them on the same batch (importance ratio and clips act from the
   second on; with ``safe_step``: theta_{k+1} = theta_k + a (theta' - theta_k), llm_probe.safe_step);
6. probe.after: dmu_q = <theta_{k+1} - theta_k, g_q> (eta = 1, valid for Adam), M, realised dPhi_hat; on probe
   steps without the safe step, the headroom of the step taken (llm_probe.headroom; every ``headroom_every``-th
   probe step). One no-grad forward at theta_{k+1} over the batch serves the warn/* metrics and the ghost
   probe's dPhi_hat (every ``warn_forward_every``-th probe step; on the others the ghost probe's forward covers
   the mixed groups' rows only); the ghost probe's dmu_q is sum_n c_qn x_n of the headroom meter's x_n where the
   meter ran (llm_probe.ghost.GhostProbe.reuse), else the dot with what it held across the step.
A non-finite policy, loss, gradient or update skips the step with the weights of theta_k (logged);
``max_faults`` in a row stop the run. Files in out_dir: metrics.jsonl (one row per step), metrics.parquet
(at the end), probe_prompts.jsonl (one row per probe prompt and probe step), alerts.json, checkpoint.safetensors
and its digest checkpoint.sha256 (llm_probe.checkpoint: atomic, no pickle; a resume checks the digest and the
state against the committed logs, then cuts the logs back to what the checkpoint committed), train.lock (one
writing process per folder).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from gapdyn.io import atomic_write_text

from .checkpoint import (CHECKPOINT_NAME, LEGACY_NAME, AppendLog, CheckpointError,
                         config_differences, digest_path, first_nonfinite, join_optimizer_state, lock_run_folder,
                         read_checkpoint, remove_checkpoint, split_optimizer_state, write_checkpoint)
from .collapse import CollapseDetector
from .config import TrainConfig
from .losses import LOSSES, policy_loss
from .model import TinyQwenSpec, build_tiny_qwen, completion_logprobs, load_policy
from .gap_probe import GapProbe
from .ghost import GhostProbe
from .headroom import headroom_metrics, step_headroom_x
from .step_hook import Step
from .collectives import sub_rollout
from .probes import mixed_groups, select_params, token_stats
from .rollout import NonFinitePolicyError, check_prompts_fit, context_size, make_rollout
from .sampler import fast_completion_logprobs
from .seeds import derive_seed
from .safe_step import SafeStepController
from .tasks import AdditionTask, JsonlTask
from .tokenizer import build_char_tokenizer
from .warmup import task_key, warm_model, warmup
from .warning import forward_at_current, step_warning_metrics

__all__ = ["Trainer", "FaultError", "build_policy", "make_task", "train", "shuffled_within_groups"]


class FaultError(RuntimeError):
    """Raised after ``max_faults`` consecutive non-finite steps."""


def make_task(spec: str):
    """'addition' or a JSONL path."""
    if spec == "addition":
        return AdditionTask()
    if spec.endswith(".jsonl") or Path(spec).is_file():
        return JsonlTask(spec)
    raise ValueError(f"task must be 'addition' or a JSONL file path, got {spec!r}")


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name not in ("cpu", "cuda") and not name.startswith("cuda:"):
        raise ValueError(f"device must be auto, cpu or cuda, got {name!r}")
    return torch.device(name)


def build_policy(cfg: TrainConfig, task):
    """(model, tokenizer): loaded from cfg.init_from, or a tiny Qwen warmed up on ``task``: the warm model of
    these settings from the one cache (llm_probe.warmup.warm_model, ``./gapdyn_out/warm/<key>/``); a task the
    cache cannot key (llm_probe.warmup.task_key) is warmed in memory by the same warm-up."""
    dev = _device(cfg.device)
    if cfg.init_from:
        model, tok = load_policy(cfg.init_from, dtype=cfg.dtype, device=dev)
        return model, tok
    return warm_policy(cfg, task, dev)


def warm_policy(cfg: TrainConfig, task, dev: torch.device):
    """(model, tokenizer): a tiny Qwen (cfg.arch, cfg.seed) warmed up on ``task`` for cfg.warmup_steps (none: as
    built); the cached warm model when the task has a cache key (:func:`build_policy`)."""
    alphabet = "0123456789+=- "
    if isinstance(task, JsonlTask):
        alphabet = "".join(sorted({c for p in task.problems for c in p.prompt + p.answer} | set(alphabet)))
    if cfg.warmup_steps:
        try:
            task_key(task)
        except ValueError:
            pass
        else:
            d = warm_model(TinyQwenSpec(arch=cfg.arch), task, steps=cfg.warmup_steps, batch_size=cfg.warmup_batch,
                           lr=cfg.warmup_lr, seed=cfg.seed, alphabet=alphabet, dtype=cfg.dtype, device=dev)
            return tuple(load_policy(d, dtype=cfg.dtype, device=dev))
    tok = build_char_tokenizer(alphabet)
    model = build_tiny_qwen(tok, TinyQwenSpec(arch=cfg.arch), seed=cfg.seed, dtype=cfg.dtype, device=dev)
    if cfg.warmup_steps:
        warmup(model, tok, task, steps=cfg.warmup_steps, batch_size=cfg.warmup_batch, lr=cfg.warmup_lr, seed=cfg.seed)
    return model, tok


def shuffled_within_groups(rewards: torch.Tensor, seed: int, step: int) -> torch.Tensor:
    """``rewards`` [B, G] with each row permuted at random (numpy generator seeded by (seed, step): the same
    permutation at the same step, also after a resume). Group-relative advantages of the result are the true
    ones permuted within each group: the same magnitudes, signs at random."""
    rng = np.random.default_rng([seed, step])
    perm = torch.as_tensor(rng.permuted(np.tile(np.arange(rewards.shape[1]), (rewards.shape[0], 1)), axis=1))
    return rewards.gather(1, perm.to(rewards.device))


def all_finite(tensors: list) -> bool:
    """Whether every element of ``tensors`` is finite: one fused norm per tensor (a NaN or inf makes it
    non-finite), the elements themselves checked only where a norm is not finite (a NaN / inf, or finite
    values whose norm overflows)."""
    if not tensors:
        return True
    if bool(torch.isfinite(torch.stack(torch._foreach_norm(tensors))).all()):
        return True
    return all(bool(torch.isfinite(t).all()) for t in tensors)


def _check_settings(cfg: TrainConfig) -> None:
    """The settings the trainer checks before anything is built: a one-line ValueError for the first bad one."""
    if cfg.method not in LOSSES:
        raise ValueError(f"method must be one of {tuple(LOSSES)}, got {cfg.method!r}")
    for n in ("steps", "prompts_per_step", "max_new_tokens"):
        if getattr(cfg, n) < 1:
            raise ValueError(f"{n} must be >= 1, got {getattr(cfg, n)}")
    if cfg.group_size < 2:
        raise ValueError(f"group_size must be >= 2, got {cfg.group_size}")
    if not (np.isfinite(cfg.temperature) and cfg.temperature > 0):
        raise ValueError(f"temperature must be finite and > 0, got {cfg.temperature}")
    if cfg.max_faults < 1:
        raise ValueError(f"max_faults must be >= 1, got {cfg.max_faults}")
    if cfg.probe_every < 0 or cfg.probe_prompts < 0 or cfg.checkpoint_every < 0:
        raise ValueError(f"probe_every, probe_prompts and checkpoint_every must be >= 0, got "
                         f"{cfg.probe_every}, {cfg.probe_prompts}, {cfg.checkpoint_every}")


def _make_optimizer(cfg: TrainConfig, params):
    if cfg.lr <= 0:
        raise ValueError(f"lr must be > 0, got {cfg.lr}")
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=True)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    raise ValueError(f"optimizer must be adam, adamw or sgd, got {cfg.optimizer!r}")


def _stat(path: Path):
    try:
        return path.stat()
    except FileNotFoundError:
        return None


def _parse(line: str):
    """A JSONL row, or None for an empty or torn line (a kill during the append)."""
    try:
        return json.loads(line) if line.strip() else None
    except json.JSONDecodeError:
        return None


class Trainer:
    """Holds the model, optimizer, generators and probe state of one run (see module doc)."""

    def __init__(self, cfg: TrainConfig, model=None, tokenizer=None, task=None):
        """Built in named steps: settings checked, run folder, resume, task, policy (a given model, a loaded one or
        the warm model of build_policy), optimiser, generators, probes, counters."""
        _check_settings(cfg)
        seeds = {p: derive_seed(cfg.seed, p) for p in ("probe_sampler", "probe_prompts")}  # before any folder
        self.cfg = cfg
        self._init_folder()
        self._resume_from = self._find_resume()  # a bad checkpoint fails here, before the model is built
        self.task = task if task is not None else make_task(cfg.task)
        self.model, self.tok = self._init_policy(model, tokenizer)
        self.device = next(self.model.parameters()).device
        self.opt = _make_optimizer(cfg, [p for p in self.model.parameters() if p.requires_grad])
        self._init_generators(seeds)
        self._init_probes(seeds)
        self._init_counters()

    def _init_folder(self) -> None:
        """Threads, the run folder and its logs, the checkpoint's stamp."""
        from .threads import use_threads

        use_threads(self.cfg.num_threads)  # None: the process's count (1 unless GAPDYN_TORCH_THREADS; threads.py)
        self.out = Path(self.cfg.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.logs = {name: AppendLog(self.out / name) for name in ("metrics.jsonl", "probe_prompts.jsonl")}
        self._stamp = self._checkpoint_stamp()  # run() refuses a checkpoint another process replaced since

    def _init_policy(self, model, tokenizer) -> tuple:
        """(model, tokenizer): the given pair, else :func:`build_policy` (no warm-up on a resume, which overwrites
        the weights); a file task's too-long prompt fails now, not at the step that draws it."""
        cfg = self.cfg
        if model is None:  # a resume overwrites the weights: its warm-up would be thrown away
            model, tokenizer = build_policy(replace(cfg, warmup_steps=0) if self._resume_from else cfg, self.task)
        elif tokenizer is None:
            raise ValueError("tokenizer must be given with model")
        if not cfg.truncate_prompts:
            check_prompts_fit(tokenizer, [p.prompt for p in getattr(self.task, "problems", [])], context_size(model),
                              cfg.max_new_tokens)
        return model, tokenizer

    def _init_generators(self, seeds: dict) -> None:
        """The training generators (numpy for prompts, torch for sampling) and the probe prompts' sampler."""
        self.np_rng = np.random.default_rng(derive_seed(self.cfg.seed, "train"))
        self.gen = torch.Generator().manual_seed(derive_seed(self.cfg.seed, "train"))
        self.probe_gen = torch.Generator().manual_seed(seeds["probe_sampler"])

    def _init_probes(self, seeds: dict) -> None:
        """The step hooks (llm_probe.step_hook): the gap probe over its fixed probe prompts and, with
        cfg.safe_step, the safe step controller. The one place the trainer's probe route is chosen."""
        cfg = self.cfg
        self._share_x = False  # the ghost probe takes the headroom meter's x_n (below)
        self.probe_problems = (
            self.task.sample(np.random.default_rng(seeds["probe_prompts"]), cfg.probe_prompts) if cfg.probe_prompts
            else []
        )
        if cfg.probe_alignment == "ghost":  # llm_probe.ghost: no fixed probe prompts (TrainConfig refuses them)
            # with the headroom meter on the probe's parameters, the update's dot is sum_n c_qn x_n of the meter's
            # x_n (train_step): nothing held across the optimizer step
            trainable = {n for n, p in self.model.named_parameters() if p.requires_grad}
            self._share_x = not cfg.safe_step and set(select_params(self.model, cfg.probe_params)) == trainable
            # keep=None only where the meter's x_n comes on every probe step; else the per-group gradients are
            # held across the step for the dot on the steps without the meter (keep="auto"; llm_probe.ghost)
            every = self._share_x and cfg.headroom_every == 1
            self.probe = GhostProbe(self.model, cfg.probe_params, keep=None if every else "auto")
        else:
            self.probe = GapProbe(self.model, cfg.probe_params, alignment=cfg.probe_alignment,
                                  n_probe_prompts=len(self.probe_problems))
        self.safe = (SafeStepController(self.model, c=cfg.safe_step_c, delta=cfg.safe_step_delta) if cfg.safe_step
                     else None)

    def _init_counters(self) -> None:
        """Step and fault counters, the collapse detector (llm_probe.collapse)."""
        self.step = 0
        self.faults = 0
        self.consecutive_faults = 0
        self.detector = CollapseDetector(self.cfg.collapse)
        self.stopped_reason = None

    # ---- checkpointing (file format, atomic writes and log rollback: llm_probe.checkpoint) --------------
    @property
    def ckpt_path(self) -> Path:
        return self.out / CHECKPOINT_NAME

    def state_dict(self) -> tuple[dict, dict]:
        """(tensors, JSON state): everything a resume restores, in the checkpoint's two parts."""
        opt_tensors, opt_plain = split_optimizer_state(self.opt.state_dict())
        tensors = {f"model/{k}": v for k, v in self.model.state_dict().items()}
        tensors.update(opt_tensors)
        tensors.update({"rng/gen": self.gen.get_state(), "rng/probe_gen": self.probe_gen.get_state(),
                        "probe/M_probe": torch.from_numpy(np.asarray(self.probe.M_probe, dtype=np.float64).copy())})
        state = {"step": self.step, "optimizer": opt_plain, "np_rng": self.np_rng.bit_generator.state,
                 "M_batch": float(self.probe.M_batch), "faults": [self.faults, self.consecutive_faults],
                 "detector": self.detector.state_dict(), "config": asdict(self.cfg)}
        return tensors, state

    def save_checkpoint(self) -> Path:
        """Commit the logs (fsync), then write the checkpoint with their committed sizes, atomically."""
        tensors, state = self.state_dict()
        state["logs"] = {name: log.commit() for name, log in self.logs.items()}
        path = write_checkpoint(self.ckpt_path, tensors, state)
        self._stamp = self._checkpoint_stamp()  # this trainer's own checkpoint
        return path

    def load_checkpoint(self, path: Path | None = None) -> None:
        """Restore the run from a checkpoint (its configuration must match, see :meth:`_read_checkpoint`), then
        cut the logs back to what it committed. A file that is not a whole checkpoint is a ValueError."""
        with lock_run_folder(self.out):
            self._restore(*self._read_checkpoint(Path(path or self.ckpt_path)))

    def _read_checkpoint(self, path: Path) -> tuple[Path, dict, dict]:
        """Read and check a checkpoint before anything is built or changed: the trajectory fields of
        RESUME_POLICY must equal this run's unless cfg.resume_force."""
        tensors, state = read_checkpoint(path)
        if not isinstance(state.get("config"), dict):
            raise ValueError(f"checkpoint {path} lacks the configuration of its run")
        diffs = config_differences(state["config"], self.cfg)
        if diffs and not self.cfg.resume_force:
            raise ValueError(f"checkpoint {path} was written by another configuration ({'; '.join(diffs)}); resume "
                             f"with its settings, or pass --resume-force to continue with these (the metrics "
                             f"files then mix both)")
        if diffs:
            print(f"[resume] {path}: continuing with changed settings ({'; '.join(diffs)})", file=sys.stderr)
        return path, tensors, state

    def _restore(self, path: Path, tensors: dict, state: dict) -> None:
        try:
            self._apply_state(tensors, state)
            committed = {name: {k: int(state["logs"][name][k]) for k in ("bytes", "rows")} for name in self.logs}
            if any(v < 0 for c in committed.values() for v in c.values()):
                raise ValueError(f"negative log sizes {committed}")
        except KeyError as exc:
            raise ValueError(f"checkpoint {path} lacks the entry {exc}") from None
        except (TypeError, ValueError, RuntimeError, IndexError, AttributeError) as exc:
            msg = " ".join(str(exc).split())
            raise ValueError(f"checkpoint {path} does not fit this run: {msg[:400]}") from None
        self._check_state(path, state, committed)
        for name, log in self.logs.items():  # drop rows written after the checkpoint (atomic, idempotent)
            log.rollback(committed[name], path)

    def _check_state(self, path: Path, state: dict, committed: dict) -> None:
        """The restored state against itself and the committed log, before any file is changed: every number
        finite (the configuration is checked by :func:`config_differences`), 0 <= step <= the steps of the run
        that wrote it, 0 <= consecutive faults <= faults <= step, M >= 0 (a sum of [dmu]_+, Suk & Duan
        arXiv 2510.08539), and metrics.jsonl's committed rows are steps 0 .. step-1 (one row per step)."""
        def refuse(why: str):
            raise CheckpointError(f"checkpoint {path}: {why}; it cannot continue this run: restore the folder "
                                  f"or delete {self.out / 'checkpoint'}* to start afresh")

        bad = first_nonfinite({k: v for k, v in state.items() if k != "config"})
        if bad is None and not np.isfinite(self.probe.M_probe).all():
            bad = "probe/M_probe holds a non-finite value"
        if bad:
            refuse(f"{bad} is not finite")
        total = state["config"].get("steps", self.cfg.steps)
        if not (isinstance(total, int) and 0 <= self.step <= total):
            refuse(f"step {self.step} is outside 0..{total!r}, the steps of the run that wrote it")
        if not 0 <= self.consecutive_faults <= self.faults <= self.step:
            refuse(f"faults {[self.faults, self.consecutive_faults]} must satisfy 0 <= consecutive <= all <= step "
                   f"{self.step}")
        if self.probe.M_batch < 0 or (self.probe.M_probe < 0).any():
            refuse(f"M_batch {self.probe.M_batch} or M_probe is negative (M sums [dmu]_+ >= 0)")
        rows = committed["metrics.jsonl"]["rows"]
        if rows != self.step:
            refuse(f"it is at step {self.step} but committed {rows} rows of metrics.jsonl (one per step)")
        log = self.logs["metrics.jsonl"].path
        n = committed["metrics.jsonl"]["bytes"]
        if n and log.exists() and log.stat().st_size >= n:  # a shorter or torn log: AppendLog.rollback says so
            with open(log, "rb") as f:
                kept = [_parse(ln) for ln in f.read(n).decode(errors="replace").splitlines()]
            steps = [r.get("step") if isinstance(r, dict) else None for r in kept]
            if len(steps) == rows and None not in steps and steps != list(range(rows)):
                refuse(f"the {rows} committed rows of metrics.jsonl are steps {steps[:3]}...{steps[-3:]}, "
                       f"not 0..{rows - 1}")

    def _apply_state(self, tensors: dict, state: dict) -> None:
        model_sd = {k[len("model/"):]: v for k, v in tensors.items() if k.startswith("model/")}
        self.model.load_state_dict(model_sd)  # strict: missing, unexpected or wrongly shaped weights raise
        opt_sd = join_optimizer_state(tensors, state["optimizer"])
        params = [p for g in self.opt.param_groups for p in g["params"]]
        for pid, st in opt_sd["state"].items():
            if not 0 <= pid < len(params):
                raise ValueError(f"optimizer state for parameter {pid}, the model has {len(params)}")
            for name, v in st.items():
                if torch.is_tensor(v) and v.dim() and v.shape != params[pid].shape:
                    raise ValueError(f"optimizer {name} of parameter {pid} has shape {tuple(v.shape)}, "
                                     f"the parameter {tuple(params[pid].shape)}")
        self.opt.load_state_dict(opt_sd)
        self.np_rng.bit_generator.state = state["np_rng"]
        self.gen.set_state(tensors["rng/gen"])
        self.probe_gen.set_state(tensors["rng/probe_gen"])
        M_probe = tensors["probe/M_probe"].numpy().astype(float)
        if M_probe.shape != self.probe.M_probe.shape:
            raise ValueError(f"probe/M_probe has shape {M_probe.shape}, this run tracks {self.probe.M_probe.shape}")
        self.probe.M_probe = M_probe
        self.probe.M_batch = float(state["M_batch"])
        self.faults, self.consecutive_faults = (int(x) for x in state["faults"])
        self.detector.load_state_dict(state["detector"])
        step = state["step"]
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be an integer >= 0, got {step!r}")
        self.step = step

    # ---- one step ------------------------------------------------------------------------------
    def compute_loss(self, ro, old_logp=None, *, keep_all: bool = True):
        """(loss result, logp [N,T], logp_all [N,T,V]) on a rollout at the current parameters; ``old_logp``: the
        sampling policy's log-probabilities (None: these, so the importance ratio is 1); ``keep_all=False``:
        logp_all is None (only the loss is needed, as on the later steps on a reused batch)."""
        # the scored forward shares each prompt's pass among its G rows (llm_probe.sampler; same function)
        # keep_all: the log-probabilities of the whole vocabulary too, no entropy (token_stats forms its own)
        out = fast_completion_logprobs(self.model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids,
                                       ro.completion_mask, G=ro.G, return_all=keep_all)
        logp, logp_all = out if keep_all else (out, None)
        old = logp.detach() if old_logp is None else old_logp
        res = policy_loss(self.cfg.method, logp, old, ro.completion_mask, ro.rewards.to(self.device),
                          max_completion_length=self.cfg.max_new_tokens, eps_low=self.cfg.eps_low,
                          eps_high=self.cfg.eps_high)
        return res, logp, logp_all

    @torch.no_grad()
    def measure_baseline(self, n_prompts: int = 64) -> tuple[float, float]:
        """(token entropy, sampled reward) of the current policy on fresh prompts, with generators of its own."""
        cfg = self.cfg
        probs = self.task.sample(np.random.default_rng(derive_seed(cfg.seed, "baseline_prompts")), n_prompts)
        ro = self.rollout(probs, cfg.group_size, torch.Generator().manual_seed(derive_seed(cfg.seed, "baseline_sampler")))
        _, ent, _ = completion_logprobs(self.model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids,
                                        ro.completion_mask, return_entropy=True)
        mk = ro.completion_mask > 0
        return float(ent[mk].mean()), float(ro.rewards.mean())

    def _probe_step(self, k: int, every: int = 1) -> bool:
        """Whether step k probes; with ``every`` = n, whether it is an n-th probe step (k % (probe_every n) == 0:
        the cadence of ``headroom_every`` and ``warn_forward_every``)."""
        return self.cfg.probe_every > 0 and k % (self.cfg.probe_every * every) == 0

    def rollout(self, problems, G: int, generator: torch.Generator):
        """G completions per problem at the current parameters (training settings), sampled with ``generator``."""
        return make_rollout(self.model, self.tok, self.task, problems, G=G, max_new_tokens=self.cfg.max_new_tokens,
                            generator=generator, temperature=self.cfg.temperature,
                            truncate_prompts=self.cfg.truncate_prompts)

    def train_step(self) -> dict:
        """One RL step k (module doc): rollout -> loss -> backward -> clip -> probe.before -> optimizer step ->
        probe.after; a non-finite policy, loss, gradient or update skips the step (:meth:`_fault`)."""
        cfg, k = self.cfg, self.step
        t0 = time.perf_counter()
        probing = self._probe_step(k)
        metering = probing and self._probe_step(k, cfg.headroom_every)  # the headroom meter's pass
        warn_next = probing and self._probe_step(k, cfg.warn_forward_every)  # warn/* at theta_{k+1}
        self.model.train()
        if cfg.lr_warmup_steps:  # a function of k alone: a resumed run takes the same lr at the same step
            for group in self.opt.param_groups:
                group["lr"] = cfg.lr * min(1.0, (k + 1) / cfg.lr_warmup_steps)
        try:  # 1. sample the batch at theta_k and score it
            ro = self.rollout(self.task.sample(self.np_rng, cfg.prompts_per_step), cfg.group_size, self.gen)
        except NonFinitePolicyError as exc:  # finite but exploded weights: nothing to sample from
            return self._fault(k, {}, f"non-finite policy output ({exc})")
        m = self._rollout_metrics(ro)
        if cfg.lr_warmup_steps:
            m["lr_step"] = float(self.opt.param_groups[0]["lr"])
        if cfg.shuffle_rewards:  # the random-advantage control (TrainConfig.shuffle_rewards)
            ro = replace(ro, rewards=shuffled_within_groups(ro.rewards, derive_seed(cfg.seed, "control"), k))
        res, logp, logp_all = self.compute_loss(ro)  # 2. loss and its gradient
        m.update(res.metrics)
        m["loss"] = float(res.loss.detach())
        if probing and logp.requires_grad:
            logp.retain_grad()  # dL/dlogp: the gradient mass of token_stats
        fault = self._backward(res.loss)
        m.update(token_stats(logp_all.detach(), ro.completion_ids, ro.completion_mask, res.advantages,
                             logp.grad if probing else None))
        if fault is not None:
            return self._fault(k, m, fault)
        self.consecutive_faults = 0
        m["grad_norm"] = self._clip_gradient()  # 3. clip
        theta_k = {n: p.detach().clone() for n, p in self.model.named_parameters()}
        hooks = self._step_hooks(probing)  # the step hooks of llm_probe.step_hook: before / after / cancel
        if probing:  # 4. probes at theta_k (the probe prompts are sampled with their own generator)
            probe_ro = self.rollout(self.probe_problems, cfg.probe_group_size, self.probe_gen) if self.probe_problems else None
            m.update(self.probe.before(Step(ro, theta_k=theta_k, probe_ro=probe_ro, seq_logp=logp.detach().sum(-1))))
        if self.safe is not None:
            m.update(self.safe.before(Step(ro, theta_k=theta_k)))
        self.opt.step()  # 5. the update: mu = cfg.num_iterations optimizer steps on this batch
        fault = self._reuse_batch(ro, logp.detach(), m) if cfg.num_iterations > 1 else None
        if fault is not None:
            self._restore_weights(theta_k)
            for h in hooks:
                h.cancel()
            return self._fault(k, m, fault)
        if not self._update_is_finite(theta_k):
            for h in hooks:
                h.cancel()
            return self._fault(k, m, "non-finite weights after the update")
        x = None  # the headroom meter's x_n, reused by the ghost probe
        if self.safe is not None:  # theta_{k+1} = theta_k + a (theta' - theta_k), llm_probe.safe_step
            m.update(self.safe.after().metrics)
        elif metering:  # the headroom meter: the same rule, measured on the step taken, nothing rescaled
            hm, x = self._headroom(ro, theta_k)
            m.update(hm)
        with torch.no_grad():
            m["update_norm"] = float(torch.sqrt(sum(((p - theta_k[n]) ** 2).sum() for n, p in self.model.named_parameters())))
        at_next = forward_at_current(self.model, ro) if warn_next else None  # the one forward at theta_{k+1}
        if probing:  # 6. alignment of the real change with the gaps at theta_k
            if isinstance(self.probe, GhostProbe):  # no passes of its own after the step (GhostProbe.reuse)
                seq_next = at_next[0].sum(-1) if at_next is not None else self._mixed_logp_next(ro)
                self.probe.reuse(x=x if self._share_x else None, seq_logp_next=seq_next)
            result = self.probe.after()
            m.update(result.metrics)
            self._log_probe_prompts(k, result.prompts)
        m.update(step_warning_metrics(self.model, ro, logp.detach(), logp_all, res.advantages,  # warn/* (llm_probe.warning)
                                      logp.grad if probing else None, after=warn_next, at_next=at_next))
        m["step_time"] = time.perf_counter() - t0
        self.step += 1
        return m

    # ---- the step's helpers: faults, clipping, probe rows -----------------------------------------
    def _step_hooks(self, probing: bool) -> list:
        """The step hooks (llm_probe.step_hook) this step runs: the gap probe on probe steps, the safe step."""
        return ([self.probe] if probing else []) + ([self.safe] if self.safe is not None else [])

    def _mixed_logp_next(self, ro) -> torch.Tensor | None:
        """log pi_{k+1}(o_n) [B*G] on the rows of the batch's mixed groups (0 on the others, which Phi_hat does not
        read; None without a mixed group): :func:`llm_probe.warning.forward_at_current` (the shared-prompt forward
        the loss is scored with) on those groups alone, for the ghost probe's dPhi_hat on a step without the
        warn/* forward over the whole batch."""
        groups = mixed_groups(ro.rewards)
        if not len(groups):
            return None
        G = ro.G
        rows = (groups.view(-1, 1) * G + torch.arange(G)).reshape(-1)
        lp = forward_at_current(self.model, sub_rollout(ro, groups))[0].sum(-1)
        out = torch.zeros(ro.rewards.numel(), dtype=lp.dtype, device=lp.device)
        out[rows.to(lp.device)] = lp
        return out

    def _headroom(self, ro, theta_k: dict) -> tuple[dict, torch.Tensor]:
        """(``gap/headroom`` h of the step just taken over the trainable parameters and ``gap/headroom_lr`` = lr h,
        the x_n [B*G] it rests on) (llm_probe.headroom, the rule llm_probe.GapProbeCallback runs: NaN for a zero
        update)."""
        th = {n: theta_k[n] for n, p in self.model.named_parameters() if p.requires_grad}
        h, x = step_headroom_x(self.model, ro, th, c=self.cfg.safe_step_c, delta=self.cfg.safe_step_delta,
                               shared_prompt=True)  # the forward the loss is scored with (compute_loss)
        return headroom_metrics(h, float(self.opt.param_groups[0]["lr"])), x

    def _backward(self, loss) -> str | None:
        """loss.backward() into cleared gradients; the fault's reason when the loss or a gradient is not finite."""
        self.opt.zero_grad(set_to_none=True)
        if not torch.isfinite(loss):
            return f"non-finite loss ({float(loss.detach())})"
        if loss.requires_grad:
            loss.backward()
        if not all_finite([p.grad for p in self.model.parameters() if p.grad is not None]):
            return "non-finite gradient"
        return None

    def _clip_gradient(self) -> float:
        """Clip to cfg.max_grad_norm (if set); returns the norm before clipping. Parameters without a gradient
        get an exact zero first (Adam still moves them)."""
        for p in self.model.parameters():
            if p.grad is None and p.requires_grad:
                p.grad = torch.zeros_like(p)
        if self.cfg.max_grad_norm is not None:
            return float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm))
        return float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in self.model.parameters()])))

    def _reuse_batch(self, ro, old_logp, m: dict) -> str | None:
        """Optimizer steps 2..mu on the batch sampled at theta_k (``old_logp``: its log-probabilities), so the
        ratio pi_theta / pi_theta_k leaves 1 and the clips act. ``loss`` and ``clip_ratio/*`` in ``m`` become
        means over the mu steps (as TRL logs them); the fault's reason when a step is not finite."""
        mu = self.cfg.num_iterations
        sums = {key: v for key, v in m.items() if key.startswith("clip_ratio/") or key == "loss"}
        for i in range(1, mu):
            res, _, _ = self.compute_loss(ro, old_logp=old_logp, keep_all=False)
            sums["loss"] += float(res.loss.detach())
            for key in sums.keys() & res.metrics.keys():
                sums[key] += res.metrics[key]
            fault = self._backward(res.loss)
            if fault is not None:
                return f"{fault} at optimizer step {i + 1} of {mu} on the batch"
            self._clip_gradient()
            self.opt.step()
        m.update({key: v / mu for key, v in sums.items()})
        return None

    def _restore_weights(self, theta_k: dict) -> None:
        with torch.no_grad():
            for n, p in self.model.named_parameters():
                p.copy_(theta_k[n])

    def _update_is_finite(self, theta_k: dict) -> bool:
        """A finite gradient times a huge step can still overflow the weights: then restore theta_k and say so
        (the optimizer's moments keep this step's finite gradient)."""
        if all_finite([p.detach() for p in self.model.parameters()]):
            return True
        self._restore_weights(theta_k)
        return False

    def _fault(self, k: int, m: dict, fault: str) -> dict:
        """Skip step k (weights as before it), log the fault; FaultError after max_faults in a row."""
        self.opt.zero_grad(set_to_none=True)
        self.faults += 1
        self.consecutive_faults += 1
        m.update({"fault": fault, "faults": self.faults, "skipped": 1})
        self.step += 1
        if self.consecutive_faults >= self.cfg.max_faults:
            self.log_step(k, m)
            raise FaultError(f"stopped at step {k}: {self.consecutive_faults} consecutive steps with a "
                             f"non-finite loss, gradient or update (last: {fault}); weights are those before the faults")
        return m

    def _log_probe_prompts(self, k: int, rows: list) -> None:
        if not rows:
            return
        self.logs["probe_prompts.jsonl"].append(
            [{"step": k, "prompt_id": r["prompt_id"], "prompt": p.prompt, "J_hat": r["J_hat"], "mixed": r["mixed"],
              "dmu_update": r["dmu_update"], "M": r["M"]} for r, p in zip(rows, self.probe_problems)])

    def _rollout_metrics(self, ro) -> dict:
        r = ro.rewards
        lengths = ro.completion_mask.sum(-1)
        G = ro.G
        rows = ro.completion_ids.tolist()  # one conversion, not one per row
        distinct = [len(set(tuple(rows[b * G + g]) for g in range(G))) / G for b in range(ro.B)]
        return {
            "reward": float(r.mean()),
            "reward_std": float(r.std(-1).mean()),  # TRL: mean over groups of the (Bessel) std
            "frac_reward_zero_std": float((r.std(-1) == 0).float().mean()),
            "completions/mean_length": float(lengths.mean()),
            "completions/clipped_ratio": float((~ro.terminated).float().mean()),
            "completions/distinct_frac": float(np.mean(distinct)),
        }

    # ---- the loop ------------------------------------------------------------------------------
    def log_step(self, k: int, m: dict) -> None:
        """Append step k's metrics row to metrics.jsonl."""
        row = {"step": k, "method": self.cfg.method, "lr": self.cfg.lr, "seed": self.cfg.seed, **m}
        self.logs["metrics.jsonl"].append([row])

    def _find_resume(self):
        """(path, tensors, state) of the checkpoint to resume from, or None for a fresh start."""
        if not self.cfg.resume:
            return None
        if self.ckpt_path.exists():
            return self._read_checkpoint(self.ckpt_path)
        legacy = self.out / LEGACY_NAME
        if legacy.exists():
            raise ValueError(f"{legacy} is a checkpoint of the old pickle format, which is never loaded (unpickling "
                             f"can run code); move it away to start afresh")
        return None

    def _checkpoint_stamp(self):
        """(inode, size, mtime) of the checkpoint and its digest: tells whether another process replaced them."""
        return tuple((st.st_ino, st.st_size, st.st_mtime_ns) if (st := _stat(p)) else None
                     for p in (self.ckpt_path, digest_path(self.ckpt_path)))

    def run(self, on_step: Callable[["Trainer", int, dict], None] | None = None, *, checkpoint: bool = True) -> dict:
        """Train until cfg.steps (or an early stop), holding the run folder's lock (llm_probe.checkpoint:
        a second writer is refused); returns a summary dict.

        ``on_step(trainer, k, m)`` runs after step k's row ``m`` is logged and before its checkpoint (a study's
        held-out evaluation; it must leave the model and the generators as it found them). ``checkpoint=False``
        writes no checkpoint (needs cfg.checkpoint_every == 0): a study that keeps only its logs."""
        if on_step is not None and not callable(on_step):
            raise ValueError(f"on_step must be callable or None, got {type(on_step).__name__}")
        if not checkpoint and self.cfg.checkpoint_every:
            raise ValueError(f"checkpoint=False needs checkpoint_every == 0, got {self.cfg.checkpoint_every}")
        with lock_run_folder(self.out):
            if self.cfg.resume and self._checkpoint_stamp() != self._stamp:
                raise CheckpointError(f"the checkpoint in {self.out} was written by another process after this "
                                      f"trainer read it; build the trainer again to resume from it")
            return self._run_locked(on_step, checkpoint)

    def _run_locked(self, on_step=None, checkpoint: bool = True) -> dict:
        cfg = self.cfg
        if self._resume_from is not None:
            self._restore(*self._resume_from)
            self._resume_from = None
        else:  # a fresh start (also resume=True before any checkpoint existed): no stale checkpoint or rows
            remove_checkpoint(self.ckpt_path)  # first: a kill below must not leave it behind
            for log in self.logs.values():
                log.reset()
            (self.out / "alerts.json").unlink(missing_ok=True)
        if self.step == 0 and None in (cfg.collapse.baseline_entropy, cfg.collapse.baseline_reward):
            H0, R0 = self.measure_baseline()
            self.detector.set_baseline(H0, R0)
            atomic_write_text(self.out / "baseline.json", json.dumps({"entropy": H0, "reward": R0}))
        bar = None
        if cfg.progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=cfg.steps, initial=self.step, desc=f"{cfg.method} lr={cfg.lr:g}", leave=False)
        while self.step < cfg.steps:
            k = self.step
            m = self.train_step()
            for a in self.detector.update(k, m):
                m.setdefault("alerts", []).append(a.rule)
                print(f"[{cfg.method} lr={cfg.lr:g} seed={cfg.seed}] {a}")
            self.log_step(k, m)
            if on_step is not None:
                on_step(self, k, m)
            if bar is not None:
                bar.update(1)
                bar.set_postfix({n: f"{m[key]:.3f}" for n, key in (("reward", "reward"), ("H", "entropy")) if key in m})
            if cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0:
                self.save_checkpoint()
            if cfg.stop_on_alert and self.detector.alerted:
                self.stopped_reason = str(self.detector.alerts[0])
                break
        if bar is not None:
            bar.close()
        if checkpoint:
            self.save_checkpoint()
        atomic_write_text(self.out / "alerts.json", json.dumps([asdict(a) for a in self.detector.alerts], indent=1))
        return self.finish()

    def finish(self) -> dict:
        import pandas as pd

        rows = [r for ln in (self.out / "metrics.jsonl").read_text().splitlines() if (r := _parse(ln)) is not None]
        df = pd.DataFrame([{k: v for k, v in r.items() if k != "alerts"} for r in rows])
        if "fault" in df:
            df["fault"] = df["fault"].astype("string")
        from gapdyn.io import write_parquet

        write_parquet(self.out / "metrics.parquet", df)  # atomic; a failing write names the file (gapdyn.io)
        return {"steps": self.step, "alerted": self.detector.alerted,
                "alerts": [asdict(a) for a in self.detector.alerts], "stopped": self.stopped_reason,
                "faults": self.faults}


def train(cfg: TrainConfig, **kw) -> dict:
    """Build a :class:`Trainer` from ``cfg`` and run it."""
    return Trainer(cfg, **kw).run()



