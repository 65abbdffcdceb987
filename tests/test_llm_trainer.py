"""The online RLVR loop: files written, checkpoint/resume equals an uninterrupted run, NaN/inf steps are
skipped with weights intact and repeated faults stop the run, SGD alignment = lr * gradient alignment, CLI."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from llm_probe.config import TrainConfig
from llm_probe.trainer import FaultError, Trainer
from tests.llm_helpers import warm_model

pytestmark = pytest.mark.llm


def _cfg(tmp_path, **kw):
    base = dict(out_dir=str(tmp_path), steps=4, prompts_per_step=4, group_size=4, probe_prompts=3,
                probe_group_size=4, progress=False, num_threads=1, device="cpu", lr=3e-4, probe_every=1)
    base.update(kw)
    return TrainConfig(**base)


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


def test_run_writes_metrics_and_probes(tmp_path):
    model, tok = warm_model()
    tr = Trainer(_cfg(tmp_path, method="wapo", probe_alignment="both"), model=model, tokenizer=tok)
    summary = tr.run()
    assert summary["steps"] == 4 and summary["faults"] == 0
    df = pd.read_parquet(tmp_path / "metrics.parquet")
    assert len(df) == 4
    for col in ("reward", "reward_std", "frac_reward_zero_std", "entropy", "entropy/pos_adv", "completions/mean_length",
                "clip_ratio/high_mean", "grad_norm", "gap/M_mean", "gap/M_batch", "taxonomy/pos_peak",
                "gradmass/p0.5-1", "update_norm"):
        assert col in df, col
    assert (df["gap/M_mean"].diff().dropna() >= 0).all()  # M is a sum of positive parts
    # both alignment routes agree inside the real loop (relative to the size of dmu)
    jd = df["gap/jvp_dot_maxdiff"].dropna()
    assert len(jd) and (jd <= 1e-3 * (1 + df["gap/dmu_update_mean"].abs().max())).all()
    rows = [json.loads(x) for x in (tmp_path / "probe_prompts.jsonl").read_text().splitlines()]
    assert len(rows) == 4 * 3 and {"J_hat", "dmu_update", "M", "mixed"} <= set(rows[0])
    from gapdyn import cumulative_alignment  # M_q follows gapdyn's semantics with eta = 1

    for q in range(3):
        mine = [r for r in rows if r["prompt_id"] == q]
        ref = cumulative_alignment(np.ones(len(mine)), np.array([r["dmu_update"] for r in mine]))
        np.testing.assert_allclose([r["M"] for r in mine], ref, rtol=1e-6, atol=1e-9)
    assert (tmp_path / "checkpoint.safetensors").exists() and (tmp_path / "baseline.json").exists()
    assert not list(tmp_path.glob("*.tmp"))


def test_jvp_only_route_matches_dot_route_in_the_loop(tmp_path):
    """probe_alignment='jvp' (no gap vectors) and 'dot' give the same dmu on the same trajectory (LM head subset);
    probing does not change training: rewards and weights agree too."""
    out = {}
    for route in ("jvp", "dot"):
        model, tok = warm_model()
        Trainer(_cfg(tmp_path / route, steps=3, probe_params="lm_head", probe_alignment=route, probe_prompts=0),
                model=model, tokenizer=tok).run()
        out[route] = (pd.read_parquet(tmp_path / route / "metrics.parquet"), _params(model))
    (dj, pj), (dd, pd_) = out["jvp"], out["dot"]
    pd.testing.assert_series_equal(dj["reward"], dd["reward"])
    for a, b in zip(pj, pd_):
        assert torch.equal(a, b)
    for col in ("gap/dmu_update_mean", "gap/dmu_grad_mean"):
        np.testing.assert_allclose(dj[col], dd[col], rtol=1e-3, atol=1e-6)
    assert "gap/norm_mean" in dd and "gap/norm_mean" not in dj


def test_jvp_route_probe_prompts_and_dphi_match_dot_route(tmp_path):
    """jvp mode takes the probe prompts' dmu (hence M_q) from a forward-mode pass and Phi_hat(theta_k) from the
    training forward; both equal the dot route's (gap vectors, per-group forwards), all parameters."""
    out = {}
    for route in ("jvp", "dot"):
        model, tok = warm_model()
        Trainer(_cfg(tmp_path / route, steps=3, probe_alignment=route, probe_prompts=4), model=model,
                tokenizer=tok).run()
        rows = [json.loads(x) for x in (tmp_path / route / "probe_prompts.jsonl").read_text().splitlines()]
        out[route] = (pd.read_parquet(tmp_path / route / "metrics.parquet"), pd.DataFrame(rows))
    (dj, rj), (dd, rd) = out["jvp"], out["dot"]
    assert len(rj) == len(rd) == 12 and rd["mixed"].any()
    assert rj["mixed"].tolist() == rd["mixed"].tolist()
    scale = 1.0 + rd["dmu_update"].abs().max()
    np.testing.assert_allclose(rj["dmu_update"], rd["dmu_update"], rtol=1e-3, atol=1e-4 * scale)
    np.testing.assert_allclose(rj["M"], rd["M"], rtol=1e-3, atol=1e-4 * scale)
    for col in ("gap/dmu_update_mean", "gap/dmu_grad_mean", "gap/dphi_mean", "gap/M_mean"):
        np.testing.assert_allclose(dj[col], dd[col], rtol=1e-3, atol=1e-5)


def test_resume_equals_uninterrupted(tmp_path):
    """Run 4 steps; run 2, stop, resume to 4 from the checkpoint: same weights (atol 1e-6) and same metrics."""
    m, tok = warm_model()
    Trainer(_cfg(tmp_path / "a"), model=m, tokenizer=tok).run()
    m1, tok1 = warm_model()
    Trainer(_cfg(tmp_path / "b", steps=2, checkpoint_every=1), model=m1, tokenizer=tok1).run()
    m2, tok2 = warm_model()  # fresh weights: the checkpoint must restore everything
    Trainer(_cfg(tmp_path / "b", resume=True), model=m2, tokenizer=tok2).run()
    for a, b in zip(m.parameters(), m2.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    da, db = pd.read_parquet(tmp_path / "a" / "metrics.parquet"), pd.read_parquet(tmp_path / "b" / "metrics.parquet")
    assert list(db["step"]) == [0, 1, 2, 3]
    for col in ("reward", "entropy", "gap/M_mean", "gap/dmu_update_mean", "grad_norm"):
        pd.testing.assert_series_equal(da[col], db[col], rtol=1e-5, check_exact=False)


def test_nonfinite_step_is_skipped_then_run_stops(tmp_path, monkeypatch):
    model, tok = warm_model()
    tr = Trainer(_cfg(tmp_path, steps=6, max_faults=2, probe_every=0), model=model, tokenizer=tok)
    orig = Trainer.compute_loss

    def flaky(self, ro):
        res, logp, logp_all = orig(self, ro)
        if self.step == 1:
            res.loss = res.loss + float("nan")  # NaN loss
        elif self.step == 3:  # finite loss, NaN gradient: 0 * d sqrt(z)/dz at z = 0
            res.loss = res.loss + 0.0 * torch.sqrt((logp * 0).sum())
        elif self.step == 4:
            res.loss = res.loss * torch.tensor(float("inf"))
        return res, logp, logp_all

    monkeypatch.setattr(Trainer, "compute_loss", flaky)
    tr.train_step()  # step 0: fine
    before = _params(model)
    m = tr.train_step()  # step 1: NaN loss -> skipped
    assert m["skipped"] == 1 and "non-finite" in m["fault"]
    for a, b in zip(before, model.parameters()):
        assert torch.equal(a, b)
    tr.train_step()  # step 2 fine: the consecutive count resets
    assert tr.consecutive_faults == 0 and tr.faults == 1
    before = _params(model)
    m = tr.train_step()  # step 3: NaN gradient with a finite loss -> skipped
    assert m["fault"] == "non-finite gradient" and np.isfinite(m["loss"])
    for a, b in zip(before, model.parameters()):
        assert torch.equal(a, b)
    with pytest.raises(FaultError, match="2 consecutive steps"):
        tr.train_step()  # step 4: inf loss, the second consecutive fault stops the run
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["fault"]


def test_nonfinite_policy_skips_the_step_with_the_progress_bar_on(tmp_path, monkeypatch):
    """A policy that cannot be sampled from at step 1 is a counted fault, also with the progress bar shown."""
    import llm_probe.trainer as trainer_mod
    from llm_probe.rollout import NonFinitePolicyError

    model, tok = warm_model()
    tr = Trainer(_cfg(tmp_path, steps=3, probe_every=0, progress=True), model=model, tokenizer=tok)
    orig = trainer_mod.make_rollout

    def broken_at_step_1(*a, **kw):
        if tr.step == 1 and kw.get("generator") is tr.gen:
            raise NonFinitePolicyError("injected")
        return orig(*a, **kw)

    monkeypatch.setattr(trainer_mod, "make_rollout", broken_at_step_1)
    assert tr.run()["faults"] == 1
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2] and rows[1]["skipped"] == 1
    assert rows[1]["fault"].startswith("non-finite policy output") and "skipped" not in rows[2]


def test_sgd_update_alignment_is_lr_times_gradient_alignment(tmp_path):
    """With SGD the change is -lr * grad, so dmu_update = lr * dmu_grad for every prompt (here: their means)."""
    model, tok = warm_model()
    lr = 0.05
    tr = Trainer(_cfg(tmp_path, optimizer="sgd", lr=lr, steps=3, probe_prompts=0), model=model, tokenizer=tok)
    tr.run()
    df = pd.read_parquet(tmp_path / "metrics.parquet").dropna(subset=["gap/dmu_update_mean"])
    assert len(df)
    torch.testing.assert_close(torch.tensor(df["gap/dmu_update_mean"].values),
                               lr * torch.tensor(df["gap/dmu_grad_mean"].values), rtol=1e-3, atol=1e-6)
    torch.testing.assert_close(torch.tensor(df["update_norm"].values), lr * torch.tensor(df["grad_norm"].values),
                               rtol=1e-4, atol=1e-7)


def test_stop_on_alert(tmp_path):
    """A huge Adam step collapses the tiny model; with stop_on_alert the run ends at the first alert."""
    from llm_probe.collapse import CollapseConfig

    model, tok = warm_model()
    cfg = _cfg(tmp_path, lr=0.05, steps=40, probe_every=0, stop_on_alert=True,
               collapse=CollapseConfig(window=2, patience=2))
    s = Trainer(cfg, model=model, tokenizer=tok).run()
    assert s["alerted"] and s["stopped"] and s["steps"] < 40
    assert json.loads((tmp_path / "alerts.json").read_text())[0]["rule"] in (
        "entropy_blowup", "entropy_collapse", "reward_collapse", "identical_rollouts")


def test_cli_runs_and_validates(tmp_path, capsys):
    from llm_probe.cli import main

    rc = main(["--out", str(tmp_path), "--steps", "2", "--warmup-steps", "5", "--prompts-per-step", "2",
               "--group-size", "2", "--probe-prompts", "2", "--num-threads", "1", "--no-progress", "--device", "cpu"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "2 steps" in printed and str(tmp_path) in printed
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 2
    assert main(["--optimizer", "lion"]) == 2
    with pytest.raises(ValueError, match="method must be one of"):
        Trainer(TrainConfig(out_dir=str(tmp_path), method="ppo"), model=object(), tokenizer=object())
    for bad, field in ((dict(temperature=0.0), "temperature"), (dict(max_faults=0), "max_faults"),
                       (dict(probe_every=-1), "probe_every")):
        with pytest.raises(ValueError, match=field):
            Trainer(TrainConfig(out_dir=str(tmp_path), **bad), model=object(), tokenizer=object())
    with pytest.raises(ValueError, match="group_size"):
        Trainer(TrainConfig(out_dir=str(tmp_path), group_size=1), model=object(), tokenizer=object())


def test_cli_jsonl_task(tmp_path, capsys):
    """A question/answer JSONL task end to end: tokenizer alphabet from the data, reward by check_answer."""
    from llm_probe.cli import main

    f = tmp_path / "qa.jsonl"
    f.write_text("".join(json.dumps({"question": f"{a}+{b}=", "answer": f"#### {a + b}"}) + "\n"
                         for a in range(10, 14) for b in range(20, 23)))
    rc = main(["--task", str(f), "--out", str(tmp_path / "run"), "--steps", "2", "--warmup-steps", "3",
               "--warmup-batch", "8", "--prompts-per-step", "2", "--group-size", "2", "--probe-prompts", "2",
               "--num-threads", "1", "--no-progress", "--device", "cpu"])
    assert rc == 0
    assert len(pd.read_parquet(tmp_path / "run" / "metrics.parquet")) == 2


def test_gapdyn_train_dispatch(capsys):
    from gapdyn.cli import main

    assert main(["train", "--help"]) == 0
    assert "--probe-alignment" in capsys.readouterr().out


def test_resume_drops_stale_and_torn_rows(tmp_path):
    """resume=True before any checkpoint starts clean; a torn last metrics line (kill mid-append) is dropped."""
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "reward": 9}\n{"step": 1, "rew')
    model, tok = warm_model()
    Trainer(_cfg(tmp_path, steps=2, resume=True, probe_every=0, checkpoint_every=1), model=model, tokenizer=tok).run()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1] and rows[0]["reward"] != 9
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 2, "rew')  # torn
    model2, tok2 = warm_model()
    Trainer(_cfg(tmp_path, steps=3, resume=True, probe_every=0), model=model2, tokenizer=tok2).run()
    assert list(pd.read_parquet(tmp_path / "metrics.parquet")["step"]) == [0, 1, 2]


def test_num_iterations_equals_a_hand_written_ppo_loop(tmp_path):
    """mu = 3 SGD steps on one batch (DAPO: grpo advantages, clip 0.2 / 0.28, token-mean over the batch) equal a
    loop written here: ratio exp(logp - logp_k), -min(r A, clip(r) A), p -= lr grad. The clips bind at this lr,
    and clip_ratio/* and loss are the means over the mu steps."""
    import copy

    from llm_probe.model import completion_logprobs

    model, tok = warm_model()
    twin = copy.deepcopy(model)
    lr, mu = 2.0, 3
    tr = Trainer(_cfg(tmp_path, method="dapo", optimizer="sgd", lr=lr, num_iterations=mu, steps=1, probe_prompts=0),
                 model=model, tokenizer=tok)
    seen = []
    rollout = tr.rollout
    tr.rollout = lambda *a, **kw: seen.append(rollout(*a, **kw)) or seen[-1]
    m = tr.train_step()
    ro = seen[0]
    r = ro.rewards.double()
    A = ((r - r.mean(-1, keepdim=True)) / (r.std(-1, keepdim=True) + 1e-4)).reshape(-1, 1)
    mask = ro.completion_mask
    old, losses, region = None, [], []
    for _ in range(mu):
        logp = completion_logprobs(twin, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, mask)
        old = logp.detach() if old is None else old
        ratio = torch.exp(logp - old)
        per_token = -torch.minimum(ratio * A, ratio.clamp(1 - 0.2, 1 + 0.28) * A)
        loss = (per_token * mask).sum() / mask.sum()
        clipped = ((ratio < 1 - 0.2) & (A < 0)) | ((ratio > 1 + 0.28) & (A > 0))
        region.append(float((clipped.float() * mask).sum() / mask.sum()))
        losses.append(float(loss.detach()))
        twin.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p in twin.parameters():
                if p.grad is not None:
                    p -= lr * p.grad
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert max(region) > 0, "the clips should bind at this step size"
    assert m["clip_ratio/region_mean"] == pytest.approx(np.mean(region), abs=1e-6)
    assert m["loss"] == pytest.approx(np.mean(losses), rel=1e-5, abs=1e-7)


def test_num_iterations_checks():
    with pytest.raises(ValueError, match="num-iterations"):
        TrainConfig(num_iterations=0)
    with pytest.raises(ValueError, match="safe-step needs --num-iterations 1"):
        TrainConfig(num_iterations=2, safe_step=True)


def test_headroom_meter_equals_the_controllers_rule_on_the_same_step(tmp_path):
    """The trainer's headroom meter (gap/headroom on probed steps, nothing rescaled) at step 0 equals the safe step
    controller's pre-cap headroom on the same batch and proposal, and min(delta / sd_hat, c dmu_hat / kappa_hat)
    formed by hand from the controller's estimates; unprobed steps carry none; gap/headroom_lr = lr h."""
    model, tok = warm_model()
    meter = Trainer(_cfg(tmp_path / "m", probe_every=2, steps=3, lr=1e-2), model=model, tokenizer=tok)
    meter.run()
    model2, tok2 = warm_model()
    ctl = Trainer(_cfg(tmp_path / "c", probe_every=0, steps=1, lr=1e-2, safe_step=True), model=model2, tokenizer=tok2)
    ctl.run()
    rows = [json.loads(x) for x in (tmp_path / "m" / "metrics.jsonl").read_text().splitlines()]
    c0 = json.loads((tmp_path / "c" / "metrics.jsonl").read_text().splitlines()[0])
    assert [("gap/headroom" in r) for r in rows] == [True, False, True]
    h0 = rows[0]["gap/headroom"]
    assert np.isfinite(h0) and c0["safe/n_mixed"] > 0, "no mixed group: the check would be vacuous"
    by_hand = min(2.0 / c0["safe/sd_hat"], 1.0 * c0["safe/dmu_hat"] / c0["safe/kappa_hat"])
    assert h0 == pytest.approx(c0["safe/headroom"], rel=1e-6) and h0 == pytest.approx(by_hand, rel=1e-6)
    assert rows[0]["gap/headroom_lr"] == pytest.approx(1e-2 * h0, rel=1e-12)


def test_all_finite_agrees_with_the_elementwise_check():
    from llm_probe.trainer import all_finite

    rng = np.random.default_rng(0)
    for case in range(40):
        ts = [torch.tensor(rng.normal(size=rng.integers(1, 5, size=2)), dtype=torch.float32) for _ in range(4)]
        if case % 4 == 1:  # a NaN or an inf somewhere
            t = ts[rng.integers(4)]
            t.view(-1)[rng.integers(t.numel())] = [float("nan"), float("inf"), -float("inf")][case % 3]
        elif case % 4 == 2:  # finite, but the sum of squares overflows float32: still finite
            ts[0].view(-1)[0] = 3e38
        assert all_finite(ts) == all(bool(torch.isfinite(t).all()) for t in ts)
    assert all_finite([])


def test_fused_adam_gives_the_single_tensor_adams_bits(tmp_path):
    """The trainer's Adam runs its multi-tensor (foreach) route: over 4 steps the weights equal, bit for bit,
    those of torch's single-tensor Adam from the same start (same batches: probes off)."""
    runs = []
    for foreach in (True, False):
        model, tok = warm_model()
        tr = Trainer(_cfg(tmp_path / str(foreach), probe_every=0), model=model, tokenizer=tok)
        assert tr.opt.defaults["foreach"] is True
        if not foreach:
            tr.opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=3e-4, foreach=False)
        for _ in range(4):
            tr.train_step()
        runs.append(_params(model))
    assert all(torch.equal(a, b) for a, b in zip(*runs))
