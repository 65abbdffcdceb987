"""Reliability of ``llm_probe``: malformed input at the public entry points (losses, tasks/JSONL, model
loading, trainer config, collapse detector) gives a clear ValueError or documented graceful handling;
extreme but valid inputs (logits of +-1e3, vocabularies of 1e5) give finite results equal to a float64
route; injected NaN/inf faults (loss, gradient hook, reward function) skip the step with weights AND
optimizer state intact, and repeated faults stop the run with a clear message; the collapse detector
on synthetic streams beyond the owner's (step onsets, slow drifts, NaN metrics: delay and false alarms
reported in RELIABILITY.md); same seed gives the same run (bitwise on CPU here; stated tolerance 1e-6).
The defects this suite found here were fixed by the owner (a089e95); their cases stay as regression tests."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from llm_probe.collapse import CollapseConfig, CollapseDetector, detection_stats, synthetic_stream
from llm_probe.config import TrainConfig
from llm_probe.losses import LOSS_NAMES, aggregate, compute_advantages, importance_ratio, policy_loss
from llm_probe.model import load_policy
from llm_probe.probes import mixed_groups, token_stats
from llm_probe.tasks import AdditionTask, JsonlTask, check_answer, extract_answer, load_jsonl_problems, normalize_answer
from llm_probe.tokenizer import build_char_tokenizer, load_tokenizer
from llm_probe.trainer import FaultError, Trainer, make_task
from tests.llm_helpers import warm_model

pytestmark = [pytest.mark.llm, pytest.mark.timeout(180)]

N, T = 4, 3
LP = torch.zeros(N, T)
MASK = torch.ones(N, T)
R = torch.tensor([[1.0, 0.0], [0.0, 1.0]])


# --- bad input: losses ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", LOSS_NAMES)
@pytest.mark.parametrize(
    "rewards",
    [torch.tensor([[0.5, 0.0], [0.0, 1.0]]), torch.tensor([[2.0, 0.0], [0.0, 1.0]]), torch.tensor([[math.nan, 0.0], [0.0, 1.0]]),
     torch.tensor([[math.inf, 0.0], [0.0, 1.0]]), torch.tensor([[-1.0, 0.0], [0.0, 1.0]]), torch.ones(4, 1),
     torch.ones(3), torch.ones(3, 2), torch.ones(1, 2, 2)],
    ids=["half", "two", "nan", "inf", "neg", "G=1", "1d", "rows", "3d"],
)
def test_policy_loss_rejects_bad_rewards(name, rewards):
    with pytest.raises(ValueError):
        policy_loss(name, LP, LP, MASK, rewards, max_completion_length=T)


@pytest.mark.parametrize("name", LOSS_NAMES)
@pytest.mark.parametrize("rewards", [torch.ones(2, 2), torch.zeros(2, 2)], ids=["all1", "all0"])
def test_all_equal_groups_give_a_finite_zero_signal(name, rewards):
    """Documented graceful handling: a group without contrast has zero (group-relative) or constant advantages."""
    res = policy_loss(name, LP, LP, MASK, rewards, max_completion_length=T)
    assert torch.isfinite(res.loss) and torch.isfinite(res.advantages).all()


@pytest.mark.parametrize("which", ["logp", "mask"])
def test_policy_loss_rejects_mismatched_shapes(which):
    lp = torch.zeros(N, T + 1) if which == "logp" else LP
    mask = torch.ones(N, T + 2) if which == "mask" else MASK
    with pytest.raises(ValueError):
        policy_loss("grpo", lp, LP, mask, R, max_completion_length=T)


def test_policy_loss_rejects_an_empty_batch():
    with pytest.raises(ValueError):
        policy_loss("grpo", torch.zeros(0, T), torch.zeros(0, T), torch.zeros(0, T), torch.zeros(0, 2), max_completion_length=T)


def test_loss_helpers_reject_unknown_names_and_bad_options():
    with pytest.raises(ValueError, match="loss must be one of"):
        policy_loss("ppo", LP, LP, MASK, R, max_completion_length=T)
    with pytest.raises(ValueError, match="mode must be one of"):
        aggregate(LP, MASK, "mean")
    with pytest.raises(ValueError, match="max_completion_length"):
        policy_loss("dr_grpo", LP, LP, MASK, R, max_completion_length=0)
    with pytest.raises(ValueError, match="level"):
        importance_ratio(LP, LP, MASK, "batch")
    with pytest.raises(ValueError, match="binary"):
        compute_advantages("grpo", torch.tensor([[2.0, 0.0]]))


def test_fully_masked_batch_is_a_finite_zero_loss():
    for name in LOSS_NAMES:
        res = policy_loss(name, LP, LP, torch.zeros(N, T), R, max_completion_length=T)
        assert torch.isfinite(res.loss) and float(res.loss) == 0.0


# --- bad input: tasks, JSONL, model directories ---------------------------------------------------------

BAD_JSONL = {
    "empty": "",
    "blank_lines": "\n \n\t\n",
    "malformed": '{"question": "1+1", "answer": "2"}\n{bad json',
    "truncated_last_line": '{"question": "1+1", "answer": "2"}\n{"question": "2+2", "ans',
    "array": "[1, 2]",
    "string": '"just a string"',
    "missing_answer": '{"question": "q"}',
    "missing_question": '{"answer": "1"}',
    "empty_question": '{"question": "  ", "answer": "1"}',
    "empty_answer": '{"question": "q", "answer": ""}',
    "hash_without_answer": '{"question": "q", "answer": "####"}',
    "bom": '\ufeff{"question": "q", "answer": "1"}',
}


def test_malformed_jsonl_raises_value_error_with_line(tmp_path):
    """Every malformed file (and null / structured answers) is a ValueError naming the file, also via make_task."""
    from tests.tables import check_table, raises_value_error

    def row(text):
        p = tmp_path / "data.jsonl"
        p.write_text(text, encoding="utf-8")
        raises_value_error(lambda: load_jsonl_problems(p), "data.jsonl")
        raises_value_error(lambda: make_task(str(p)))

    cases = {**BAD_JSONL, **{f"answer {a}": '{"question": "q", "answer": %s}' % a for a in ("null", '{"a": 1}', "[]", "true")}}
    check_table(((kind, (text,)) for kind, text in sorted(cases.items())), row)


# characters that str.splitlines() treats as line breaks but JSON allows raw inside strings
_LINE_BREAKS_IN_STRINGS = ["\u2028", "\u2029", "\u0085", "\x1c", "\x1d", "\x1e", "\x0b", "\x0c"]


def test_jsonl_strings_with_unicode_line_separators_load(tmp_path):
    from tests.tables import check_table

    def row(ch):
        p = tmp_path / "u.jsonl"
        q = f"first{ch}second"
        rows = [json.dumps({"question": q, "answer": f"So{ch}#### 12"}, ensure_ascii=False),
                json.dumps({"question": "2+2", "answer": "4"})]
        p.write_text("\r\n".join(rows) + "\n", encoding="utf-8")
        probs = load_jsonl_problems(p)
        assert [x.prompt for x in probs] == [q, "2+2"] and [x.answer for x in probs] == ["12", "4"]

    check_table(((f"U+{ord(ch):04X}", (ch,)) for ch in _LINE_BREAKS_IN_STRINGS), row)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(st.one_of(st.text(max_size=40),
                                st.builds(lambda q, a: json.dumps({"question": q, "answer": a}, ensure_ascii=False),
                                          st.text(max_size=10),
                                          st.one_of(st.text(max_size=10), st.integers(), st.floats(allow_nan=False)))),
                      max_size=6))
def test_jsonl_fuzz_loads_or_raises_value_error(tmp_path_factory, lines):
    p = tmp_path_factory.mktemp("j") / "f.jsonl"
    p.write_text("\n".join(lines), encoding="utf-8")
    try:
        probs = load_jsonl_problems(p)
    except ValueError as exc:
        assert "f.jsonl" in str(exc)
        return
    assert probs and all(isinstance(x.prompt, str) and x.prompt.strip() and isinstance(x.answer, str) and x.answer
                         for x in probs)
    # every JSON-object line with a usable question was loaded (no record split by a Unicode line break)
    objs = [json.loads(ln) for ln in lines if ln.strip()]
    assert [x.prompt for x in probs] == [str(o["question"]) for o in objs]
    task = JsonlTask(p)
    assert task.sample(np.random.default_rng(0), 3)


# (completion, gold reference, accepted?) in GSM8K / MATH forms
ANSWER_TABLE = [
    ("#### 12 apples", "12", True),
    ("So she has 12 apples.\n#### 12", "12", True),
    ("#### 12", "Natalia sold 48/2 = 24 clips in May.\n#### 12", True),
    ("#### 1,234", "1234", True),
    ("#### $1,234.50", "1234.5", True),
    ("#### -7", "-7", True),
    ("#### 0.50", ".5", True),
    ("#### 3/4", "0.75", True),
    ("#### 12.", "12", True),
    ("#### 12 ", "12", True),
    ("#### 13 apples", "12", False),
    ("#### apples 12", "12", False),
    ("####", "12", False),
    ("\\boxed{12}", "12", True),
    ("\\boxed{12 \\text{ apples}}", "12", True),
    ("\\boxed{\\frac{3}{4}}", "0.75", True),
    ("\\boxed{\\dfrac{1}{2}}", "1/2", True),
    ("\\boxed{{12}}", "{12}", True),
    ("\\boxed{}", "12", False),
    ("\\boxed{12", "12", True),  # unclosed: falls back to the last number
    ("\\boxed{5} and finally #### 7", "7", True),  # the later marker wins
    ("\\boxed{5} and finally #### 7", "5", False),
    ("#### 7 then \\boxed{5}", "5", True),
    ("#### 7 then \\boxed{5}", "7", False),
    ("the answer is 42", "42", True),
    ("first 3 then 17", "17", True),
    ("50%", "50", True),
    ("x = 2/3", "4/6", True),
    ("#### \u0661\u0662", "12", False),  # Arabic-Indic digits are not the number 12
    ("#### \uff11\uff12", "12", False),  # fullwidth digits
    ("\\boxed{\u0967\u0968}", "12", False),  # Devanagari digits
    ("#### 1e10000000", "1", False),
    ("#### 1e10000000", "1e10000000", True),  # compared as text, never evaluated
    ("#### 1e10000000", "10000000000", False),
    ("#### " + "9" * 100_000, "9", False),
    ("#### 1/0", "1/0", True),
    ("#### 1/0", "0", False),
    ("", "12", False),
]


@pytest.mark.timeout(60)
def test_answer_checker_table():
    from tests.tables import check_table

    def row(completion, reference, ok):
        assert check_answer(completion, reference) is ok

    check_table(((f"{c[:40]!r} vs {r[:20]!r}", (c, r, ok)) for c, r, ok in ANSWER_TABLE), row)


_ADVERSARIAL = st.sampled_from([
    "#### 1e10000000", "#### " + "9" * 50_000, "\\boxed{" * 5_000, "{" * 20_000 + "}", "#### 1/" + "0" * 10_000,
    "\\frac{" * 3_000, "1," * 20_000, "#### " + "1e999 " * 2_000, "\\boxed{\\frac{1}{" + "9" * 1_000 + "}}",
])


@pytest.mark.timeout(120)
@settings(max_examples=100, deadline=None)
@given(st.one_of(st.text(max_size=200), _ADVERSARIAL, st.builds(lambda a, b: a + b, _ADVERSARIAL, st.text(max_size=30))),
       st.one_of(st.text(max_size=40), _ADVERSARIAL))
def test_answer_checking_is_bounded_and_never_raises(completion, reference):
    """Arbitrary and adversarial text: a bool, no exception, no hang (the timeout is a hang guard, not a speed claim)."""
    got = extract_answer(completion)
    assert got is None or isinstance(got, str)
    assert isinstance(normalize_answer(reference), str)
    assert isinstance(check_answer(completion, reference), bool)


def test_answer_helpers_reject_non_strings():
    from tests.tables import check_table, raises_value_error

    rows = []
    for bad in (None, 3, b"12"):
        rows += [(f"extract_answer({bad!r})", (lambda b=bad: extract_answer(b),)),
                 (f"check_answer({bad!r}, '1')", (lambda b=bad: check_answer(b, "1"),)),
                 (f"check_answer('1', {bad!r})", (lambda b=bad: check_answer("1", b),)),
                 (f"normalize_answer({bad!r})", (lambda b=bad: normalize_answer(b),))]
    check_table(rows, raises_value_error)


def test_missing_or_empty_model_and_tokenizer_directories(tmp_path):
    for d in (tmp_path / "missing", tmp_path):
        with pytest.raises(ValueError, match="local_dir"):
            load_policy(d, device="cpu")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises((ValueError, OSError)):  # transformers' own error for a corrupt config (OSError is clear)
        load_policy(tmp_path, device="cpu")
    with pytest.raises(ValueError, match="local_dir"):
        load_tokenizer(tmp_path / "missing")
    with pytest.raises(ValueError):
        build_char_tokenizer("")
    with pytest.raises(ValueError):
        make_task("no_such_task")
    with pytest.raises(ValueError):
        make_task(str(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError):
        AdditionTask(50, 10)
    with pytest.raises(ValueError):
        AdditionTask().sample(np.random.default_rng(0), 0)


# --- bad input: trainer configuration (validated before any training) -----------------------------------

_MODEL = {}


def _model():
    if "m" not in _MODEL:
        _MODEL["m"] = warm_model()
    return _MODEL["m"]


def _cfg(tmp_path, **kw):
    base = dict(out_dir=str(tmp_path), steps=3, prompts_per_step=2, group_size=4, probe_prompts=0, probe_every=0,
                progress=False, num_threads=1, device="cpu", lr=3e-4, max_new_tokens=4)
    base.update(kw)
    return TrainConfig(**base)


BAD_CONFIGS = {
    "method": dict(method="ppo"),
    "lr_zero": dict(lr=0.0),
    "lr_negative": dict(lr=-1e-3),
    "group_size_1": dict(group_size=1),
    "group_size_0": dict(group_size=0),
    "steps_0": dict(steps=0),
    "prompts_0": dict(prompts_per_step=0),
    "max_new_tokens_0": dict(max_new_tokens=0),
    "optimizer": dict(optimizer="lion"),
    "task": dict(task="no_such_task"),
    "lr_nan": dict(lr=float("nan")),  # torch.optim's own ValueError ("Invalid learning rate: nan")
    "weight_decay_nan": dict(weight_decay=float("nan")),  # torch.optim's ValueError
}
# found by this suite, fixed by the owner in a089e95 (validated in Trainer.__init__ before the model build)
FIXED_CONFIGS = {
    "temperature": dict(temperature=0.0),
    "max_faults": dict(max_faults=0),
    "probe_every": dict(probe_every=-1),
}


@pytest.mark.parametrize("kind", sorted(BAD_CONFIGS))
def test_bad_train_config_raises_value_error(tmp_path, kind):
    model, tok = _model()
    with pytest.raises(ValueError):
        Trainer(_cfg(tmp_path, **BAD_CONFIGS[kind]), model=model, tokenizer=tok)


@pytest.mark.parametrize("kind", sorted(FIXED_CONFIGS))
def test_bad_train_config_fixed(tmp_path, kind):
    model, tok = _model()
    with pytest.raises(ValueError, match=kind):
        Trainer(_cfg(tmp_path, **FIXED_CONFIGS[kind]), model=model, tokenizer=tok)


# --- numerical robustness ---------------------------------------------------------------------------------


@pytest.mark.parametrize("V, scale", [(1000, 1e3), (100_000, 30.0), (100_000, 1e3)])
def test_token_stats_large_vocab_extreme_logits_match_float64(V, scale):
    g = torch.Generator().manual_seed(V)
    logits = torch.randn(2, 3, V, generator=g) * scale
    ids = torch.randint(0, V, (2, 3), generator=g)
    ids[0, 0] = int(logits[0, 0].argmax())  # a peak token
    lp = torch.log_softmax(logits, -1)
    adv = torch.tensor([1.0, -1.0])
    out = token_stats(lp, ids, torch.ones(2, 3), adv, torch.randn(2, 3, generator=g))
    for k, v in out.items():
        if k != "entropy/zero_adv":  # documented NaN: no token has a zero advantage here
            assert math.isfinite(v), k
    # independent route: float64 entropy with 0 log 0 := 0
    p64 = torch.softmax(logits.double(), -1)
    H = -(p64 * torch.where(p64 > 0, p64.log(), torch.zeros_like(p64))).sum(-1)
    assert out["entropy"] == pytest.approx(float(H.mean()), rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_losses_finite_at_extreme_logprobs(name):
    g = torch.Generator().manual_seed(0)
    logp = (-1e3 * torch.rand(N, T, generator=g)).requires_grad_()  # valid: log-probs down to -1000
    res = policy_loss(name, logp, logp.detach(), MASK, R, max_completion_length=T)
    assert torch.isfinite(res.loss)
    res.loss.backward()
    assert torch.isfinite(logp.grad).all()


# --- training faults ---------------------------------------------------------------------------------------


def _state(trainer):
    return ([p.detach().clone() for p in trainer.model.parameters()],
            {k: v.clone() if torch.is_tensor(v) else v for s in trainer.opt.state.values() for k, v in s.items()})


def _same(a, b):
    (pa, sa), (pb, sb) = a, b
    return all(torch.equal(x, y) for x, y in zip(pa, pb)) and all(
        torch.equal(sa[k], sb[k]) if torch.is_tensor(sa[k]) else sa[k] == sb[k] for k in sa)


def test_poisoned_gradient_is_skipped_weights_and_adam_state_intact_then_run_stops(tmp_path):
    model, tok = warm_model()
    tr = Trainer(_cfg(tmp_path, steps=8, max_faults=3), model=model, tokenizer=tok)
    head = tr.model.lm_head.weight
    poison = {1: float("nan"), 3: float("inf"), 4: float("nan"), 5: -float("inf")}
    head.register_hook(lambda g: g * poison[tr.step] if tr.step in poison else g)
    tr.train_step()  # step 0 fine: Adam state exists from here on
    before = _state(tr)
    m = tr.train_step()  # step 1: NaN gradient -> skipped
    assert m["skipped"] == 1 and m["fault"] == "non-finite gradient"
    assert _same(before, _state(tr)), "a skipped step changed the weights or the optimizer state"
    assert all(p.grad is None for p in tr.model.parameters())
    m = tr.train_step()  # step 2: fine
    assert "fault" not in m and tr.consecutive_faults == 0 and not _same(before, _state(tr))
    tr.train_step()  # 3: inf
    tr.train_step()  # 4: nan
    kept = _state(tr)
    with pytest.raises(FaultError, match="3 consecutive steps"):
        tr.train_step()  # 5: third consecutive fault
    assert _same(kept, _state(tr))
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["fault"] == "non-finite gradient" and rows[-1]["step"] == 5 and rows[-1]["faults"] == 4


class _NaNRewardTask(AdditionTask):
    def reward(self, completion, problem, *, terminated):
        return float("nan")


def test_nan_reward_function_gives_a_clear_value_error(tmp_path):
    model, tok = warm_model()
    tr = Trainer(_cfg(tmp_path), model=model, tokenizer=tok, task=_NaNRewardTask())
    before = _state(tr)
    with pytest.raises(ValueError, match="rewards must be binary"):
        tr.train_step()
    assert _same(before, _state(tr))


def test_nan_loss_through_a_reward_hook_in_the_full_loop_stops_with_a_message(tmp_path, monkeypatch):
    """Every step's loss is NaN: the run stops after max_faults steps with FaultError; weights untouched."""
    model, tok = warm_model()
    tr = Trainer(_cfg(tmp_path, steps=10, max_faults=2, probe_every=1, probe_prompts=2), model=model, tokenizer=tok)
    orig = Trainer.compute_loss

    def poisoned(self, ro):
        res, logp, logp_all = orig(self, ro)
        res.loss = res.loss * float("nan")
        return res, logp, logp_all

    monkeypatch.setattr(Trainer, "compute_loss", poisoned)
    before = _state(tr)
    with pytest.raises(FaultError, match="non-finite loss"):
        tr.run()
    assert _same(before, _state(tr))
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1] and all(r["skipped"] == 1 for r in rows)


# --- collapse detector: beyond the owner's ramps -----------------------------------------------------------


def _first_alert(stream, cfg=None):
    det = CollapseDetector(cfg or CollapseConfig())
    for k, m in enumerate(stream):
        fired = det.update(k, m)
        if fired:
            return fired[0]
    return None


def _step_stream(kind, steps, onset, rng, H0=0.4, R0=0.4):
    """A sudden (no ramp) collapse at ``onset``: entropy x5 ('blowup'), entropy -> 0.01 ('entropy'), reward -> 0."""
    out = []
    for k in range(steps):
        H, R, D = H0, R0, 0.6
        if k >= onset:
            if kind == "blowup":
                H, R = 5 * H0, 0.0
            elif kind == "entropy":
                H, R, D = 0.01, 0.0, 1 / 8
            else:
                R = 0.0
        out.append({"entropy": max(H + rng.normal(0, 0.01), 1e-4), "reward": float(np.clip(R + rng.normal(0, 0.04), 0, 1)) if R else 0.0,
                    "completions/distinct_frac": D})
    return out


@pytest.mark.parametrize("kind", ["blowup", "entropy", "reward"])
def test_sudden_collapse_detected_within_window_plus_patience(kind):
    rng = np.random.default_rng(0)
    cfg = CollapseConfig()
    delays = []
    for _ in range(30):
        a = _first_alert(_step_stream(kind, 80, 40, rng), cfg)
        assert a is not None and a.step >= 40, "false alarm or missed collapse"
        delays.append(a.step - 40)
    # a step change crosses the rolling-mean threshold within `window` steps, then needs `patience` steps
    assert max(delays) <= cfg.window + cfg.patience - 1, delays


def test_slow_drift_collapse_is_detected_and_healthy_noise_is_not():
    """Reward decaying linearly to 0 over 60 steps: detected once the rolling mean < 0.25 R0 (+ patience)."""
    rng = np.random.default_rng(1)
    for _ in range(20):
        stream = [{"entropy": 0.4, "reward": max(0.4 * (1 - max(0, k - 40) / 60) + rng.normal(0, 0.02), 0.0),
                   "completions/distinct_frac": 0.6} for k in range(140)]
        a = _first_alert(stream)
        assert a is not None and a.rule == "reward_collapse" and 40 + 0.75 * 60 <= a.step <= 40 + 0.75 * 60 + 10
    s = detection_stats("healthy", n_streams=50, steps=300, seed=5, noise=0.1)
    assert s["false_alarms"] == 0, s


def test_nan_inf_and_missing_metrics_do_not_alarm_or_crash():
    """Faulted steps log NaN/inf or no entropy: the detector ignores those values (no alert, no exception)."""
    det = CollapseDetector(CollapseConfig(baseline_entropy=0.4, baseline_reward=0.4))
    bad = [{"entropy": math.nan, "reward": math.nan}, {"entropy": math.inf, "reward": -math.inf}, {},
           {"entropy": None, "reward": None, "completions/distinct_frac": math.nan}]
    for k in range(40):
        m = bad[k % 4] if k % 2 else {"entropy": 0.4, "reward": 0.4, "completions/distinct_frac": 0.6}
        assert det.update(k, m) == []
    assert not det.alerted
    s2 = CollapseDetector(det.config)
    s2.load_state_dict(json.loads(json.dumps(det.state_dict())))  # the state survives a JSON round trip
    assert s2.baseline() == det.baseline()


def test_detection_delay_and_false_alarm_table():
    """The numbers reported in RELIABILITY.md (owner's ramp streams with other seeds and a longer horizon)."""
    rows = {kind: detection_stats(kind, n_streams=40, steps=200, onset=80, seed=11) for kind in
            ("healthy", "blowup", "entropy_collapse", "reward_collapse")}
    assert rows["healthy"]["false_alarms"] == 0
    for kind in ("blowup", "entropy_collapse", "reward_collapse"):
        assert rows[kind]["detected"] == 40 and rows[kind]["false_alarms"] == 0
        assert rows[kind]["delay_max"] <= 12
    print(json.dumps(rows))


@pytest.mark.parametrize("field", ["blowup_factor", "collapse_factor", "reward_floor", "distinct_floor", "blowup_margin"])
def test_collapse_config_rejects_nan_thresholds(field):
    with pytest.raises(ValueError, match=field):
        CollapseConfig(**{field: float("nan")})


def test_collapse_config_and_stream_bad_input():
    for f in ("window", "patience", "baseline_steps"):
        with pytest.raises(ValueError, match=f):
            CollapseConfig(**{f: 0})
    with pytest.raises(ValueError, match="kind"):
        synthetic_stream("explode", 10, np.random.default_rng(0))


def test_mixed_groups_of_all_equal_and_empty_batches():
    assert mixed_groups(torch.ones(3, 4)).numel() == 0
    assert mixed_groups(torch.zeros(0, 4)).numel() == 0
    assert mixed_groups(torch.tensor([[1.0, 0.0], [1.0, 1.0]])).tolist() == [0]


# --- determinism --------------------------------------------------------------------------------------------


def test_same_seed_same_training_run(tmp_path):
    """Two runs from the same weights and seed: weights equal within 1e-6 (observed: bitwise on CPU), metrics equal."""
    outs = []
    for d in ("a", "b"):
        model, tok = warm_model()
        Trainer(_cfg(tmp_path / d, steps=3, probe_every=1, probe_prompts=2), model=model, tokenizer=tok).run()
        outs.append(([p.detach().clone() for p in model.parameters()],
                     [json.loads(x) for x in (tmp_path / d / "metrics.jsonl").read_text().splitlines()]))
    (pa, ma), (pb, mb) = outs
    for a, b in zip(pa, pb):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert len(ma) == len(mb) == 3
    for ra, rb in zip(ma, mb):
        for k in ra:
            if k in ("step_time",):
                continue
            va, vb = ra[k], rb[k]
            if isinstance(va, float):
                assert (math.isnan(va) and math.isnan(vb)) or va == pytest.approx(vb, rel=1e-5, abs=1e-7), k
            else:
                assert va == vb, k


# --- bad input: rollouts, model construction, probes ------------------------------------------------------------


def _rollout_call(**kw):
    from llm_probe.rollout import make_rollout
    from tests.llm_helpers import tiny

    model, tok = tiny()
    task = AdditionTask()
    args = dict(problems=task.sample(np.random.default_rng(0), 2), G=2, max_new_tokens=3,
                generator=torch.Generator().manual_seed(0), temperature=1.0)
    args.update(kw)
    return make_rollout(model, tok, task, args.pop("problems"), **args)


@pytest.mark.parametrize("kw", [dict(G=1), dict(G=0), dict(temperature=0.0), dict(temperature=-1.0)],
                         ids=["G=1", "G=0", "temperature=0", "temperature<0"])
def test_rollout_bad_input_raises_value_error(kw):
    with pytest.raises(ValueError):
        _rollout_call(**kw)


# Temperature NaN, max_new_tokens < 0 and an empty problem list used to reach torch / indexing; validated in
# llm_probe/rollout.py.
@pytest.mark.parametrize("kw", [dict(temperature=float("nan")), dict(max_new_tokens=-1), dict(problems=[])],
                         ids=["temperature=nan", "max_new_tokens=-1", "no_problems"])
def test_rollout_unvalidated_input_open(kw):
    with pytest.raises(ValueError):
        _rollout_call(**kw)


def test_model_construction_bad_specs():
    from llm_probe.model import TinyQwenSpec, build_tiny_qwen

    tok = build_char_tokenizer()
    for spec in (TinyQwenSpec(arch="llama"), TinyQwenSpec(num_attention_heads=3, num_key_value_heads=2)):
        with pytest.raises(ValueError):
            build_tiny_qwen(tok, spec)
    with pytest.raises(ValueError, match="dtype"):
        build_tiny_qwen(tok, dtype="float8")


def test_model_construction_zero_hidden_size():
    """Formerly open: hidden_size=0 raised ZeroDivisionError inside transformers' init."""
    from llm_probe.model import TinyQwenSpec, build_tiny_qwen

    with pytest.raises(ValueError):
        build_tiny_qwen(build_char_tokenizer(), TinyQwenSpec(hidden_size=0))


def test_select_params_invalid_regex():
    """Formerly open: an invalid regex raised re.error, not ValueError."""
    from llm_probe.probes import select_params
    from tests.llm_helpers import tiny

    with pytest.raises(ValueError):
        select_params(tiny()[0], "(")


def test_update_that_overflows_the_weights_is_a_fault(tmp_path):
    """Formerly open: an update that overflows the weights now restores them and counts a fault."""
    model, tok = warm_model()
    tr = Trainer(_cfg(tmp_path, steps=6, optimizer="sgd", lr=1e38, max_faults=2), model=model, tokenizer=tok)
    try:
        tr.run()
    except FaultError:
        pass
    assert all(bool(torch.isfinite(p).all()) for p in tr.model.parameters())
