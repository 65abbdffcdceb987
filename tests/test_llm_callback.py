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
    cb = GapProbeCallback(tok, num_generations=G, log_path=tmp_path / "gap.jsonl")
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



def test_callback_rejects_reused_batches():
    from types import SimpleNamespace

    cb = GapProbeCallback(object(), num_generations=4)
    with pytest.raises(ValueError, match="num_iterations"):
        cb.on_train_begin(SimpleNamespace(num_iterations=2, gradient_accumulation_steps=1), None, None)
    with pytest.raises(ValueError, match="num_generations"):
        GapProbeCallback(object(), num_generations=1)
