"""llm_probe.measure (any trainer's (prompt, completion, reward) lists) and llm_probe.offline (two checkpoints +
a rollout JSONL) against GapProbe around the same real Adam step: same per-prompt dmu, gap norms, Phi_hat and
gap/* metrics; the dot and streamed routes agree; groups of unequal size equal each size measured alone; the
offline command reloads both checkpoints from disk (save/load round trip)."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from llm_probe.gap_probe import GapProbe
from llm_probe.losses import policy_loss
from llm_probe.measure import measure
from llm_probe.model import completion_logprobs, save_policy
from llm_probe.step_hook import Step
from tests.llm_helpers import sampled_rollout, tiny

pytestmark = pytest.mark.llm


def as_lists(ro):
    """(prompt ids, completion ids, rewards) per completion, padding stripped (what a trainer would hand over)."""
    P, C, R = [], [], []
    for n in range(ro.B * ro.G):
        P.append([int(t) for t, m in zip(ro.prompt_ids[n], ro.prompt_mask[n]) if m > 0])
        C.append([int(t) for t, m in zip(ro.completion_ids[n], ro.completion_mask[n]) if m > 0])
        R.append(float(ro.rewards[n // ro.G, n % ro.G]))
    return P, C, R


@pytest.fixture(scope="module")
def adam_step():
    model, tok = tiny("qwen2", seed=7)
    ro = sampled_rollout(model, tok, B=4, G=4, T=5, seed=5)
    ro.rewards[3] = 0.0  # one group without a winner
    before = copy.deepcopy(model)
    probe = GapProbe(model, "all", alignment="dot", max_gap_bytes=None)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    logp = completion_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask)
    policy_loss("grpo", logp, logp.detach(), ro.completion_mask, ro.rewards, max_completion_length=5).loss.backward()
    probe.before(Step(ro))
    opt.step()
    res = probe.after()
    return before, model, tok, ro, res


def check_against_probe(out, res, scale_rel=1e-5):
    scale = float(res.dmu_update.abs().max())
    assert out["groups"].tolist() == [0, 1, 2] and out["mixed"].tolist() == [True, True, True, False]
    torch.testing.assert_close(out["dmu"].float(), res.dmu_update, rtol=scale_rel, atol=scale_rel * scale)
    torch.testing.assert_close(out["gap_norm"].float(), res.gap_norms, rtol=scale_rel, atol=0)
    assert out["update_norm"] == pytest.approx(res.update_norm, rel=1e-5)
    assert out["M_increment"] == pytest.approx(res.metrics["gap/M_batch"], rel=1e-4, abs=1e-6 * scale)
    for k, v in out["metrics"].items():
        assert v == pytest.approx(res.metrics[k], rel=1e-4, abs=1e-6 * scale), k


@pytest.mark.parametrize("route", ["dot", "stream"])
@pytest.mark.parametrize("update", ["state_dicts", "delta"])
def test_measure_equals_gap_probe(adam_step, route, update):
    before, after, tok, ro, res = adam_step
    P, C, R = as_lists(ro)
    sd0, sd1 = dict(before.named_parameters()), dict(after.named_parameters())
    upd = (sd0, sd1) if update == "state_dicts" else {n: sd1[n].detach() - p.detach() for n, p in sd0.items()}
    out = measure(before, None, P, C, R, update=upd, route=route)
    assert out["route"] == route and (("gaps" in out) == (route == "dot"))
    check_against_probe(out, res)
    torch.testing.assert_close(out["J_hat"], ro.rewards.mean(-1))


def test_measure_auto_route_tokenizer_input_and_unequal_groups(adam_step):
    before, _, tok, ro, _ = adam_step
    P, C, R = as_lists(ro)
    small = measure(before, None, P, C, R, max_gap_bytes=0)
    big = measure(before, None, P, C, R)
    assert (small["route"], big["route"]) == ("stream", "dot")
    torch.testing.assert_close(small["gap_norm"], big["gap_norm"], rtol=1e-5, atol=0)
    # text through the tokenizer = the same ids
    texts = [(tok.decode(p), tok.decode(c)) for p, c in zip(P, C)]
    assert all(tok(t, add_special_tokens=False)["input_ids"] == c for (_, t), c in zip(texts, C))
    via_tok = measure(before, tok, [t[0] for t in texts], [t[1] for t in texts], R)
    torch.testing.assert_close(via_tok["phi"], big["phi"])
    # drop completion 3 of prompt 0 (groups of 3 and 4): prompt 0 alone and the rest alone give the same numbers
    keep = [i for i in range(len(P)) if i != 3]
    R0 = list(R)
    R0[0], R0[1] = 1.0, 0.0
    mixed_sizes = measure(before, None, [P[i] for i in keep], [C[i] for i in keep], [R0[i] for i in keep])
    alone0 = measure(before, None, P[:3], C[:3], R0[:3])
    rest = measure(before, None, P[4:], C[4:], R0[4:])
    torch.testing.assert_close(mixed_sizes["gap_norm"], torch.cat([alone0["gap_norm"], rest["gap_norm"]]))
    torch.testing.assert_close(mixed_sizes["phi"], torch.cat([alone0["phi"], rest["phi"]]))


def test_measure_rejects_bad_input(adam_step):
    before, _, tok, ro, _ = adam_step
    P, C, R = as_lists(ro)
    with pytest.raises(ValueError, match="route"):
        measure(before, None, P, C, R, route="fast")
    with pytest.raises(ValueError, match="one entry per completion"):
        measure(before, None, P, C[:-1], R)
    with pytest.raises(ValueError, match="update"):
        measure(before, None, P, C, R, update={"nope": torch.zeros(1)})
    with pytest.raises(ValueError, match="prompts\\[0\\]"):
        measure(before, tok, P, C, R)


def test_offline_command_round_trip(adam_step, tmp_path):
    from llm_probe.cli import main as train_main

    main = lambda argv: train_main.__wrapped__(["offline", *argv])  # noqa: E731  (unwrapped: errors raise)

    before, after, tok, ro, res = adam_step
    save_policy(before, tok, tmp_path / "k")
    save_policy(after, tok, tmp_path / "k1")
    P, C, R = as_lists(ro)
    with open(tmp_path / "ro.jsonl", "w") as f:
        for p, c, r in zip(P, C, R):
            f.write(json.dumps({"step": 3, "prompt": tok.decode(p), "completion": tok.decode(c),
                                "completion_ids": c, "reward": r}) + "\n")
        f.write(json.dumps({"step": 4, "prompt": "1+1=", "completion": "2", "reward": 1.0}) + "\n")  # another step
    args = ["--before", str(tmp_path / "k"), "--after", str(tmp_path / "k1"), "--rollouts", str(tmp_path / "ro.jsonl"),
            "--out", str(tmp_path / "out")]
    with pytest.raises(ValueError, match="choose one with step"):
        main(args)
    assert main(args + ["--step", "3"]) == 0
    summary = json.loads((tmp_path / "out" / "offline_gap.json").read_text())
    rows = [json.loads(line) for line in (tmp_path / "out" / "per_prompt.jsonl").read_text().splitlines()]
    assert [r["mixed"] for r in rows] == [True, True, True, False]
    scale = float(res.dmu_update.abs().max())
    torch.testing.assert_close(torch.tensor([r["dmu"] for r in rows[:3]]), res.dmu_update, rtol=1e-5,
                               atol=1e-5 * scale)
    assert summary["gap/dmu_update_mean"] == pytest.approx(res.metrics["gap/dmu_update_mean"], rel=1e-4)
    assert summary["M_increment"] == pytest.approx(res.metrics["gap/M_batch"], rel=1e-4)
    (tmp_path / "bad.jsonl").write_text('{"prompt": "1+1=", "completion": "2"}\n')
    with pytest.raises(ValueError, match="line 1 lacks a finite numeric 'reward'"):
        main(["--before", str(tmp_path / "k"), "--after", str(tmp_path / "k1"), "--rollouts",
              str(tmp_path / "bad.jsonl"), "--out", str(tmp_path / "o2")])
