"""The offline route on what GapProbeCallback records from a TRL run with a BOS-adding tokenizer, conversational
prompts and temperature 0.7: the ``rollout_path`` lines carry the prompt ids TRL generated from and the
temperature, and ``llm_probe.offline.analyse`` on two saved checkpoints (theta_k, theta_{k+1}) and those lines
gives the gap norms and dmu of the float64 per-sequence reference (tests/test_llm_trl_matrix.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("trl")
pytest.importorskip("datasets")

from llm_probe.callback import GapProbeCallback  # noqa: E402
from llm_probe.model import build_tiny_qwen, save_policy  # noqa: E402
from tests.test_llm_trl_matrix import G, SPEC, _reference_prompt_ids, _score, _tokenizer  # noqa: E402

pytestmark = pytest.mark.llm
torch.set_num_threads(1)


def test_offline_analysis_of_the_recorded_rollout_matches_the_reference(tmp_path):
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from llm_probe.offline import analyse

    tok, T = _tokenizer("bos"), 0.7
    model = build_tiny_qwen(tok, SPEC, seed=1)
    state0 = {k: v.clone() for k, v in model.state_dict().items()}
    rng = np.random.default_rng(1)
    ds = Dataset.from_dict({"prompt": [[{"role": "user", "content": f"{a}+{b}"}]
                                       for a, b in rng.integers(1, 1000, size=(8, 2))]})
    seen = []

    def parity(prompts, completions, completion_ids=None, **kw):
        r = [float(sum(c) % 2) for c in completion_ids]
        seen.append((list(prompts), [list(c) for c in completion_ids], r))
        return r

    class Snap(TrainerCallback):
        theta = None

        def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
            self.theta = self.theta or {n: p.detach().clone() for n, p in model.named_parameters()}

    snap = Snap()
    cb = GapProbeCallback(tok, G, probe_every=1, rollout_path=tmp_path / "rollout.jsonl")
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2 * G, num_generations=G,
                      max_completion_length=6, max_steps=1, learning_rate=0.05, optim="sgd",
                      lr_scheduler_type="constant", use_cpu=True, bf16=False, report_to="none", logging_steps=1,
                      save_strategy="no", temperature=T, beta=0.0, seed=0, max_grad_norm=1e9, warmup_steps=0)
    trainer = GRPOTrainer(model=model, reward_funcs=cb.wrap_rewards([parity]), args=args, train_dataset=ds,
                          processing_class=tok, callbacks=[snap])
    cb.attach(trainer)
    trainer.train()
    (ps, cids, r), = seen
    lines = [json.loads(x) for x in (tmp_path / "rollout.jsonl").read_text().splitlines()]
    assert len(lines) == len(cids)  # every group decided (parity rewards)
    for ln, p, c in zip(lines, ps, cids):
        assert ln["prompt_ids"] == _reference_prompt_ids(tok, p) and ln["completion_ids"] == c
        assert ln["temperature"] == T and ln["prompt_ids"][0] != tok.bos_token_id  # chat template: no BOS added
    for name, theta in (("before", snap.theta), ("after", dict(model.named_parameters()))):
        m = build_tiny_qwen(tok, SPEC, seed=1)
        m.load_state_dict(state0)
        with torch.no_grad():
            for n, q in m.named_parameters():
                q.copy_(theta[n])
        save_policy(m, tok, tmp_path / name)
    res = analyse(tmp_path / "before", tmp_path / "after", tmp_path / "rollout.jsonl")

    ref = build_tiny_qwen(tok, SPEC, seed=1, dtype="float64")
    ref.load_state_dict({k: v.double() for k, v in state0.items()})
    with torch.no_grad():
        for n, q in ref.named_parameters():
            q.copy_(snap.theta[n].double())
    names, params = zip(*ref.named_parameters())
    d = torch.cat([(model.get_parameter(n).detach() - snap.theta[n]).double().reshape(-1) for n in names])
    scores = torch.stack([_score(ref, _reference_prompt_ids(tok, p), c, T, list(params))[0] for p, c in zip(ps, cids)])
    won = (np.array(r) > 0).reshape(-1, G)
    gaps = [scores[b * G:(b + 1) * G][torch.tensor(w)].mean(0) - scores[b * G:(b + 1) * G][torch.tensor(~w)].mean(0)
            for b, w in enumerate(won) if w.any() and (~w).any()]
    assert gaps and len(res["gap_norm"]) == len(gaps)
    norms, dmu = torch.stack([g.norm() for g in gaps]), torch.stack([g @ d for g in gaps])
    err_n = float((res["gap_norm"] - norms).abs().max() / norms.abs().max())
    err_d = float((res["dmu"] - dmu).abs().max() / dmu.abs().max())
    print(f"\noffline vs float64 reference: gap norm {err_n:.1e}, dmu {err_d:.1e}")
    assert err_n <= 1e-5 and err_d <= 1e-5


def test_measure_encodes_prompts_with_special_tokens_when_asked():
    """measure(add_special_tokens=True) on text equals measure on the token ids a BOS-adding tokenizer gives
    (what TRL encodes plain prompts to), and differs from the text encoded without them."""
    from llm_probe.measure import measure

    tok = _tokenizer("bos")
    model = build_tiny_qwen(tok, SPEC, seed=0)
    prompts = ["1+2="] * 4 + ["12+345="] * 4
    comps = ["3", "4", "30", "3"] * 2
    rewards = [1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0]
    ids = [tok(p)["input_ids"] for p in prompts]
    assert all(i[0] == tok.bos_token_id for i in ids)
    c_ids = [tok(c, add_special_tokens=False)["input_ids"] for c in comps]
    a = measure(model, tok, prompts, comps, rewards, add_special_tokens=True, temperature=0.7)
    b = measure(model, None, ids, c_ids, rewards, temperature=0.7)
    c = measure(model, tok, prompts, comps, rewards, temperature=0.7)
    torch.testing.assert_close(a["gap_norm"], b["gap_norm"], rtol=0, atol=0)
    assert float((a["gap_norm"] - c["gap_norm"]).abs().max()) > 1e-4 * float(a["gap_norm"].abs().max())
