"""llm_probe.safe_step: the JVP against finite differences of log-probs, the controller against a direct
computation of its rule, and the TRL callback on a real 3-step GRPOTrainer run (gradient accumulation)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import gapdyn
from llm_probe.losses import policy_loss
from llm_probe.model import completion_logprobs
from llm_probe.safe_step import SafeStepController, completion_logprob_jvp
from tests.llm_helpers import sampled_rollout, tiny, warm_model

pytestmark = pytest.mark.llm


def _seq_logp(model, ro):
    with torch.no_grad():
        return completion_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask).sum(-1)


def _adam_with_gradient(model, ro, lr):
    """An Adam optimizer holding the GRPO gradient of ``ro`` (step not taken)."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    logp = completion_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask)
    res = policy_loss("grpo", logp, logp.detach(), ro.completion_mask, ro.rewards, max_completion_length=5)
    res.loss.backward()
    return opt


def _fd_x(model, ro, theta_k, d, h=1e-4):
    """x_n by central differences of log pi(o_n) along d at theta_k (an independent route to the JVP)."""
    params = dict(model.named_parameters())
    cur = {n: p.detach().clone() for n, p in params.items()}
    out = []
    for s in (h, -h):
        with torch.no_grad():
            for n in d:
                params[n].copy_(theta_k[n] + s * d[n])
        out.append(_seq_logp(model, ro))
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(cur[n])
    return ((out[0] - out[1]) / (2 * h)).double()


def _direction(model, scale=0.05, seed=0):
    """A random direction on every parameter, zero on the embedding's padding row (backward's convention)."""
    g = torch.Generator().manual_seed(seed)
    d = {n: scale * torch.randn(p.shape, generator=g, dtype=p.dtype) for n, p in model.named_parameters()}
    emb = model.get_input_embeddings()
    for n, p in model.named_parameters():
        if p is emb.weight and emb.padding_idx is not None:
            d[n][emb.padding_idx] = 0.0
    return d


def _backward_x(model, ro, d):
    """x_n = <grad log pi(o_n), d> with one backward per completion (reverse mode: an independent route)."""
    names = [n for n, _ in model.named_parameters()]
    plist = [p for _, p in model.named_parameters()]
    lp = completion_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask).sum(-1)
    out = []
    for i in range(lp.shape[0]):
        gr = torch.autograd.grad(lp[i], plist, retain_graph=True, allow_unused=True)
        out.append(sum(float((gi * d[n]).sum()) for gi, n in zip(gr, names) if gi is not None))
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("tied", [False, True])
def test_jvp_matches_backward_and_finite_differences(tied):
    """Forward mode (one JVP) = reverse mode <grad log pi(o_n), d> to float32 round-off; = central finite differences
    of log pi along d to 1e-3 of max|x| (the tiny Qwen's RMSNorm computes in float32 even in a float64 model,
    so differences of log-probs carry ~1e-7 noise: h = 1e-4 balances it against the O(h^2) truncation)."""
    from llm_probe.model import TinyQwenSpec

    from tests.llm_helpers import SMALL

    spec = TinyQwenSpec(**{**SMALL.__dict__, "tie_word_embeddings": tied})
    model, tok = tiny(spec=spec, dtype="float64")
    ro = sampled_rollout(model, tok, B=3, G=4, T=5, seed=1)
    theta = {n: p.detach().clone() for n, p in model.named_parameters()}
    d = _direction(model)
    x = completion_logprob_jvp(model, ro, theta, d)
    torch.testing.assert_close(x, _backward_x(model, ro, d), rtol=1e-5, atol=1e-7)  # float32 RMSNorm inside
    fd = _fd_x(model, ro, theta, d, h=1e-4)
    assert float((x - fd).abs().max()) <= 1e-3 * float(x.abs().max())


@pytest.mark.parametrize("lr, delta", [(1e-3, 2.0), (3e-2, 2.0), (3e-2, 0.05)])
def test_controller_applies_its_rule_exactly(lr, delta):
    """After a real Adam step: theta = theta_k + a d exactly, with a the gapdyn rule on reverse-mode x."""
    model, tok = tiny(dtype="float64")
    ro = sampled_rollout(model, tok, B=4, G=4, T=5, seed=2)
    ctl = SafeStepController(model, delta=delta)
    opt = _adam_with_gradient(model, ro, lr)
    ctl.before()
    theta_k = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt.step()
    proposed = {n: p.detach().clone() for n, p in model.named_parameters()}
    d = {n: proposed[n] - theta_k[n] for n in theta_k}
    res = ctl.after(ro)
    now = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(theta_k[n])
    x_direct = _backward_x(model, ro, d)  # reverse mode at theta_k (Adam leaves the padding row at 0)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(now[n])
    groups = np.repeat(np.arange(ro.B), ro.G)
    direct = gapdyn.safe_step_multiplier(x_direct.numpy(), ro.rewards.reshape(-1).numpy(), groups, delta=delta)
    assert res.rule.n_mixed == direct.n_mixed == ro.B
    np.testing.assert_allclose([res.rule.dmu_hat, res.rule.sd_hat], [direct.dmu_hat, direct.sd_hat], rtol=1e-5)
    assert res.rule.a == pytest.approx(direct.a, rel=1e-5, abs=1e-12)
    for n, p in model.named_parameters():
        assert torch.equal(p.detach(), theta_k[n] + res.rule.a * d[n]), n
    assert 0.0 <= res.rule.a <= 1.0
    assert not ctl.pending


def test_controller_validates():
    model, _ = tiny()
    with pytest.raises(ValueError, match="delta"):
        SafeStepController(model, delta=0.0)
    with pytest.raises(ValueError, match="c"):
        SafeStepController(model, c=float("nan"))
    with pytest.raises(RuntimeError, match="before"):
        SafeStepController(model).after(None)
    with pytest.raises(ValueError, match="theta_k"):
        SafeStepController(model).after(None, theta_k={})


def test_callback_on_real_grpo_trainer_with_accumulation(tmp_path):
    """3 optimizer steps of trl.GRPOTrainer (Adam, 2 accumulation steps): after each step the parameters are
    theta_k + a (theta' - theta_k), theta' the optimizer's own result (read by a callback before ours)."""
    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from llm_probe.safe_step import SafeStepCallback
    from llm_probe.tasks import AdditionTask

    model, tok = warm_model()
    probs = AdditionTask().sample(np.random.default_rng(0), 32)
    ds = Dataset.from_dict({"prompt": [p.prompt for p in probs], "answer": [p.answer for p in probs]})

    def exact_match(prompts, completions, completion_ids=None, answer=None, **kw):
        return [float(c.strip() == a) for c, a in zip(completions, answer)]

    class Spy(TrainerCallback):
        def __init__(self):
            self.rows = []

        def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
            self.rows.append({"k": {n: p.detach().clone() for n, p in model.named_parameters()}})

        def on_optimizer_step(self, args, state, control, model=None, **kw):
            self.rows[-1]["proposed"] = {n: p.detach().clone() for n, p in model.named_parameters()}

    class After(TrainerCallback):
        def __init__(self):
            self.rows = []

        def on_optimizer_step(self, args, state, control, model=None, **kw):
            self.rows.append({n: p.detach().clone() for n, p in model.named_parameters()})

    G = 4
    spy, cb, after = Spy(), SafeStepCallback(tok, num_generations=G, delta=0.5), After()
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2 * G, num_generations=G,
                      gradient_accumulation_steps=2, max_completion_length=6, max_steps=3, learning_rate=1e-2,
                      lr_scheduler_type="constant", use_cpu=True, bf16=False, report_to="none",
                      gradient_checkpointing=False, logging_steps=1, save_strategy="no", temperature=1.0, beta=0.0,
                      seed=0, warmup_steps=0)
    trainer = GRPOTrainer(model=model, reward_funcs=cb.wrap_reward(exact_match), args=args, train_dataset=ds,
                          processing_class=tok, callbacks=[spy, cb, after])
    trainer.train()
    assert len(cb.history) == len(spy.rows) == len(after.rows) == 3
    for row, s, new in zip(cb.history, spy.rows, after.rows):
        a = row["safe/a"]
        assert 0.0 <= a <= 1.0
        for n in new:
            d = s["proposed"][n] - s["k"][n]
            assert torch.equal(new[n], s["k"][n] + a * d), n
    assert any(r["safe/n_mixed"] > 0 for r in cb.history)  # not vacuous: the rule saw a mixed group


# --- the experiment's analysis (llm_probe.experiments.safe_step_experiment) -------------------------------------------


def test_steps_to_level_matches_a_loop():
    from llm_probe.experiments.safe_step_experiment import steps_to_level

    rng = np.random.default_rng(0)
    for _ in range(200):
        r = rng.random(rng.integers(1, 30))
        level, w = rng.uniform(0.2, 0.8), int(rng.integers(1, 6))
        expect = next((k for k in range(w - 1, len(r)) if sum(r[k - w + 1:k + 1]) / w >= level), None)
        assert steps_to_level(r, level, w) == expect  # continuous draws: no ties at the level


def test_gapdyn_train_safe_step_cli(tmp_path, capsys, monkeypatch):
    """``gapdyn train --method grpo --lr 1e-3 --safe-step`` runs; each step logs the rule (safe/a in [0, 1])."""
    import json

    monkeypatch.chdir(tmp_path)  # the warm-up cache lives under ./gapdyn_out

    from llm_probe.cli import main
    from llm_probe.config import TrainConfig

    rc = main(["--method", "grpo", "--lr", "1e-3", "--safe-step", "--out", str(tmp_path), "--steps", "2",
               "--warmup-steps", "5", "--prompts-per-step", "2", "--group-size", "4", "--probe-every", "0",
               "--num-threads", "1", "--no-progress", "--device", "cpu"])
    assert rc == 0
    rows = [json.loads(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(0.0 <= r["safe/a"] <= 1.0 for r in rows)
    for bad, flag in ((dict(safe_step_c=0.0), "--safe-step-c"), (dict(safe_step_delta=float("inf")), "--safe-step-delta")):
        with pytest.raises(ValueError, match=flag):
            TrainConfig(out_dir=str(tmp_path), **bad)


@pytest.mark.slow
def test_experiment_test_mode_runs_and_resumes(tmp_path, capsys, monkeypatch):
    """``--mode test`` end to end: claims.json, one run.json per (arm, lr, seed); a second call re-runs nothing."""
    import json

    monkeypatch.chdir(tmp_path)  # the warm-up cache lives under ./gapdyn_out

    from llm_probe.cli import main
    from llm_probe.experiments.safe_step_experiment import MODES, run_dir

    assert main(["safe-step", "--mode", "test", "--out", str(tmp_path), "--no-progress"]) == 0
    exp = MODES["test"]
    done = {p: p.stat().st_mtime_ns for p in (tmp_path / "runs").glob("*/run.json")}
    assert len(done) == len(exp.methods) * (len(exp.collapse_lrs) + 1) * len(exp.seeds) * 2
    assert json.loads((tmp_path / "claims.json").read_text())
    assert (run_dir(tmp_path, "grpo", "safe", exp.safe_lr, 0) / "run.json").exists()
    assert main(["safe-step", "--mode", "test", "--out", str(tmp_path), "--no-progress"]) == 0
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "runs").glob("*/run.json")} == done


def test_safe_step_cell_from_init_from_equals_the_front_end_run(tmp_path, monkeypatch):
    """The protocol's run_cell (its own folder) and the front end's run of the same (method, arm, lr, seed) from
    the same --init-from model give the same run.json (wall time aside); --init-from skips the warm-up."""
    import dataclasses
    import json

    from llm_probe.experiments import safe_step_experiment as sse
    from llm_probe.model import save_policy

    monkeypatch.chdir(tmp_path)
    model, tok = warm_model()
    save_policy(model, tok, tmp_path / "mine")
    import importlib

    wu = importlib.import_module("llm_probe.warmup")
    monkeypatch.setattr(wu, "warmup", lambda *a, **k: (_ for _ in ()).throw(AssertionError("warmed up")))
    exp = dataclasses.replace(sse.MODES["test"], seeds=(0,), steps=2, tail=1, window=1,
                              init_from=str(tmp_path / "mine"))
    cell = next(c for c in sse.cells(exp) if c["arm"] == "safe")
    got = sse.run_cell(**cell)
    row = json.loads(got["run_json"].iloc[0])
    d = sse.run_dir(tmp_path / "front", cell["method"], "safe", cell["lr"], 0)
    want = sse._one_run(exp, tmp_path / "front", exp.init_from, cell["method"], "safe", cell["lr"], 0)
    drop = ("wall_s", "step_time")
    assert {k: v for k, v in row.items() if k not in drop} == {k: v for k, v in want.items() if k not in drop}
    assert (d / "run.json").exists() and not (tmp_path / "gapdyn_out" / "warm").exists()
    assert got["outcome"].iloc[0] == row["outcome"] and sse.cell_folder(cell["settings"]).is_relative_to(tmp_path)
