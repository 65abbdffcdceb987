"""Command-line papercuts: "did you mean" for near-miss command, experiment and figure names (checked against
every one-edit typo of each name, and against difflib's own ranking), the n a claims table shows for a claim not
measured (the sample its reason names, not the estimate's placeholder), and no stale section name in help or docs."""

from __future__ import annotations

import dataclasses
import difflib
import subprocess
import sys
from pathlib import Path

import pytest

import gapdyn
from gapdyn.cmdline import did_you_mean, resolve_name

ROOT = Path(__file__).resolve().parents[1]


def _groups() -> dict[str, tuple[str, ...]]:
    """Every set of names the command line resolves with a "did you mean", read from its registry."""
    from bandits.cli import SUBCOMMANDS as BANDIT
    from bandits.experiments import EXPERIMENTS
    from gapdyn.cli import commands
    from llm_probe.cli import SUBCOMMANDS as TRAIN
    from llm_probe.config import LOSS_NAMES
    from paper_figs.cli import FIGURES

    return {"commands": tuple(commands()), "bandit": tuple(BANDIT), "experiments": tuple(EXPERIMENTS),
            "train": tuple(TRAIN), "figures": FIGURES, "losses": LOSS_NAMES}


def _typos(word: str):
    """Every deletion, adjacent transposition and doubled letter of ``word`` (one edit)."""
    out = {word[:i] + word[i + 1:] for i in range(len(word))}
    out |= {word[:i] + word[i + 1] + word[i] + word[i + 2:] for i in range(len(word) - 1)}
    out |= {word[:i] + word[i] + word[i:] for i in range(len(word))}
    return out - {word}


@pytest.mark.parametrize("group", ["commands", "bandit", "experiments", "train", "figures", "losses"])
def test_every_one_edit_typo_names_its_word_or_nothing_on_a_tie(group):
    """A one-edit typo is answered with its word, checked against difflib's own ranking of the whole names; it
    names nothing only where two names are equally close (gpro: grpo and gspo)."""
    names = _groups()[group]
    named = 0
    for word in names:
        for typo in _typos(word):
            if len(typo) < 3 or typo in names:
                continue
            hint = did_you_mean(typo, names)
            ratios = sorted((difflib.SequenceMatcher(None, typo, n).ratio() for n in names), reverse=True)
            tie = len(ratios) > 1 and ratios[0] == ratios[1]
            assert hint == f"did you mean {word!r}? " or (hint == "" and tie), (typo, hint, ratios[:2])
            named += hint != ""
    assert named > 0
    assert did_you_mean("zzzzzz", names) == ""


def test_ties_and_stems():
    figures = ("fig1_phase_diagram", "fig2_critical_eta", "fig7_llm_probe")
    assert did_you_mean("fig9", figures) == ""  # equally close to fig1, fig2, fig7: no guess
    assert did_you_mean("fig_critical", figures) == "did you mean 'fig2_critical_eta'? "
    experiments = _groups()["experiments"]
    with pytest.raises(ValueError, match=r"unknown experiment 'treshold'; did you mean 'threshold'\? choose from"):
        resolve_name("treshold", experiments, "experiment")
    # a name matched by its whole self wins a tie with one matched by its part before '_' only
    assert did_you_mean("stagntion", experiments) == "did you mean 'stagnation'? "
    assert did_you_mean("stagnation_nosy", experiments) == "did you mean 'stagnation_noisy'? "


def test_the_dispatcher_suggests_a_near_command_in_its_one_line(capsys):
    from gapdyn.cli import main

    assert main(["trian"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown command 'trian'; did you mean 'train'? commands:" in err[0]
    assert main(["frobnicate"]) == 2
    assert "did you mean" not in capsys.readouterr().err


def test_claims_n_of_an_unmeasured_claim_is_the_sample_its_reason_names():
    from gapdyn.evidence.coverage import too_few_reason
    from paper_figs.report import claim_n

    c = gapdyn.Claim(id="x.y", source="s", statement="s", setting="any", statistic="mean", estimate=0.1,
                     interval=(0.0, 0.2), n=17, criterion_text="c", criterion=gapdyn.Criterion.above(0.0),
                     form="comparison", n_planned=40)
    assert claim_n(c) == "17 / 40 planned"
    short = dataclasses.replace(c, n=1, measured=False,
                                reason=too_few_reason("studentized_cluster_mean", 20, "instances"))
    assert claim_n(short) == "20 / 40 planned"  # the estimate's n = 1 is a placeholder
    same = dataclasses.replace(short, reason="no interval: every one of the 40 instances has the same value (0)")
    assert claim_n(same) == "40 / 40 planned"
    assert claim_n(dataclasses.replace(short, reason="no interval method for this statistic", n_planned=None)) == "-"


def test_no_stale_section_name_in_help_or_docs():
    readme = (ROOT / "README.md").read_text()
    assert "\n## What it found" in readme
    texts = {p: p.read_text() for p in [*ROOT.glob("docs/*.md"), *ROOT.glob("paper_figs/*.py"), ROOT / "README.md"]}
    stale = [str(p.relative_to(ROOT)) for p, t in texts.items() if '"What holds"' in t]
    assert not stale, stale
    out = subprocess.run([sys.executable, "-m", "gapdyn.cli", "--help"], capture_output=True, text=True, cwd=ROOT,
                         check=True).stdout
    assert '"What it found"' in out and "What holds" not in out


# ---- flags: near misses, optional settings' help, a nested setting's range error, an empty --only ----------------

@dataclasses.dataclass
class _Inner:
    window: int = 5
    """Rolling window."""

    def __post_init__(self):
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")


@dataclasses.dataclass
class _Cfg:
    seeds: int = 2
    """Instances."""
    out: str | None = None
    """A folder."""
    lrs: tuple[float, ...] | None = None
    """Learning rates."""
    inner: _Inner = dataclasses.field(default_factory=_Inner)
    """Nested settings."""


def test_a_near_miss_flag_is_named_and_an_unknown_one_is_not():
    from gapdyn.cmdline import UsageError, parse

    with pytest.raises(UsageError, match=r"--sedes.*; did you mean --seeds\?$"):
        parse(_Cfg, ["--sedes", "3"], prog="t")
    with pytest.raises(UsageError) as err:
        parse(_Cfg, ["--zzzzzz", "3"], prog="t")
    assert "did you mean" not in str(err.value)


def test_a_nested_settings_range_error_names_its_flag():
    from gapdyn.cmdline import parse

    with pytest.raises(ValueError, match=r"^--inner\.window must be >= 1, got 0$"):
        parse(_Cfg, ["--inner.window", "0"], prog="t")


def test_optional_settings_show_their_type_in_help_and_still_read_none(capsys):
    from gapdyn.cmdline import parse

    with pytest.raises(SystemExit):
        parse(_Cfg, ["--help"], prog="t")
    help_text = capsys.readouterr().out
    assert "{None}" not in help_text
    usage = help_text.splitlines()[0]
    assert "[--out STR]" in usage and "[--lrs [FLOAT [FLOAT ...]]]" in usage, usage
    assert parse(_Cfg, [], prog="t").out is None and parse(_Cfg, ["--out", "None"], prog="t").out is None
    assert parse(_Cfg, ["--lrs", "1e-3", "2"], prog="t").lrs == (1e-3, 2.0)
    assert parse(_Cfg, ["--out", "d"], prog="t").out == "d"


def test_figs_only_without_a_name_is_an_error_not_every_figure():
    from paper_figs.cli import FIGURES, figure_names

    assert figure_names(None) == FIGURES
    assert figure_names(("fig5",)) == ("fig5_taxonomy",)
    with pytest.raises(ValueError, match="--only needs at least one figure name"):
        figure_names(())


def test_train_names_a_mistyped_subcommand(capsys):
    from llm_probe.cli import main

    assert main(["ablaton"]) == 2
    assert "unknown subcommand 'ablaton'; did you mean 'ablation'? " in capsys.readouterr().err
