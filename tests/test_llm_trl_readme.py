"""README's "Probe your own TRL run" snippet, run as printed: TRL's default GRPOConfig (gradient checkpointing on,
bf16 on, temperature 1, max_completion_length 256) on a tiny warmed Qwen2 given the snippet's names (model,
tokenizer, ds, my_reward); every probed step is measured (none skipped) and the run's state is left as TRL set
it."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("trl")
pytest.importorskip("datasets")

pytestmark = pytest.mark.llm

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_readme_trl_snippet_runs_unchanged_on_the_default_grpo_config(tmp_path, monkeypatch, capsys):
    import torch
    from datasets import Dataset

    from llm_probe.tasks import AdditionTask
    from tests.llm_helpers import warm_model

    torch.set_num_threads(1)
    section = README.split("## Probe your own TRL run", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert "GRPOConfig(" in code and "gradient_checkpointing" not in code  # TRL's default: on
    model, tokenizer = warm_model()
    probs = AdditionTask().sample(np.random.default_rng(0), 2)  # 2 prompts a step: 1 step an epoch, 3 epochs
    ds = Dataset.from_dict({"prompt": [p.prompt for p in probs], "answer": [p.answer for p in probs]})

    def my_reward(prompts, completions, completion_ids=None, answer=None, **kw):
        return [float(c.strip() == a) for c, a in zip(completions, answer)]

    monkeypatch.chdir(tmp_path)  # output_dir="out"
    if not torch.cuda.is_available():  # transformers refuses bf16 (GRPOConfig's default) on a CPU-only machine
        import transformers.training_args as ta  # unless use_cpu=True: let it run there as it runs on a GPU

        monkeypatch.setattr(ta, "is_torch_bf16_gpu_available", lambda: True)
    scope = {"model": model, "tokenizer": tokenizer, "ds": ds, "my_reward": my_reward}
    exec(compile(code, "README.md", "exec"), scope)
    trainer, cb = scope["trainer"], scope["cb"]
    assert trainer.args.gradient_checkpointing and model.is_activation_checkpointing  # on, and left on
    assert trainer.state.global_step == 3
    assert cb.skipped_steps == [] and [r["step"] for r in cb.history] == [0]  # probe_every=10
    assert len(scope["rows"]) == 1 and scope["rows"][0]["gap/M_batch"] == cb.history[0]["gap/M_batch"]
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    s = cb.summary()
    assert (printed == "nan" and math.isnan(s["suggested_lr"])) or float(printed) == s["suggested_lr"]


def test_the_readme_cpu_note_makes_its_grpo_config_construct_without_a_gpu():
    """The snippet's GRPOConfig(...) as printed, and with the addition the README's CPU note names: on a machine
    without a GPU transformers' own validation refuses the first (TRL's default bf16) and accepts the second."""
    import torch
    from trl import GRPOConfig

    section = README.split("## Probe your own TRL run", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    (call,) = re.findall(r"^args = (GRPOConfig\(.*\))", code, flags=re.M)
    (extra,) = re.findall(r"without a GPU, add `([a-z0-9_]+=[A-Za-z0-9_]+)` to `GRPOConfig\(\.\.\.\)`", section)
    scope = {"GRPOConfig": GRPOConfig}
    with_note = call[:-1] + ", " + extra + ")"
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="bf16"):
            eval(call, scope)
    args = eval(with_note, scope)
    assert args.bf16 is False and args.gradient_checkpointing  # the rest stays TRL's default
