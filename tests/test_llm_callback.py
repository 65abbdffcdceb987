"""GapProbeCallback on a real trl.GRPOTrainer run (CPU, tiny warmed Qwen, optim="sgd", 3 steps).

With SGD the parameter change is exactly -lr * (clipped) grad, so the callback's dmu_update must equal
lr * dmu_grad prompt by prompt, and the update is nonzero exactly when some group's rewards differ. Attached
first, the callback's metrics appear in TRL's own log rows (``trainer.state.log_history``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("trl")
pytest.importorskip("datasets")

from llm_probe.callback import GapProbeCallback  # noqa: E402
from llm_probe.tasks import AdditionTask  # noqa: E402
from tests.llm_helpers import warm_model  # noqa: E402

pytestmark = pytest.mark.llm


def test_callback_on_real_grpo_trainer(tmp_path):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    model, tok = warm_model()
    probs = AdditionTask().sample(np.random.default_rng(0), 16)
    ds = Dataset.from_dict({"prompt": [p.prompt for p in probs], "answer": [p.answer for p in probs]})

    def exact_match(prompts, completions, completion_ids=None, answer=None, **kw):
        return [float(c.strip() == a) for c, a in zip(completions, answer)]

    G, lr = 4, 0.05
    cb = GapProbeCallback(tok, num_generations=G, probe_every=1, log_path=tmp_path / "gap.jsonl")
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2 * G, num_generations=G,
                      max_completion_length=6, max_steps=3, learning_rate=lr, optim="sgd", lr_scheduler_type="constant",
                      use_cpu=True, bf16=False, report_to="none", gradient_checkpointing=False, logging_steps=1,
                      save_strategy="no", temperature=1.0, beta=0.0, seed=0, max_grad_norm=1e9, warmup_steps=0)
    trainer = GRPOTrainer(model=model, reward_funcs=cb.wrap_reward(exact_match), args=args, train_dataset=ds,
                          processing_class=tok)
    cb.attach(trainer)
    assert trainer.callback_handler.callbacks[0] is cb
    trainer.train()
    assert len(cb.history) == 3
    for row in cb.history:
        mixed = row["gap/n_prompts"] > 0
        if mixed:
            assert row["update_norm"] > 0
            d_u, d_g = torch.tensor(row["gap/dmu_update"]), torch.tensor(row["gap/dmu_grad"])
            torch.testing.assert_close(d_u, lr * d_g, rtol=2e-3, atol=1e-6)
        else:
            assert row["update_norm"] == 0.0  # all groups equal: zero gradient, SGD does not move
    assert (tmp_path / "gap.jsonl").read_text().count("\n") == 3
    assert any(r["gap/n_prompts"] > 0 for r in cb.history)  # not vacuous: some step had a mixed group
    # TRL-native logging: one log row per step (logging_steps=1) holds TRL's metrics and this step's gap metrics
    logged = [h for h in trainer.state.log_history if "gap/M_batch" in h]
    assert [h["step"] for h in logged] == [1, 2, 3]  # TRL counts steps done; history rows the step's index
    assert [r["step"] for r in cb.history] == [0, 1, 2]
    for h, row in zip(logged, cb.history):
        assert "reward" in h and "entropy" in h  # TRL's own metrics, same row
        for k in ("gap/n_prompts", "gap/M_batch", "update_norm", "gap/dmu_update_mean", "gap/dphi_mean"):
            if k in row:
                assert h[k] == row[k], k



def test_reused_batches_measure_the_net_update_against_gaps_at_theta_k(tmp_path):
    """num_iterations = 2: TRL reuses each generation batch for two optimizer steps. The row of steps (k, k+1) has
    dmu_update_q = <theta_{k+2} - theta_k, g_q(theta_k)>, checked against parameter snapshots taken by another
    callback and gaps from one autograd backward per completion (unpadded)."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from llm_probe.model import completion_logprobs

    model, tok = warm_model()
    probs = AdditionTask().sample(np.random.default_rng(1), 16)
    ds = Dataset.from_dict({"prompt": [p.prompt for p in probs], "answer": [p.answer for p in probs]})

    def exact_match(prompts, completions, completion_ids=None, answer=None, **kw):
        return [float(c.strip() == a) for c, a in zip(completions, answer)]

    class Snapshots(TrainerCallback):
        def __init__(self):
            self.theta = {}

        def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
            self.theta.setdefault(state.global_step, [p.detach().clone() for p in model.parameters()])

    G, lr, mu = 4, 0.05, 2
    cb = GapProbeCallback(tok, num_generations=G, probe_every=1, rollout_path=tmp_path / "rollout.jsonl")
    snaps = Snapshots()
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2 * G, num_generations=G,
                      max_completion_length=6, max_steps=2 * mu + 1, learning_rate=lr, optim="sgd",
                      lr_scheduler_type="constant", use_cpu=True, bf16=False, report_to="none",
                      gradient_checkpointing=False, logging_steps=1, save_strategy="no", temperature=1.0, beta=0.0,
                      seed=0, max_grad_norm=1e9, warmup_steps=0, num_iterations=mu)
    trainer = GRPOTrainer(model=model, reward_funcs=cb.wrap_reward(exact_match), args=args, train_dataset=ds,
                          processing_class=tok, callbacks=[snaps])
    cb.attach(trainer)
    trainer.train()
    snaps.theta[2 * mu + 1] = [p.detach().clone() for p in model.parameters()]
    assert [r["step"] for r in cb.history] == [0, mu]  # the batch of step 2 mu is still in use at the end
    rows = [__import__("json").loads(x) for x in (tmp_path / "rollout.jsonl").read_text().splitlines()]
    checked = 0
    for row in cb.history:
        k = row["step"]
        delta = [b - a for a, b in zip(snaps.theta[k], snaps.theta[k + mu])]
        assert row["update_norm"] == pytest.approx(float(torch.sqrt(sum((d ** 2).sum() for d in delta))), rel=1e-5)
        ref, _ = warm_model()  # a fresh module: the trainer rebinds the forward of the one it trained
        with torch.no_grad():
            for p, v in zip(ref.parameters(), snaps.theta[k]):
                p.copy_(v)
        batch = [r for r in rows if r["step"] == k]
        assert len(batch) == 2 * G
        dmu = []
        for q in range(len(batch) // G):
            group = batch[q * G:(q + 1) * G]
            won = [r["reward"] > 0 for r in group]
            if all(won) or not any(won):
                continue
            scores = []
            for r in group:  # one backward per completion: its score d log pi(o) / d theta
                ids = tok([r["prompt"]], return_tensors="pt", add_special_tokens=False)
                cids = torch.tensor([r["completion_ids"]])
                ref.zero_grad()
                completion_logprobs(ref, ids["input_ids"], ids["attention_mask"], cids, torch.ones_like(cids,
                                    dtype=torch.float32)).sum().backward()
                scores.append([torch.zeros_like(p) if p.grad is None else p.grad.detach().clone() for p in ref.parameters()])
            gap = [sum(s[i] for s, w in zip(scores, won) if w) / sum(won)
                   - sum(s[i] for s, w in zip(scores, won) if not w) / (G - sum(won)) for i in range(len(delta))]
            dmu.append(float(sum((d * g).sum() for d, g in zip(delta, gap))))
        torch.testing.assert_close(torch.tensor(row["gap/dmu_update"]), torch.tensor(dmu), rtol=1e-4, atol=1e-7)
        checked += len(dmu)
    assert checked > 0, "no mixed group: the check would be vacuous"


def test_callback_rejects_bad_batch_settings():
    from types import SimpleNamespace

    cb = GapProbeCallback(object(), num_generations=4)
    with pytest.raises(ValueError, match="num_iterations"):
        cb.on_train_begin(SimpleNamespace(num_iterations=0, gradient_accumulation_steps=1), None, None)
    with pytest.raises(ValueError, match="steps_per_generation"):
        cb.on_train_begin(SimpleNamespace(num_iterations=1, gradient_accumulation_steps=1, steps_per_generation=2),
                          None, None)
    with pytest.raises(ValueError, match="num_generations"):
        GapProbeCallback(object(), num_generations=1)
