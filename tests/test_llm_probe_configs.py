"""GapProbeCallback / SafeStepCallback on the tokenizer and TRL settings they accept: the same numbers whatever the
tokenizer's padding side (against an unpadded one-sequence-at-a-time reference), the trainer's group size and
reward weights read or refused, several reward functions recorded once with TRL's aggregate reward, and the
settings the probes cannot measure refused at ``on_train_begin``."""

from __future__ import annotations

import asyncio
import copy
import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("trl")
pytest.importorskip("datasets")

from llm_probe.callback import GapProbeCallback  # noqa: E402
from llm_probe.model import completion_logprobs  # noqa: E402
from llm_probe.rollout import encode_prompts, make_rollout  # noqa: E402
from llm_probe.tasks import AdditionTask  # noqa: E402
from llm_probe.tokenizer import build_char_tokenizer  # noqa: E402
from tests.llm_helpers import tiny, warm_model  # noqa: E402

pytestmark = pytest.mark.llm
torch.set_num_threads(1)

G = 4
PROMPTS = ["1+2=", "12+345="]  # 4 and 7 tokens: the shorter one is padded


def _tok(side: str):
    tok = build_char_tokenizer()
    tok.padding_side = side
    return tok


def _batch(tok, seed=0):
    """Prompts (G copies each), completion ids (digits then <eos>, lengths 1..4) and mixed 0/1 rewards."""
    g = torch.Generator().manual_seed(seed)
    digits = tok("0123456789", add_special_tokens=False)["input_ids"]
    prompts, cids = [], []
    for p in PROMPTS:
        for _ in range(G):
            n = int(torch.randint(0, 4, (1,), generator=g))
            cids.append([digits[int(i)] for i in torch.randint(0, 10, (n,), generator=g)] + [tok.eos_token_id])
            prompts.append(p)
    rewards = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    return prompts, cids, rewards


def _unpadded_scores(model, tok, prompt: str, cids: list[int]) -> list[torch.Tensor]:
    """d log pi(o | q) / d theta of one completion, prompt and completion as one unpadded row."""
    p = torch.tensor([tok(prompt, add_special_tokens=False)["input_ids"]])
    c = torch.tensor([cids])
    model.zero_grad()
    completion_logprobs(model, p, torch.ones_like(p), c, torch.ones_like(c, dtype=torch.float32)).sum().backward()
    return [torch.zeros_like(q) if q.grad is None else q.grad.detach().clone() for q in model.parameters()]


def _probe_one_step(model, tok, prompts, cids, rewards, grads, lr):
    """One probed SGD step through the callback's hooks (gradients set by hand); returns the history row."""
    cb = GapProbeCallback(tok, G, probe_every=1)
    f = cb.wrap_reward(lambda prompts, completions, completion_ids=None, **kw: rewards)
    f(prompts=prompts, completions=[""] * len(cids), completion_ids=cids)
    for q, gr in zip(model.parameters(), grads):
        q.grad = gr.clone()
    state = SimpleNamespace(global_step=0)
    cb.on_pre_optimizer_step(None, state, None, model=model)
    with torch.no_grad():
        for q in model.parameters():
            q -= lr * q.grad
    cb.on_optimizer_step(None, state, None, model=model)
    return cb.history[0]


def test_probe_numbers_do_not_depend_on_the_tokenizer_padding_side():
    """Prompts of 4 and 7 tokens: gap norms, dmu_update and dmu_grad per prompt are the same with a left- and a
    right-padding tokenizer, and equal the gaps from one unpadded backward per completion."""
    base, _ = tiny()
    prompts, cids, rewards = _batch(build_char_tokenizer())
    g = torch.Generator().manual_seed(3)
    grads = [torch.randn(q.shape, generator=g) * 1e-2 for q in base.parameters()]
    lr = 0.5
    ref = copy.deepcopy(base)
    gaps = []
    for b in range(len(PROMPTS)):
        rows = range(b * G, (b + 1) * G)
        won = [rewards[n] > 0 for n in rows]
        scores = [_unpadded_scores(ref, build_char_tokenizer(), prompts[n], cids[n]) for n in rows]
        gaps.append([sum(s[i] for s, w in zip(scores, won) if w) / sum(won)
                     - sum(s[i] for s, w in zip(scores, won) if not w) / (G - sum(won)) for i in range(len(grads))])
    norm = torch.tensor([float(torch.sqrt(sum((x ** 2).sum() for x in gp))) for gp in gaps])
    dmu_g = torch.tensor([float(sum((-gr * x).sum() for gr, x in zip(grads, gp))) for gp in gaps])
    for side in ("left", "right"):
        row = _probe_one_step(copy.deepcopy(base), _tok(side), prompts, cids, rewards, grads, lr)
        assert row["gap/n_prompts"] == 2
        torch.testing.assert_close(torch.tensor(row["gap/norm"]), norm, rtol=1e-4, atol=1e-7, msg=side)
        torch.testing.assert_close(torch.tensor(row["gap/dmu_grad"]), dmu_g, rtol=1e-4, atol=1e-7, msg=side)
        torch.testing.assert_close(torch.tensor(row["gap/dmu_update"]), lr * dmu_g, rtol=1e-4, atol=1e-7, msg=side)


def test_rollouts_are_left_padded_whatever_the_tokenizer_padding_side():
    """encode_prompts pads on the left for either tokenizer; make_rollout then samples the same completions, and
    their batch log-probs equal the unpadded one-row forward."""
    task = AdditionTask(lo=1, hi=999)  # prompts of 4 to 8 characters
    probs = task.sample(np.random.default_rng(0), 6)
    lengths = {len(p.prompt) for p in probs}
    assert len(lengths) > 1, "prompts of one length: nothing is padded"
    model, _ = tiny()
    outs = {}
    for side in ("left", "right"):
        tok = _tok(side)
        ids, mask = encode_prompts(tok, [p.prompt for p in probs])
        for row, m, p in zip(ids.tolist(), mask.tolist(), probs):
            n = len(p.prompt)
            assert m == [0] * (len(m) - n) + [1] * n
            assert row[len(row) - n:] == tok(p.prompt, add_special_tokens=False)["input_ids"]
        outs[side] = make_rollout(model, tok, task, probs, G=2, max_new_tokens=4,
                                  generator=torch.Generator().manual_seed(0))
    left, right = outs["left"], outs["right"]
    assert torch.equal(left.completion_ids, right.completion_ids) and left.texts == right.texts
    tok = build_char_tokenizer()
    with torch.no_grad():
        batch = completion_logprobs(model, right.prompt_ids, right.prompt_mask, right.completion_ids,
                                    right.completion_mask).sum(-1)
        for n in range(len(batch)):
            T = int(right.completion_mask[n].sum())
            p = torch.tensor([tok(probs[n // 2].prompt, add_special_tokens=False)["input_ids"]])
            c = right.completion_ids[n:n + 1, :T]
            one = completion_logprobs(model, p, torch.ones_like(p), c, torch.ones_like(c, dtype=torch.float32)).sum()
            assert float(batch[n]) == pytest.approx(float(one), rel=1e-5, abs=1e-6)


def _grpo_args(tmp_path, **kw):
    from trl import GRPOConfig

    base = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2 * G, num_generations=G,
                max_completion_length=6, max_steps=2, learning_rate=0.05, optim="sgd", lr_scheduler_type="constant",
                use_cpu=True, bf16=False, report_to="none", gradient_checkpointing=False, logging_steps=1,
                save_strategy="no", temperature=1.0, beta=0.0, seed=0, max_grad_norm=1e9, warmup_steps=0)
    return GRPOConfig(**{**base, **kw})


def test_group_size_is_read_from_the_trainer_args_or_a_mismatch_refused(tmp_path):
    from transformers import TrainerControl, TrainerState

    args = _grpo_args(tmp_path, num_generations=8, per_device_train_batch_size=8)
    with pytest.raises(ValueError, match="num_generations=4.*num_generations=8"):
        GapProbeCallback(build_char_tokenizer(), 4).on_train_begin(args, TrainerState(), TrainerControl())
    cb = GapProbeCallback(build_char_tokenizer())
    cb.on_train_begin(args, TrainerState(), TrainerControl())
    assert cb.G == 8
    with pytest.raises(ValueError, match="num_generations"):
        GapProbeCallback(build_char_tokenizer(), 1)


def test_safe_step_callback_refuses_reused_batches(tmp_path):
    """num_iterations = 2 would apply every second step on a batch unscaled: refused at on_train_begin."""
    from transformers import TrainerControl, TrainerState

    from llm_probe.safe_step import SafeStepCallback

    with pytest.raises(ValueError, match="num_iterations == 1, got num_iterations=2.*unscaled"):
        SafeStepCallback(build_char_tokenizer(), G).on_train_begin(_grpo_args(tmp_path, num_iterations=2),
                                                                   TrainerState(), TrainerControl())
    SafeStepCallback(build_char_tokenizer(), G).on_train_begin(_grpo_args(tmp_path), TrainerState(), TrainerControl())


def _reference_success(r: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Success 1 / 0 per completion from per-function rewards r [N, F] (NaN = None), NaN for every completion of
    a group holding one whose rewards are all None: a plain loop."""
    out = []
    for row in r:
        vals = [x * wi for x, wi in zip(row, w) if not math.isnan(x)]
        out.append(float(sum(vals) > 0) if vals else math.nan)
    out = np.array(out)
    for b in range(len(out) // G):
        if np.isnan(out[b * G:(b + 1) * G]).any():
            out[b * G:(b + 1) * G] = np.nan
    return out


def _code(c: str) -> int:
    return sum(map(ord, c)) % 6


def test_several_reward_functions_are_recorded_once_with_the_trl_aggregate(tmp_path):
    """Two reward functions (weights 1 and -0.5, some completions scored None by both) on a real GRPOTrainer: each
    generation batch is recorded once; success = TRL's nansum(w r) > 0, the all-None completions' groups left out;
    the rollout file's rewards equal the aggregate of what the functions returned; TRL logs the same mean."""
    from datasets import Dataset
    from trl import GRPOTrainer

    model, tok = warm_model()
    probs = AdditionTask().sample(np.random.default_rng(0), 16)
    ds = Dataset.from_dict({"prompt": [p.prompt for p in probs], "answer": [p.answer for p in probs]})
    returned = {"exact": [], "length": []}

    def exact(prompts, completions, completion_ids=None, answer=None, **kw):
        r = [None if _code(c) == 0 else float(c.strip() == a) for c, a in zip(completions, answer)]
        returned["exact"].append(r)
        return r

    def length(prompts, completions, completion_ids=None, **kw):
        r = [None if _code(c) in (0, 1) else float(len(c) > 2) for c in completions]  # 1: this one alone
        returned["length"].append(r)
        return r

    w = np.array([1.0, -0.5])
    cb = GapProbeCallback(tok, G, probe_every=1, rollout_path=tmp_path / "rollout.jsonl")
    funcs = cb.wrap_rewards([exact, length])  # weights read from the args
    trainer = GRPOTrainer(model=model, reward_funcs=funcs, args=_grpo_args(tmp_path, reward_weights=w.tolist()),
                          train_dataset=ds, processing_class=tok)
    cb.attach(trainer)
    trainer.train()
    assert len(returned["exact"]) == len(returned["length"]) == len(cb.history) == 2
    lines = [json.loads(x) for x in (tmp_path / "rollout.jsonl").read_text().splitlines()]
    n_none = n_checked = n_mixed = 0
    for k, row in enumerate(cb.history):
        r = np.array([returned["exact"][k], returned["length"][k]], dtype=float).T  # None -> NaN
        won = _reference_success(r, w)
        n_none += int(np.isnan(r).all(1).sum())
        groups = won.reshape(-1, G)
        mixed = [b for b in range(len(groups)) if not np.isnan(groups[b]).any() and 0 < groups[b].sum() < G]
        assert row["gap/n_prompts"] == len(mixed)
        step = [ln for ln in lines if ln["step"] == k]
        kept = ~np.isnan(won)
        assert len(step) == int(kept.sum())  # once per completion, the undecided groups left out
        agg = np.nansum(r * w, axis=1)[kept]
        np.testing.assert_allclose([ln["reward"] for ln in step], agg, rtol=1e-6)
        n_checked += len(step)
        n_mixed += len(mixed)
        logged = [h for h in trainer.state.log_history if h.get("step") == k + 1 and "reward" in h][0]
        scorable = ~np.isnan(r).all(1)
        assert logged["reward"] == pytest.approx(float(np.nansum(r * w, axis=1)[scorable].mean()), rel=1e-5)
    assert n_checked > 0 and n_none > 0 and n_mixed > 0  # not vacuous: rows kept, some scored None by both


def test_success_rules_none_rewards_and_async_functions():
    """wrap_rewards on hand-made batches: the default rule, a named function and a callable; None rewards; an
    async reward function; eval-mode batches are not recorded; a second wrap and a foreign trainer are refused."""
    tok = build_char_tokenizer()
    prompts, cids, _ = _batch(tok)
    r1 = [1.0, None, 0.0, None, 2.0, 0.0, -1.0, 0.0]
    r2 = [0.0, None, 3.0, 1.0, None, 0.0, 2.0, None]

    def f1(prompts, completions, completion_ids=None, **kw):
        return r1

    async def f2(prompts, completions, completion_ids=None, **kw):
        return r2

    r = np.array([r1, r2], dtype=float).T
    kw = dict(prompts=prompts, completions=[""] * len(cids), completion_ids=cids)
    for success, expect in ((None, None), ("f2", r[:, 1] > 0), (lambda r, R: r[:, 0] >= 1, r[:, 0] >= 1)):
        cb = GapProbeCallback(tok, G, probe_every=1)
        a, b = cb.wrap_rewards([f1, f2], weights=[1.0, 2.0], success=success)
        assert a(**kw) is r1 and asyncio.run(b(**kw)) is r2
        ro = cb.take_rollout("cpu")
        R = np.array([np.nan if np.isnan(x).all() else np.nansum(x * [1.0, 2.0]) for x in r])
        want = (R > 0 if expect is None else expect).astype(float)
        undecided = np.isnan(R) if success != "f2" else np.isnan(r[:, 1])
        want[undecided] = np.nan
        for g in range(2):
            if np.isnan(want[g * G:(g + 1) * G]).any():
                want[g * G:(g + 1) * G] = np.nan
        np.testing.assert_array_equal(ro.rewards.numpy().reshape(-1), want)
    cb = GapProbeCallback(tok, G, probe_every=1)
    (f,) = cb.wrap_rewards([f1])
    model, _ = tiny()
    cb.on_train_begin(SimpleNamespace(num_iterations=1, gradient_accumulation_steps=1), None, None, model=model)
    model.eval()
    f(**kw)
    assert cb.take_rollout("cpu") is None  # an evaluation batch
    model.train()
    f(**kw)
    assert cb.take_rollout("cpu").B == 2
    with pytest.raises(ValueError, match="one call"):
        cb.wrap_reward(f1)
    with pytest.raises(ValueError, match="not the 1 this callback wrapped"):
        cb.attach(SimpleNamespace(reward_funcs=[f1]))
    with pytest.raises(ValueError, match="2 reward weights"):
        cb.on_train_begin(SimpleNamespace(reward_weights=[1.0, 1.0]), None, None)
    cb2 = GapProbeCallback(tok, G, probe_every=1)
    g1, _ = cb2.wrap_rewards([f1, f2])
    g1(**kw)
    with pytest.raises(ValueError, match="never scored"):
        cb2.take_rollout("cpu")
