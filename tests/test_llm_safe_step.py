"""llm_probe.safe_step: the JVP against finite differences of log-probs, the controller against a direct
computation of its rule, and the TRL callback on a real 3-step GRPOTrainer run (gradient accumulation)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import gapdyn
from llm_probe.losses import policy_loss
from llm_probe.model import completion_logprobs
from llm_probe.safe_step import SafeStepController, completion_logprob_jvp
from llm_probe.step_hook import Step
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


def _model_forward_jvp(model, ro, theta, d):
    """x_n by torch.func.jvp through the model's own (Hugging Face) forward, every row scored in full."""
    from torch.func import functional_call, jvp

    keys = list(theta)
    args = (ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask)

    def f(*vals):
        class At(torch.nn.Module):
            def forward(self, **kw):
                return functional_call(model, dict(zip(keys, vals)), args=(), kwargs=kw)

        at = At()
        at.dtype = model.dtype
        return completion_logprobs(at, *args).sum(-1)

    with torch.no_grad():
        return jvp(f, tuple(theta[k] for k in keys), tuple(d[k] for k in keys))[1].double()


@pytest.mark.parametrize("tied", [False, True])
def test_jvp_shared_prompt_route_matches_the_model_forward(tied):
    """The JVP through llm_probe.sampler's shared-prompt forward (taken for this model) equals forward mode through
    the model's own forward over full rows (float64, 1e-6 of max|x|), at temperature 1 and 0.7 and with rows
    that are not prompt-major (no sharing)."""
    from llm_probe.model import TinyQwenSpec, scoring_temperature
    from llm_probe.sampler import supports_fast_path

    from tests.llm_helpers import SMALL

    spec = TinyQwenSpec(**{**SMALL.__dict__, "tie_word_embeddings": tied})
    model, tok = tiny(spec=spec, dtype="float64")
    assert supports_fast_path(model)
    ro = sampled_rollout(model, tok, B=3, G=4, T=5, seed=1)
    perm = torch.randperm(12, generator=torch.Generator().manual_seed(0))
    shuffled = type(ro)(**{**ro.__dict__, **{k: getattr(ro, k)[perm] for k in
                                             ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")}})
    theta = {n: p.detach().clone() for n, p in model.named_parameters()}
    d = _direction(model)
    for T in (1.0, 0.7):
        with scoring_temperature(T):
            for r in (ro, shuffled):
                x = completion_logprob_jvp(model, r, theta, d, shared_prompt=True)
                ref = _model_forward_jvp(model, r, theta, d)
                assert float((x - ref).abs().max()) <= 1e-6 * float(ref.abs().max()), (T, r is ro)


@pytest.mark.parametrize("lr, delta", [(1e-3, 2.0), (3e-2, 2.0), (3e-2, 0.05)])
def test_controller_applies_its_rule_exactly(lr, delta):
    """After a real Adam step: theta = theta_k + a d exactly, with a the gapdyn rule on reverse-mode x."""
    model, tok = tiny(dtype="float64")
    ro = sampled_rollout(model, tok, B=4, G=4, T=5, seed=2)
    ctl = SafeStepController(model, delta=delta)
    opt = _adam_with_gradient(model, ro, lr)
    ctl.before(Step(ro))
    theta_k = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt.step()
    proposed = {n: p.detach().clone() for n, p in model.named_parameters()}
    d = {n: proposed[n] - theta_k[n] for n in theta_k}
    res = ctl.after()
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
        SafeStepController(model).after()
    with pytest.raises(ValueError, match="theta_k"):
        SafeStepController(model).before(Step(None, theta_k={}))
    with pytest.raises(ValueError, match="takes a llm_probe.step_hook.Step"):
        SafeStepController(model).before(None)


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
    cb.capture_batches(trainer)  # registered between spy and after, not last (attach would move it)
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
    """``--mode test`` end to end from the pinned checkpoint: pilot, plan.json, confirmation, the outputs with the
    checkpoint's sha256; a second call re-runs nothing and keeps the plan."""
    monkeypatch.chdir(tmp_path)
    import pandas as pd

    from llm_probe.cli import main
    from llm_probe.experiments.pinned import PINNED_SHA256
    from llm_probe.experiments.safe_step_experiment import PRESETS

    assert main(["safe-step", "--mode", "test", "--out", str(tmp_path), "--no-progress"]) == 0
    exp, plan = PRESETS["test"], json.loads((tmp_path / "plan.json").read_text())
    done = {p: p.stat().st_mtime_ns for p in (tmp_path / "runs").glob("*/done.json")}
    assert len(done) == 2 * (2 * len(exp.seeds) + sum(plan["used"].values()))
    for f in ("runs.csv", "survival.csv"):
        assert set(pd.read_csv(tmp_path / f).warm_sha256) == {PINNED_SHA256["tiny"]}
    assert json.loads((tmp_path / "claims.json").read_text())
    assert main(["safe-step", "--mode", "test", "--out", str(tmp_path), "--no-progress"]) == 0
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "runs").glob("*/done.json")} == done
    assert json.loads((tmp_path / "plan.json").read_text()) == plan


def test_safe_step_cell_from_init_from_equals_the_front_end_run(tmp_path, monkeypatch):
    """The protocol's cell (EXPERIMENT's run_cell through gapdyn.evidence.runner.run_cells into its own folder, no warm
    folder given) and the front end's run of the same (arm, lr, seed) from the same --init-from model give the same
    run row (times aside); the pinned checkpoint is not read."""
    import dataclasses

    from llm_probe.experiments import pinned
    from llm_probe.experiments import safe_step_experiment as sse
    from llm_probe.model import save_policy

    monkeypatch.chdir(tmp_path)
    model, tok = warm_model()
    save_policy(model, tok, tmp_path / "mine")
    monkeypatch.setattr(pinned, "pinned_warm", lambda *a, **k: (_ for _ in ()).throw(AssertionError("pinned read")))
    exp = dataclasses.replace(sse.PRESETS["test"], steps=2, tail=1, window=1, eval_every=1,
                              init_from=str(tmp_path / "mine"))
    cell = next(c for c in sse.cells(exp, (0,)) if c["arm"] == "safe")
    from gapdyn.evidence.runner import run_cells

    E = sse.EXPERIMENT
    run_cells([cell], tmp_path / "protocol", name=E.cell_name, result_file=E.result_file,
              run=lambda c, d: E.run_cell(**c, out=d), log=lambda *a, **k: None)
    got = sse.run_row(tmp_path / "protocol" / E.cell_name(cell))
    sse.run_folders([cell], tmp_path / "front", name=sse.cell_name, describe=str, progress=False,
                    run=lambda c, d: sse.run_cell(**c, out=d, warm_dir=exp.init_from))  # the front end's call
    want = sse.run_row(tmp_path / "front" / "runs" / sse.cell_name(cell))
    assert sse.cell_name(cell) == f"grpo_safe_lr{cell['lr']:g}_s0"
    drop = ("wall_s", "cpu_s", "dir")
    assert {k: v for k, v in got.items() if k not in drop} == {k: v for k, v in want.items() if k not in drop}
    assert len(want["reward"]) == 2 and got["dir"] != want["dir"]
    assert [e["step"] for e in read_evals_of(want["dir"])] == [0, 1, 2]


def read_evals_of(d):
    from llm_probe.experiments.ablation import read_evals

    return read_evals(d)


# --- the study's analysis on constructed run folders (fast) -----------------------------------------------------
R0 = 0.4
FALL = [R0] * 15 + [0.0] * 25  # ends collapsed (reward); held-out falls too
DIP = [R0] * 15 + [0.0] * 10 + [R0] * 15  # alerts, recovers
OK = [R0] * 40


def _write_run(root, arm, lr, seed, rewards, *, alert=None, heldout=(0.5, 0.5), fault=None, a_mean=1.0):
    d = root / "runs" / f"grpo_{arm}_lr{lr:g}_s{seed}"
    d.mkdir(parents=True)
    rows = [{"step": k, "reward": r, **({"alerts": ["reward_collapse"]} if k == alert else {})}
            for k, r in enumerate(rewards)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "eval.jsonl").write_text(json.dumps({"step": 0, "acc": heldout[0], "entropy": 1.0}) + "\n"
                                  + json.dumps({"step": len(rewards), "acc": heldout[1], "entropy": 1.0}) + "\n")
    (d / "done.json").write_text(json.dumps({"method": "grpo", "arm": arm, "lr": lr, "seed": seed, "fault": fault,
                                             "steps_run": len(rewards), "a_mean": a_mean, "wall_s": 1.0,
                                             "cpu_s": 2.0 if arm == "safe" else 1.0}))


def _exp():
    from llm_probe.experiments.safe_step_experiment import PRESETS

    return dataclasses_replace(PRESETS["test"], seeds=tuple(range(6)), steps=40, tail=10, window=3)


def dataclasses_replace(obj, **kw):
    import dataclasses

    return dataclasses.replace(obj, **kw)


def _study(root, seeds=range(6)):
    """Collapse lr: constant seeds 0-3 end collapsed, 4 alerts and recovers, 5 falls in reward but keeps its held-out
    accuracy (not collapsed); safe seed 0 ends collapsed, seed 5 failed, the rest healthy. Safe lr: the constant arm
    reaches the level late (a ramp from step 20), the safe arm early (from step 5 + seed)."""
    exp = _exp()
    for s in seeds:
        const = FALL if s < 4 or s == 5 else DIP
        _write_run(root, "constant", exp.collapse_lr, s, const, alert=18,
                   heldout=(0.5, 0.5) if s in (4, 5) else (0.5, 0.0))
        _write_run(root, "safe", exp.collapse_lr, s, FALL if s == 0 else OK, alert=18 if s == 0 else None,
                   heldout=(0.5, 0.0) if s == 0 else (0.5, 0.4), fault="stopped at step 20" if s == 5 else None,
                   a_mean=0.5)
        ramp = lambda k0: [R0] * k0 + [min(0.8, R0 + 0.05 * (k - k0)) for k in range(k0, 40)]  # noqa: E731
        _write_run(root, "constant", exp.safe_lr, s, ramp(20 + s % 3))
        _write_run(root, "safe", exp.safe_lr, s, ramp(5 + s))
    return exp


def test_outcome_columns_and_survival_from_run_folders(tmp_path):
    """Outcomes recomputed from the files with the held-out rule (a reward collapse with held-out accuracy kept is
    not collapsed), alerts counted apart, failed runs apart; survival.csv per arm and lr with the checkpoint hash."""
    import pandas as pd

    from llm_probe.experiments.safe_step_experiment import load_runs, summarize

    exp = _study(tmp_path)
    runs = load_runs(tmp_path).set_index(["arm", "lr", "seed"])
    lr = exp.collapse_lr
    assert [runs.loc[("constant", lr, s), "outcome"] for s in range(6)] == ["collapsed"] * 4 + ["recovered",
                                                                                                "recovered"]
    assert [runs.loc[("safe", lr, s), "outcome"] for s in range(6)] == ["collapsed"] + ["healthy"] * 4 + ["failed"]
    assert runs.loc[("constant", lr, 0), "collapse_step"] == 15 and runs.loc[("safe", lr, 1), "collapse_step"] == -1
    assert runs.loc[("constant", lr, 4), "reward_last25"] == pytest.approx(0.6 * R0)
    summarize(exp, tmp_path, warm_sha256="abc")
    surv = pd.read_csv(tmp_path / "survival.csv").set_index(["block", "arm", "lr"])
    row = surv.loc[("discovery", "constant", lr)]
    assert (row.n, row.alerted, row.recovered, row.collapsed, row.failed) == (6, 6, 2, 4, 0)
    row = surv.loc[("discovery", "safe", lr)]
    assert (row.n, row.alerted, row.recovered, row.collapsed, row.failed) == (6, 1, 0, 1, 1)
    assert row.cp_hi == pytest.approx(gapdyn.clopper_pearson_interval(1, 5).hi)
    assert set(surv.warm_sha256) == {"abc"} and set(pd.read_csv(tmp_path / "runs.csv").warm_sha256) == {"abc"}


def _coverage_table(valid_from: dict):
    """A coverage table (the columns gapdyn.evidence.coverage.valid_at reads) in which each method covers 0.95 from its n."""
    import pandas as pd

    return pd.DataFrame([dict(method=m, n=n, dgp=d, coverage=0.95 if n >= v else 0.8, nominal=0.95)
                         for m, v in valid_from.items() for n in (4, 8, 10, 16, 30) for d in ("d1", "d2")])


def test_claims_holm_over_the_primaries_only(tmp_path, monkeypatch):
    """fewer_collapses: Newcombe interval and one-sided Fisher on the non-failed pairs; not_slower: Fieller and the
    margin t test; Holm over these two only, the exploratory rows unadjusted; ids stable, the frozen hash on each
    (every interval valid from n = 4 here)."""
    from gapdyn.evidence import coverage
    from llm_probe.experiments import safe_step_experiment as sse

    table = _coverage_table(dict.fromkeys(set(sse.INTERVALS.values()), 4))
    monkeypatch.setattr(coverage, "frozen_table", lambda: table)
    exp = _study(tmp_path)
    claims, summary = sse.analyse_rows(exp, sse.load_runs(tmp_path), n_planned={exp.collapse_lr: 40})
    by = {c.id: c for c in claims}
    assert set(by) == {f"{f}@grpo_lr{exp.collapse_lr if f != 'not_slower' else exp.safe_lr:g}" for f in sse.SPECS}
    n, kc, ks = 5, 4, 1  # seed 5 dropped (its safe run failed)
    fc = by[f"fewer_collapses@grpo_lr{exp.collapse_lr:g}"]
    nw = gapdyn.evidence.stats.newcombe_difference(kc, n, ks, n)
    assert (fc.estimate, fc.interval, fc.n, fc.n_planned) == (pytest.approx(3 / 5), (nw.lo, nw.hi), 5, 40)
    assert fc.p_value == pytest.approx(gapdyn.fisher_exact_test([[kc, n - kc], [ks, n - ks]],
                                                                alternative="greater").p_value)
    prim = [c for c in claims if c.primary]
    assert sorted(c.id.split("@")[0] for c in prim) == sorted(sse.PRIMARIES) == ["fewer_collapses", "not_slower"]
    assert [c.p_adjusted for c in prim] == pytest.approx(list(gapdyn.holm_adjust([c.p_value for c in prim])))
    for c in claims:
        assert c.criteria_hash == sse.CRITERIA_HASH and c.criterion == sse.SPECS[c.id.split("@")[0]].criterion
        if not c.primary and c.p_value is not None:
            assert c.p_adjusted == c.p_value
    ns = by[f"not_slower@grpo_lr{exp.safe_lr:g}"]
    g = summary["safe_lr"]
    assert g["level"] == pytest.approx(0.5 * (R0 + 0.8)) and g["reached_constant"] == g["reached_safe"] == 6
    assert ns.estimate == pytest.approx(g["steps_safe"] / g["steps_constant"]) and ns.estimate < 1


def test_a_claim_whose_interval_is_not_valid_at_its_n_is_not_measured(tmp_path, monkeypatch):
    """Each interval is used only where the coverage table finds it valid at the row's n (gapdyn.evidence.coverage.valid_at):
    with Newcombe valid from 10 and Fieller from 16, 5 collapse-lr pairs leave fewer_collapses not measured (its
    Fisher p still in Holm), 11 measure it; 12 safe-lr pairs leave not_slower not measured; the reason names the
    method, its valid n and docs/coverage.md; the interval of a measured row is the method's own."""
    from gapdyn.evidence import coverage
    from llm_probe.experiments import safe_step_experiment as sse

    table = _coverage_table({"newcombe_difference": 10, "fieller_paired_ratio": 16, "clopper_pearson": 4,
                             "percentile_paired_mean": 8, "studentized_paired_mean": 8})
    monkeypatch.setattr(coverage, "frozen_table", lambda: table)
    small, large = tmp_path / "small", tmp_path / "large"
    exp = _study(small)
    _study(large, seeds=range(12))
    by = {c.id.split("@")[0]: c for c in sse.analyse_rows(exp, sse.load_runs(small))[0]}
    fc = by["fewer_collapses"]
    assert not fc.measured and fc.verdict == "inconclusive" and fc.n == 5 and fc.estimate == pytest.approx(3 / 5)
    assert "newcombe_difference valid from n = 10, docs/coverage.md" in fc.why and fc.p_value is not None
    assert by["collapse_constant"].measured and by["collapse_constant"].interval == pytest.approx(
        gapdyn.clopper_pearson_interval(4, 5).interval)
    assert not by["not_slower"].measured and "fieller_paired_ratio valid from n = 16" in by["not_slower"].why
    fr = by["final_reward"]
    assert not fr.measured and f"{sse.INTERVALS['final_reward']} valid from n = 8, docs/coverage.md" in fr.why
    by = {c.id.split("@")[0]: c for c in sse.analyse_rows(exp, sse.load_runs(large))[0]}
    kc, ks, n = 4, 1, 11  # constant seeds 0-3 end collapsed, safe seed 0; seed 5 dropped (its safe run failed)
    assert by["fewer_collapses"].measured and by["fewer_collapses"].n == n
    lo, hi = by["final_reward"].interval
    assert by["final_reward"].measured and lo < by["final_reward"].estimate < hi
    assert by["fewer_collapses"].interval == gapdyn.evidence.stats.newcombe_difference(kc, n, ks, n).interval
    ns = by["not_slower"]
    assert not ns.measured and ns.n == 12 and "(n = 12; fieller_paired_ratio valid from n = 16" in ns.why


def test_fieller_interval_inverts_the_paired_t_test():
    """rho is inside the Fieller 95 % interval exactly when the two-sided paired t test of num - rho den does not
    reject at 0.05 (scipy, a scan); the margin p is that test's one-sided half."""
    from scipy.stats import ttest_1samp

    from llm_probe.experiments.safe_step_experiment import fieller_paired_ratio, one_sided_margin_t

    rng = np.random.default_rng(3)
    for _ in range(20):
        n = int(rng.integers(4, 30))
        den = rng.uniform(20, 60, n)
        num = den * rng.uniform(0.4, 1.4) + rng.normal(0, 8, n)
        est = fieller_paired_ratio(num, den)
        for rho in np.linspace(est.lo - 0.3, est.hi + 0.3, 61):
            inside = ttest_1samp(num - rho * den, 0.0).pvalue >= 0.05
            if min(abs(rho - est.lo), abs(rho - est.hi)) > 1e-6:
                assert inside == (est.lo <= rho <= est.hi)
        p = ttest_1samp(num - 1.1 * den, 0.0).pvalue
        assert one_sided_margin_t(num, den, 1.1) == pytest.approx(p / 2 if num.mean() < 1.1 * den.mean() else 1 - p / 2)
    with pytest.raises(ValueError, match="num and den"):
        fieller_paired_ratio([1.0], [2.0])


def test_planner_wiring_on_a_known_effect():
    """make_plan's planned n equals a plain scan of the planner's power functions at alpha / 2 primaries; used n is
    min(max(planned, floor), affordable); the planned t-test power agrees with a Monte Carlo of the margin test."""
    from scipy.stats import t as student_t

    from gapdyn.evidence.planner import power_mean, power_two_proportions
    from llm_probe.experiments.safe_step_experiment import PRESETS, allocate, make_plan

    exp = dataclasses_replace(PRESETS["full"], n_floor=30, budget_cpu_s=3000.0)
    pilot = {"p_constant": 0.7, "p_safe": 0.25, "d_mean": -6.0, "d_sd": 15.0}
    cost = {exp.collapse_lr: 40.0, exp.safe_lr: 30.0}
    plan = make_plan(exp, pilot, cost, cpu_spent=600.0)
    na = next(n for n in range(2, 500) if power_two_proportions(0.7, 0.25, n, alpha=0.025) >= 0.8)
    nb = next(n for n in range(2, 500) if power_mean(-6.0, 15.0, n, confidence=0.95) >= 0.8)
    assert plan["planned"] == {f"{exp.collapse_lr:g}": na, f"{exp.safe_lr:g}": nb}
    want = {exp.collapse_lr: max(na, 30), exp.safe_lr: max(nb, 30)}
    assert plan["used"] == {f"{k:g}": v for k, v in allocate(want, cost, 2400.0).items()}
    assert sum(plan["used"][f"{k:g}"] * c for k, c in cost.items()) <= 2400.0
    rng = np.random.default_rng(0)  # Monte Carlo: the one-sided t test at 0.025 on nb normal differences
    d = rng.normal(-6.0, 15.0, (20000, nb))
    tstat = d.mean(1) / (d.std(1, ddof=1) / np.sqrt(nb))
    assert np.mean(tstat < student_t.ppf(0.025, nb - 1)) == pytest.approx(0.8, abs=0.03)
    none = make_plan(exp, {"p_constant": 0.2, "p_safe": 0.4}, cost, cpu_spent=0.0)
    assert none["planned"][f"{exp.collapse_lr:g}"] == 500 and "not decidable" in none["planned_reason"][
        f"{exp.collapse_lr:g}"]


def test_allocate_fits_the_budget():
    from llm_probe.experiments.safe_step_experiment import allocate

    assert allocate({"a": 30, "b": 30}, {"a": 2.0, "b": 1.0}, 1000) == {"a": 30, "b": 30}
    got = allocate({"a": 100, "b": 30}, {"a": 2.0, "b": 1.0}, 100)
    assert got == {"b": 30, "a": 35} and 2 * got["a"] + got["b"] <= 100
    with pytest.raises(ValueError, match="cost"):
        allocate({"a": 1}, {"a": 0.0}, 10)


def test_criteria_are_frozen_at_import_and_written_before_any_run(tmp_path, monkeypatch):
    """SPECS and their hash exist at module level, before any run; run_study writes criteria.json (that hash) before
    its first run."""
    import importlib
    import sys

    sys.modules.pop("llm_probe.experiments.safe_step_experiment", None)
    sse = importlib.import_module("llm_probe.experiments.safe_step_experiment")
    assert sse.CRITERIA_HASH == gapdyn.criteria_hash({k: v.criterion for k, v in sse.SPECS.items()})
    assert sse.CRITERIA_HASH == sse.EXPERIMENT.criteria_hash and sse.PRIMARIES == ("fewer_collapses", "not_slower")
    seen = []

    def first_run(*a, **k):
        seen.append(json.loads((tmp_path / "criteria.json").read_text())["criteria_hash"])
        raise RuntimeError("stop")

    monkeypatch.setattr(sse, "warm_folder", lambda exp: (tmp_path, "sha"))
    monkeypatch.setattr(sse, "run_cell", first_run)
    with pytest.raises(RuntimeError, match="stop"):
        sse.run_study(sse.PRESETS["test"], tmp_path, progress=False)
    assert seen == [sse.CRITERIA_HASH]
