"""The one warm-up cache (llm_probe.warmup.warm_model): keyed by the settings the bits depend on, reused
without training, rebuilt when incomplete, and byte-identical to a warm-up done by hand."""

import dataclasses
import importlib
import threading
import time

import pytest
import torch

from llm_probe.model import TinyQwenSpec, build_tiny_qwen, save_policy
from llm_probe.tasks import AdditionTask
from llm_probe.tokenizer import build_char_tokenizer
from tests.llm_helpers import SMALL

wu = importlib.import_module("llm_probe.warmup")  # the package's ``warmup`` attribute is the function
warmup_by_hand = wu.warmup  # unpatched

FAST = dict(spec=SMALL, steps=3, batch_size=8, lr=1e-3, seed=0, num_threads=1)


@pytest.fixture
def counted(monkeypatch):
    """Counts the supervised steps warm_model runs (the real warm-up, through its callback)."""
    steps = []
    real = wu.warmup

    def counting(*a, **k):
        return real(*a, **k, callback=lambda i, loss: steps.append(i))

    monkeypatch.setattr(wu, "warmup", counting)
    return steps


def _key(**kw):
    kw = {**{k: v for k, v in FAST.items() if k != "num_threads"}, **kw}
    return wu.warm_key(wu.warm_settings(**kw))


def test_key_changes_with_every_setting_and_not_with_irrelevant_ones(monkeypatch, tmp_path):
    base = _key()
    changed = [_key(spec=dataclasses.replace(SMALL, num_hidden_layers=1)), _key(spec=dataclasses.replace(SMALL, arch="qwen3")),
               _key(task=AdditionTask(10, 50)), _key(steps=4), _key(seed=1), _key(lr=2e-3), _key(batch_size=4),
               _key(alphabet="0123456789+="), _key(dtype="bfloat16"), _key(num_threads=2)]
    from llm_probe.experiments.ablation import SplitAddition

    changed += [_key(task=SplitAddition(20)), _key(task=SplitAddition(7))]
    monkeypatch.setattr(torch, "__version__", "0.0.0-other")
    changed.append(_key())
    monkeypatch.undo()
    assert base not in changed and len(set(changed)) == len(changed)
    assert _key() == base == _key(task=AdditionTask()) == _key(num_threads=torch.get_num_threads())
    # where it is cached, and how it is announced or shown, are not settings
    a = wu.warm_model(**FAST, root=tmp_path / "a", announce=False, progress=False)
    b = wu.warm_model(**FAST, root=tmp_path / "b", announce=True, progress=True)
    assert a.name == b.name == _key(num_threads=1)
    assert a.parent == tmp_path / "a" / "warm"


def test_second_call_reuses_the_folder_without_training(tmp_path, counted, capsys):
    d = wu.warm_model(**FAST, root=tmp_path)
    assert counted == [0, 1, 2] and "warming up once" in capsys.readouterr().out
    stamps = {p: p.stat().st_mtime_ns for p in d.iterdir()}
    again = wu.warm_model(**FAST, root=tmp_path)
    assert again == d and counted == [0, 1, 2]
    assert f"using the cached warm model at {d}" in capsys.readouterr().out
    assert stamps == {p: p.stat().st_mtime_ns for p in d.iterdir()}
    # a second warm-up of the same shape announces the time expected at the measured rate
    wu.warm_model(**{**FAST, "seed": 1}, root=tmp_path)
    assert "warming up once: ~" in capsys.readouterr().out


@pytest.mark.parametrize("damage", ["marker", "weights_and_marker", "garbage"])
def test_a_folder_without_its_completion_marker_is_rebuilt(tmp_path, counted, damage):
    d = wu.warm_model(**FAST, root=tmp_path)
    want = (d / "model.safetensors").read_bytes()
    if damage == "garbage":
        import shutil

        shutil.rmtree(d)
        d.mkdir()
        (d / "config.json").write_text("{not json")
    else:
        (d / wu.WARM_MARKER).unlink()
        if damage == "weights_and_marker":
            (d / "model.safetensors").write_bytes(b"torn")
    assert wu.warm_model(**FAST, root=tmp_path) == d
    assert counted == [0, 1, 2] * 2 and (d / wu.WARM_MARKER).is_file()
    assert (d / "model.safetensors").read_bytes() == want
    assert not list(d.parent.glob("*.tmp-*"))


def test_cached_bytes_equal_a_warm_up_by_hand_at_one_thread(tmp_path):
    from llm_probe.threads import configure_threads

    d = wu.warm_model(**FAST, root=tmp_path)
    configure_threads(1)
    tok = build_char_tokenizer()
    model = build_tiny_qwen(tok, SMALL, seed=0)
    wu.warmup(model, tok, AdditionTask(), steps=3, batch_size=8, lr=1e-3, seed=0)
    ref = save_policy(model, tok, tmp_path / "by_hand")
    assert (d / "model.safetensors").read_bytes() == (ref / "model.safetensors").read_bytes()
    # and not equal to an unwarmed model: the comparison can fail
    save_policy(build_tiny_qwen(tok, SMALL, seed=0), tok, tmp_path / "cold")
    assert (tmp_path / "cold" / "model.safetensors").read_bytes() != (ref / "model.safetensors").read_bytes()


def test_a_caller_waits_on_the_lock_and_reuses_what_the_holder_built(tmp_path, counted):
    """While another holder has the lock the call waits; once the holder has finished the folder, it is reused."""
    key = _key(num_threads=1)
    folder = wu.warm_root(tmp_path)
    got = []
    with wu._locked(folder / f"{key}.lock"):
        t = threading.Thread(target=lambda: got.append(wu.warm_model(**FAST, root=tmp_path, announce=False)))
        t.start()
        time.sleep(0.3)
        assert t.is_alive() and not got  # blocked on the lock
        other = wu.warm_model(**FAST, root=tmp_path / "elsewhere", announce=False)  # "the holder" builds it
        import shutil

        shutil.copytree(other, folder / key)
        n = len(counted)
    t.join(10)
    assert got == [folder / key] and len(counted) == n  # no second warm-up


def test_bad_settings_name_the_argument():
    for kw, name in ((dict(steps=-1), "steps"), (dict(batch_size=0), "batch_size"), (dict(lr=0.0), "lr"),
                     (dict(spec="big"), "spec"), (dict(task=object()), "task")):
        with pytest.raises(ValueError, match=name):
            wu.warm_settings(**kw)


def test_trainer_warm_up_goes_through_the_cache_and_equals_a_warm_up_by_hand(tmp_path, monkeypatch, counted):
    """build_policy (no --init-from) takes the cached warm model: the same weights as building and warming by
    hand, and a second trainer of the same settings does not warm again."""
    from llm_probe.config import TrainConfig
    from llm_probe.trainer import build_policy

    monkeypatch.chdir(tmp_path)  # the cache lives under ./gapdyn_out
    monkeypatch.delenv(wu.WARM_CACHE_ENV, raising=False)  # (the suite points it at a session folder)
    cfg = TrainConfig(out_dir=str(tmp_path / "run"), warmup_steps=3, warmup_batch=8, seed=2, num_threads=1,
                      device="cpu")
    model, tok = build_policy(cfg, AdditionTask())
    assert counted == [0, 1, 2] and len(list((tmp_path / "gapdyn_out" / "warm").glob(f"*/{wu.WARM_MARKER}"))) == 1
    ref = build_tiny_qwen(build_char_tokenizer(), TinyQwenSpec(), seed=2)
    warmup_by_hand(ref, build_char_tokenizer(), AdditionTask(), steps=3, batch_size=8, lr=cfg.warmup_lr, seed=2)
    for (n, a), (_, b) in zip(model.state_dict().items(), ref.state_dict().items()):
        assert torch.equal(a, b), n
    build_policy(cfg, AdditionTask())
    assert counted == [0, 1, 2]
