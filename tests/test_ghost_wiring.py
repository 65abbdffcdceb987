"""probe_alignment="ghost" (llm_probe.ghost.GhostProbe) wired into both hosts: a Trainer run and a trl.GRPOTrainer
run with the ghost route log the per-step gap norms, cosines and dmu of the exact ``dot`` route (gap vectors) on the
same batches. The two runs of each pair start from copies of one model with one seed and the probes change no
training state, so their batches are the same (checked: rewards, losses, update norms). In float64, where both
routes are exact to rounding (in float32 the dot route's per-group gradients are ~2e-5 off in the norms, the
ghost route's ~1e-6; tests/test_llm_ghost.py compares it with a float64 per-sequence reference)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llm_probe.config import TrainConfig
from llm_probe.ghost import GhostProbe
from llm_probe.trainer import Trainer
from tests.llm_helpers import warm_model

pytestmark = pytest.mark.llm

GAP_KEYS = ("gap/n_prompts", "gap/norm_mean", "gap/cos_update_mean", "gap/cos_grad_mean", "gap/dmu_update_mean",
            "gap/dmu_grad_mean", "gap/dphi_mean", "gap/M_batch")


def _close(a, b, rel=1e-6, abs_=1e-9) -> bool:
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return a.shape == b.shape and bool(np.all(np.abs(a - b) <= abs_ + rel * np.abs(b)))


@pytest.mark.parametrize("steps,B", [pytest.param(3, 4, marks=pytest.mark.slow), (1, 3)], ids=["3x4", "1x3"])
def test_trainer_ghost_route_logs_the_dot_route_numbers(tmp_path, steps, B):
    rows, probes = {}, {}
    for route in ("dot", "ghost"):
        model, tok = warm_model()
        model.double()
        cfg = TrainConfig(out_dir=str(tmp_path / route), steps=steps, prompts_per_step=B, group_size=4,
                          probe_prompts=0, progress=False, num_threads=1, device="cpu", lr=1e-3, probe_every=1,
                          probe_alignment=route, dtype="float64")
        tr = Trainer(cfg, model=model, tokenizer=tok)
        probes[route] = tr.probe
        rows[route] = [tr.train_step() for _ in range(steps)]
    assert type(probes["ghost"]) is GhostProbe and type(probes["dot"]) is not GhostProbe
    mixed = 0
    for a, b in zip(rows["dot"], rows["ghost"]):
        assert (a["reward"], a["loss"], a["update_norm"]) == (b["reward"], b["loss"], b["update_norm"])
        assert {k for k in a if k.startswith("gap/")} == {k for k in b if k.startswith("gap/")}
        mixed += a["gap/n_prompts"]
        for k in GAP_KEYS:
            if k in a:
                assert _close(b[k], a[k]), (k, a[k], b[k])
    assert mixed > 0, "no mixed group: the comparison would be vacuous"


def test_trainer_ghost_route_with_the_meter_and_warn_forward_thinned(tmp_path):
    """headroom_every = 2, warn_forward_every = 3 at probe_every = 1 (float64): every step logs the dot route's gap
    numbers (a step without the meter takes dmu_update from the per-group gradients held across the step, a step
    without the warn/* forward Phi_hat(theta_{k+1}) from a forward over the mixed rows), the meter's gap/headroom
    only on steps 0, 2 and the warn/* statistics at theta_{k+1} only on step 0, there equal to the dot run's that
    measures both on every step."""
    rows, probes = {}, {}
    for route, every in (("dot", (1, 1)), ("ghost", (2, 3))):
        model, tok = warm_model()
        model.double()
        cfg = TrainConfig(out_dir=str(tmp_path / route), steps=3, prompts_per_step=6, group_size=4, probe_prompts=0,
                          progress=False, num_threads=1, device="cpu", lr=1e-3, probe_every=1, probe_alignment=route,
                          dtype="float64", headroom_every=every[0], warn_forward_every=every[1])
        tr = Trainer(cfg, model=model, tokenizer=tok)
        probes[route] = tr.probe
        rows[route] = [tr.train_step() for _ in range(3)]
    assert probes["ghost"].keep == "auto"  # the meter does not run on every probe step: the blocks are held
    assert [("gap/headroom" in r) for r in rows["ghost"]] == [True, False, True]
    assert [("warn/dH_same" in r) for r in rows["ghost"]] == [True, False, False]
    mixed = []
    for a, b in zip(rows["dot"], rows["ghost"]):
        assert (a["reward"], a["loss"], a["update_norm"]) == (b["reward"], b["loss"], b["update_norm"])
        mixed.append(a["gap/n_prompts"])
        for k in (*GAP_KEYS, "gap/headroom", "gap/headroom_lr", "warn/dH_same", "warn/curv_gap"):
            if k in b and not (isinstance(a[k], float) and math.isnan(a[k])):
                assert _close(b[k], a[k]), (k, a[k], b[k])
    assert all(mixed), f"a step without a mixed group ({mixed}): its comparison would be vacuous"


def test_ghost_route_refuses_probe_prompts():
    with pytest.raises(ValueError, match=r"--probe-prompts \(probe_prompts\) 0, got 8"):
        TrainConfig(probe_alignment="ghost")
    TrainConfig(probe_alignment="ghost", probe_prompts=0)


def _grpo_history(tmp_path, route: str, steps: int = 2) -> list[dict]:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from llm_probe.callback import GapProbeCallback
    from llm_probe.tasks import AdditionTask

    model, tok = warm_model()
    model.double()
    probs = AdditionTask().sample(np.random.default_rng(0), 16)
    ds = Dataset.from_dict({"prompt": [p.prompt for p in probs], "answer": [p.answer for p in probs]})

    def exact_match(prompts, completions, completion_ids=None, answer=None, **kw):
        return [float(c.strip() == a) for c, a in zip(completions, answer)]

    G = 4
    cb = GapProbeCallback(tok, num_generations=G, probe_every=1, alignment=route)
    args = GRPOConfig(output_dir=str(tmp_path / route), per_device_train_batch_size=2 * G, num_generations=G,
                      max_completion_length=6, max_steps=steps, learning_rate=1e-3, optim="adamw_torch",
                      lr_scheduler_type="constant", use_cpu=True, bf16=False, report_to="none",
                      gradient_checkpointing=False, logging_steps=1, save_strategy="no", temperature=0.7, beta=0.0,
                      seed=0, warmup_steps=0)
    trainer = GRPOTrainer(model=model, reward_funcs=cb.wrap_reward(exact_match), args=args, train_dataset=ds,
                          processing_class=tok)
    cb.attach(trainer)
    trainer.train()
    assert isinstance(cb.probe, GhostProbe) == (route == "ghost")
    assert not cb.skipped_steps
    return cb.history


@pytest.mark.slow
def test_grpo_trainer_ghost_route_logs_the_dot_route_numbers(tmp_path):
    """Adam (so dmu_update is not lr * dmu_grad), temperature 0.7: per prompt, ||g_q||, dmu_update and dmu_grad,
    and the step's cosines and headroom, equal between the routes."""
    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    hist = {route: _grpo_history(tmp_path, route) for route in ("dot", "ghost")}
    assert len(hist["dot"]) == len(hist["ghost"]) == 2
    mixed = 0
    for a, b in zip(hist["dot"], hist["ghost"]):
        assert (a["reward"], a["update_norm"]) == (b["reward"], b["update_norm"])
        assert a.keys() == b.keys()
        mixed += a["gap/n_prompts"]
        for k in ("gap/norm", "gap/dmu_update", "gap/dmu_grad", *GAP_KEYS, "gap/headroom"):
            if k in a and not (isinstance(a[k], float) and math.isnan(a[k])):
                assert _close(b[k], a[k]), (k, a[k], b[k])
    assert mixed > 0, "no mixed group: the comparison would be vacuous"


def test_callback_hooks_ghost_route_log_the_dot_route_numbers():
    """The fast twin of the GRPOTrainer run: the callback's hooks driven by hand on a recorded batch (mixed rewards,
    gradients set by hand, one SGD step), both routes on copies of one float64 tiny model."""
    pytest.importorskip("trl")
    import copy
    from types import SimpleNamespace

    import torch

    from llm_probe.callback import GapProbeCallback
    from llm_probe.tokenizer import build_char_tokenizer
    from tests.llm_helpers import tiny

    tok = build_char_tokenizer()
    base, _ = tiny(dtype="float64")
    digits = tok("0123456789", add_special_tokens=False)["input_ids"]
    g = torch.Generator().manual_seed(0)
    prompts = ["1+2="] * 4 + ["12+34="] * 4
    cids = [[digits[int(i)] for i in torch.randint(0, 10, (1 + n % 3,), generator=g)] + [tok.eos_token_id]
            for n in range(8)]
    rewards = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    grads = [torch.randn(q.shape, generator=g, dtype=q.dtype) * 1e-2 for q in base.parameters()]
    rows = {}
    for route in ("dot", "ghost"):
        model = copy.deepcopy(base)
        cb = GapProbeCallback(tok, 4, probe_every=1, alignment=route)
        f = cb.wrap_reward(lambda prompts, completions, completion_ids=None, **kw: rewards)
        f(prompts=prompts, completions=[""] * len(cids), completion_ids=cids)
        for q, gr in zip(model.parameters(), grads):
            q.grad = gr.clone()
        state = SimpleNamespace(global_step=0)
        opt = SimpleNamespace(param_groups=[{"lr": 0.5}])
        cb.on_pre_optimizer_step(None, state, None, model=model, optimizer=opt)
        assert isinstance(cb.probe, GhostProbe) == (route == "ghost")
        with torch.no_grad():
            for q in model.parameters():
                q -= 0.5 * q.grad
        cb.on_optimizer_step(None, state, None, model=model)
        assert not cb.skipped_steps
        rows[route] = cb.history[0]
    a, b = rows["dot"], rows["ghost"]
    assert a.keys() == b.keys() and a["gap/n_prompts"] == 2
    for k in ("gap/norm", "gap/dmu_update", "gap/dmu_grad", *GAP_KEYS, "gap/headroom", "update_norm"):
        assert _close(b[k], a[k]), (k, a[k], b[k])


def test_callback_ghost_route_refuses_ddp(monkeypatch):
    pytest.importorskip("trl")
    from types import SimpleNamespace

    import llm_probe.callback as cbm
    from llm_probe.tokenizer import build_char_tokenizer

    cb = cbm.GapProbeCallback(build_char_tokenizer(), 4, alignment="ghost")
    monkeypatch.setattr(cbm, "_world_size", lambda: 2)
    with pytest.raises(ValueError, match="alignment='ghost' probes one process only"):
        cb.on_train_begin(SimpleNamespace(temperature=1.0, num_generations=4), None, None)
    with pytest.raises(ValueError, match="alignment must be one of"):
        cbm.GapProbeCallback(build_char_tokenizer(), 4, alignment="ghosts")


def test_ghost_probe_is_a_step_hook_with_the_gap_probes_signature():
    import inspect

    from llm_probe.gap_probe import GapProbe
    from llm_probe.step_hook import StepHook
    from tests.llm_helpers import sampled_rollout, tiny

    for name in ("before", "after", "cancel"):
        sig = [[(p.name, p.kind) for p in inspect.signature(getattr(c, name)).parameters.values()]
               for c in (GapProbe, GhostProbe)]
        assert sig[0] == sig[1], name
    model, tok = tiny(seed=0)
    probe = GhostProbe(model)
    assert isinstance(probe, StepHook)
    with pytest.raises(ValueError, match="takes a llm_probe.step_hook.Step"):
        probe.before(sampled_rollout(model, tok, B=2, G=4, T=4, seed=1))
    with pytest.raises(ValueError, match="keep must be one of"):
        GhostProbe(model, keep="all")


@pytest.mark.parametrize("keep", ["auto", None])
def test_ghost_probe_on_a_lora_model_equals_the_dot_probe(keep):
    """PEFT LoRA (adapters on q_proj, v_proj; the base frozen): the adapters' gap norms, dmu_update and dmu_grad of
    GhostProbe equal GapProbe's dot route on one step (float64; the JVP of keep=None passes through HF's float32
    attention softmax, hence 1e-6)."""
    pytest.importorskip("peft")
    import torch

    from llm_probe.gap_probe import GapProbe
    from llm_probe.step_hook import Step
    from tests.llm_helpers import sampled_rollout
    from tests.test_llm_lora import lora_model

    model, tok = lora_model()
    model.double()
    ro = sampled_rollout(model, tok, B=3, G=4, T=5)
    g = torch.Generator().manual_seed(0)
    tr = {n: p for n, p in model.named_parameters() if p.requires_grad}
    grad = {n: torch.randn(p.shape, generator=g, dtype=p.dtype) for n, p in tr.items()}
    step = {n: torch.randn(p.shape, generator=g, dtype=p.dtype) * 1e-3 for n, p in tr.items()}
    saved = {n: p.detach().clone() for n, p in tr.items()}
    res = {}
    for key, probe in (("ghost", GhostProbe(model, keep=keep)), ("dot", GapProbe(model))):
        for n, p in tr.items():
            p.grad = grad[n].clone()
        probe.before(Step(ro))
        with torch.no_grad():
            for n, p in tr.items():
                p.add_(step[n])
        res[key] = probe.after()
        with torch.no_grad():
            for n, p in tr.items():
                p.copy_(saved[n])
    assert res["dot"].metrics["gap/n_prompts"] > 0
    for k in ("gap_norms", "dmu_update", "dmu_grad"):
        assert _close(getattr(res["ghost"], k), getattr(res["dot"], k)), k
