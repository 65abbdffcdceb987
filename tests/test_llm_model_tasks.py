"""Tiny Qwen policy (build, save/load round trip), tokenizer, tasks and answer checking, warm-up."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from llm_probe.model import completion_logprobs, load_policy, save_policy
from llm_probe.tasks import AdditionTask, JsonlTask, Problem, check_answer, extract_answer, load_jsonl_problems, normalize_answer
from llm_probe.tokenizer import build_char_tokenizer, load_tokenizer
from llm_probe.warmup import sampled_accuracy, warmup
from tests.llm_helpers import SMALL, sampled_rollout, tiny

pytestmark = pytest.mark.llm


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_save_load_round_trip_same_logits(tmp_path, arch):
    model, tok = tiny(arch, seed=11)
    ids = torch.tensor([tok("12+34=46", add_special_tokens=False)["input_ids"]])
    before = model(input_ids=ids).logits
    save_policy(model, tok, tmp_path)
    m2, t2 = load_policy(tmp_path, device="cpu")
    assert type(m2) is type(model) and m2.config._attn_implementation == "eager"
    assert t2("12+34=46", add_special_tokens=False)["input_ids"] == ids[0].tolist()
    torch.testing.assert_close(m2(input_ids=ids).logits, before, rtol=0, atol=0)
    if arch == "qwen3":
        assert m2.config.head_dim == SMALL.head_dim


def test_load_errors(tmp_path):
    with pytest.raises(ValueError, match="local_dir"):
        load_policy(tmp_path)
    with pytest.raises(ValueError, match="local_dir"):
        load_tokenizer(tmp_path / "missing")
    with pytest.raises(ValueError, match="alphabet"):
        build_char_tokenizer("")


def test_char_tokenizer_round_trip():
    tok = build_char_tokenizer("0123456789+= abc")
    s = "12 + ab=3"
    ids = tok(s, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(s) and tok.decode(ids) == s
    assert tok.eos_token_id == 1 and tok.pad_token_id == 0
    assert tok("z", add_special_tokens=False)["input_ids"] == [tok.unk_token_id]


def test_left_padding_does_not_change_logprobs():
    """Position ids follow the attention mask: a left-padded prompt scores its completion like an unpadded one."""
    model, tok = tiny(seed=2)
    c = torch.tensor([[5, 6, 1]])
    cm = torch.ones(1, 3)
    p = torch.tensor([tok("12+3=", add_special_tokens=False)["input_ids"]])
    a = completion_logprobs(model, p, torch.ones_like(p), c, cm)
    pp = torch.cat([torch.zeros(1, 2, dtype=torch.long), p], 1)
    pm = torch.cat([torch.zeros(1, 2, dtype=torch.long), torch.ones_like(p)], 1)
    b = completion_logprobs(model, pp, pm, c, cm)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_addition_task_is_deterministic_and_strict():
    t = AdditionTask()
    a = t.sample(np.random.default_rng(3), 5)
    assert a == t.sample(np.random.default_rng(3), 5)
    for p in a:
        x, y = p.prompt[:-1].split("+")
        assert int(p.answer) == int(x) + int(y) and 10 <= int(x) <= 99
    p = Problem("12+34=", "46")
    assert t.reward("46", p, terminated=True) == 1.0
    assert t.reward("46", p, terminated=False) == 0.0  # no <eos>: format violated
    assert t.reward("046", p, terminated=True) == 0.0 and t.reward("46 ", p, terminated=True) == 0.0


def test_rollout_rewards_follow_the_task():
    model, tok = tiny(seed=1)
    ro = sampled_rollout(model, tok, B=2, G=3, T=4, seed=0, rewards=torch.zeros(2, 3))
    assert ro.completion_ids.shape[0] == 6 and ro.completion_mask.shape == ro.completion_ids.shape
    # the mask is 1 up to and including the first <eos>, 0 after
    for row, m in zip(ro.completion_ids.tolist(), ro.completion_mask.tolist()):
        if tok.eos_token_id in row:
            k = row.index(tok.eos_token_id)
            assert m[: k + 1] == [1.0] * (k + 1) and sum(m) == k + 1


EXTRACT = [("so the answer is \\boxed{42}.", "42"), ("blah #### 1,234", "1,234"), ("first 3 then 17", "17"),
           ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"), ("no number", None)]
CHECK = [("\\boxed{42}", "42", True), ("#### 1,000", "1000", True), ("The answer is 3.50", "3.5", True),
         ("\\boxed{\\frac{1}{2}}", "0.5", True), ("$12", "12", True), ("12.0", "12", True), ("13", "12", False),
         ("", "12", False), ("x = 2/3", "4/6", True), ("50%", "50", True),
         ("Janet has 5 ... #### 18", "He earns ... #### 18", True)]


def test_extract_and_check_answer():
    from tests.tables import check_table

    def extract_row(text, ans):
        assert extract_answer(text) == ans

    def check_row(got, ref, ok):
        assert check_answer(got, ref) is ok

    check_table(((f"extract {t!r}", (t, a)) for t, a in EXTRACT), extract_row)
    check_table(((f"check {g!r} vs {r!r}", (g, r, ok)) for g, r, ok in CHECK), check_row)


def test_normalize_answer_text():
    assert normalize_answer("  Paris ") == "paris"


def test_jsonl_loader(tmp_path):
    f = tmp_path / "qa.jsonl"
    f.write_text(json.dumps({"question": "1+1?", "answer": "It is 2.\n#### 2"}) + "\n\n"
                 + json.dumps({"question": "Capital?", "answer": "Paris"}) + "\n")
    probs = load_jsonl_problems(f)
    assert probs == [Problem("1+1?", "2"), Problem("Capital?", "Paris")]
    task = JsonlTask(f)
    assert task.reward("so \\boxed{2}", probs[0], terminated=True) == 1.0
    assert task.reward("3", probs[0], terminated=True) == 0.0
    assert len(task.sample(np.random.default_rng(0), 5)) == 5


JSONL_ERRORS = [("", "empty"), ("\n\n", "empty"), ("{bad json\n", "not valid JSON"), ("[1, 2]\n", "JSON object"),
                ('{"question": "q"}\n', "answer"), ('{"question": "", "answer": "1"}\n', "question"),
                ('{"question": "q", "answer": null}\n', "answer"), ('{"question": "q", "answer": [1]}\n', "answer")]


def test_jsonl_errors(tmp_path):
    from tests.tables import check_table, raises_value_error

    def row(content, msg):
        f = tmp_path / "x.jsonl"
        f.write_text(content)
        raises_value_error(lambda: load_jsonl_problems(f), msg)

    check_table(((repr(c), (c, m)) for c, m in JSONL_ERRORS), row)


def test_jsonl_missing_file(tmp_path):
    with pytest.raises(ValueError, match="existing JSONL"):
        load_jsonl_problems(tmp_path / "none.jsonl")


def test_warmup_gives_mixed_success():
    """A short warm-up lowers the loss and moves J off 0 (the cached session model: 0 < J < 1)."""
    from tests.llm_helpers import warm_model

    model, tok = tiny(seed=0)
    losses = warmup(model, tok, AdditionTask(), steps=30, batch_size=64, lr=3e-3, seed=0)
    assert losses[-1] < 0.8 * losses[0]
    wm, wt = warm_model()
    J = sampled_accuracy(wm, wt, AdditionTask(), n=128, seed=1)
    assert 0.05 < J < 0.95, J
