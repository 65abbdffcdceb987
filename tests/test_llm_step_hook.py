"""The one probe interface (llm_probe.step_hook): the gap probe, the forward-only probe and the safe step share the
signature of before / after / cancel; every host computes the headroom by the same code (NaN for a zero update);
a probe route swapped into the trainer is driven through the interface alone and changes no number."""

from __future__ import annotations

import inspect
import math
from types import SimpleNamespace

import pytest
import torch

from llm_probe.config import TrainConfig
from llm_probe.gap_probe import GapProbe
from llm_probe.headroom import headroom_from_x, step_headroom
from llm_probe.safe_step_rule import SafeStepController, step_rule
from llm_probe.sharding import ForwardProbe
from llm_probe.step_hook import Step, StepHook
from llm_probe.trainer import Trainer
from tests.llm_helpers import sampled_rollout, tiny, warm_model

pytestmark = pytest.mark.llm

HOOKS = (GapProbe, ForwardProbe, SafeStepController)


def _signature(cls, name):
    sig = inspect.signature(getattr(cls, name))
    return [(p.name, p.kind) for p in sig.parameters.values()]


@pytest.mark.parametrize("name", ["before", "after", "cancel"])
def test_the_three_hooks_share_one_signature(name):
    sigs = {cls.__name__: _signature(cls, name) for cls in HOOKS}
    assert len({tuple(s) for s in sigs.values()}) == 1, sigs
    assert all(isinstance(inspect.getattr_static(cls, "pending"), property) for cls in HOOKS)


def test_every_hook_refuses_a_bare_rollout_and_runs_through_the_interface():
    model, tok = tiny(seed=0)
    ro = sampled_rollout(model, tok, B=2, G=4, T=4, seed=1)
    for hook in (GapProbe(model), ForwardProbe(model), SafeStepController(model)):
        assert isinstance(hook, StepHook)
        with pytest.raises(ValueError, match="takes a llm_probe.step_hook.Step"):
            hook.before(ro)
        assert isinstance(hook.before(Step(ro)), dict) and hook.pending
        hook.cancel()
        assert not hook.pending
        with pytest.raises(RuntimeError, match="before"):
            hook.after()


def _moved(model, scale):
    theta_k = {n: p.detach().clone() for n, p in model.named_parameters()}
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))
    return theta_k


@pytest.mark.parametrize("scale", [0.0, 1e-3])
def test_the_trainer_and_the_callback_compute_the_same_headroom(scale):
    """Trainer._headroom and GapProbeCallback._headroom on one step equal step_rule's h on the step (a zero step:
    NaN in both hosts, where the trainer used to log the rule's value on x = 0): the callback exactly, the trainer,
    whose forward-mode pass runs the shared-prompt forward its loss is scored with, to 1e-6 (float64); the x_n the
    trainer returns with h are the callback's route's."""
    pytest.importorskip("trl")
    from llm_probe.callback import GapProbeCallback
    from llm_probe.model import eval_mode
    from llm_probe.safe_step import completion_logprob_jvp

    model, tok = tiny(seed=0, dtype="float64")
    ro = sampled_rollout(model, tok, B=3, G=4, T=4, seed=2)
    theta_k = _moved(model, scale)
    host = SimpleNamespace(model=model, cfg=SimpleNamespace(safe_step_c=1.0, safe_step_delta=2.0),
                           opt=SimpleNamespace(param_groups=[{"lr": 0.1}]))
    mine, x = Trainer._headroom(host, ro, theta_k)
    cb = GapProbeCallback(tok, 4)
    cb._theta_k, cb._ro, cb._lr = dict(theta_k), ro, 0.1
    theirs = cb._headroom(model)
    d = {n: p.detach() - theta_k[n] for n, p in model.named_parameters()}
    if scale == 0:
        assert math.isnan(mine["gap/headroom"]) and math.isnan(theirs["gap/headroom"])
        assert math.isnan(step_headroom(model, ro, theta_k)) and math.isnan(headroom_from_x(torch.zeros(12), ro.rewards))
        return
    ref = step_rule(model, ro, theta_k, d).headroom
    assert math.isfinite(ref) and theirs == {"gap/headroom": ref, "gap/headroom_lr": 0.1 * ref}
    assert mine.keys() == theirs.keys() and all(mine[k] == pytest.approx(theirs[k], rel=1e-6) for k in mine)
    with eval_mode(model):
        x_ref = completion_logprob_jvp(model, ro, theta_k, d)
    assert float((x - x_ref).abs().max()) <= 1e-6 * float(x_ref.abs().max())


class _Recording:
    """A probe route standing in for the trainer's gap probe: records the calls, delegates the numbers."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    @property
    def pending(self):
        return self.inner.pending

    def before(self, step):
        self.calls.append(("before", step.theta_k is not None, step.seq_logp is not None))
        return self.inner.before(step)

    def after(self):
        self.calls.append("after")
        return self.inner.after()

    def cancel(self):
        self.calls.append("cancel")
        self.inner.cancel()

    M_batch = property(lambda self: self.inner.M_batch)
    M_probe = property(lambda self: self.inner.M_probe)


def test_a_probe_route_swapped_into_the_trainer_is_driven_through_the_interface(tmp_path):
    rows = {}
    for name in ("plain", "swapped"):
        model, tok = warm_model()
        cfg = TrainConfig(out_dir=str(tmp_path / name), steps=2, prompts_per_step=3, group_size=4, probe_prompts=2,
                          probe_group_size=4, progress=False, num_threads=1, device="cpu", lr=3e-4, probe_every=1,
                          checkpoint_every=0)
        tr = Trainer(cfg, model=model, tokenizer=tok)
        if name == "swapped":
            tr.probe = _Recording(tr.probe)
        rows[name] = [tr.train_step() for _ in range(2)]
    assert tr.probe.calls == [("before", True, True), "after"] * 2
    for a, b in zip(rows["plain"], rows["swapped"]):
        a.pop("step_time"), b.pop("step_time")
        assert a.keys() == b.keys() and any(k.startswith("gap/") for k in a)
        assert all(a[k] == b[k] or (a[k] != a[k] and b[k] != b[k]) for k in a), a
