"""Every subcommand of ``gapdyn`` and every option its ``--help`` lists, walked once at the parser.

For each command line (``gapdyn demo``, ``gapdyn bandit run``, ``gapdyn train <sub>``, ...) the options are read
from the command's own ``--help`` (what a user is told exists), then each is given

- a valid value through the real entry point ``gapdyn.cli.main``: the command parses it into its config and the
  config differs from the one without the option in exactly one field, which holds the value given (a switch:
  ``--x`` and ``--no-x``, one of them the default; a choice: every choice listed);
- a bad value of its kind: a word for a number, an unlisted choice, ``--switch=x``, a text value the config
  itself refuses, else a missing value: exit 2 and exactly one stderr line that names the option.

Nothing runs: :func:`gapdyn.cmdline.parse` is replaced, for the walk, by one that raises :class:`Parsed` with the
config it parsed, so a command stops right after parsing (its own checks before that still run, such as the
config's ``__post_init__``). A value the parser wrongly accepts ends the same way and is reported, never run.
Values the command checks after parsing (a ``--from`` folder without runs, ``--jobs 0``) are in test_cli.py.
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys

import pytest

from gapdyn import cmdline
from gapdyn.cli import commands, main
from tests.tables import check_table

try:
    import torch  # noqa: F401

    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False

TRAIN_SUBCOMMANDS = ("warmup", "demo", "ablation", "early-warning", "entropy", "entropy-lemma", "offline",
                     "safe-step", "testbed")
"""``gapdyn train <sub>`` (llm_probe.cli.SUBCOMMANDS; checked below)."""

REQUIRED = {  # what a command line needs besides the walked option (a positional, a required option)
    ("bandit", "run"): ["length"],
    ("inspect",): ["some/run"],
    ("train", "early-warning"): ["--from", "some/study"],
    ("train", "entropy"): ["--from", "some/study"],
    ("train", "offline"): ["--before", "b", "--after", "a", "--rollouts", "r.jsonl", "--out", "o"],
}

WITH = {  # ("command [sub]", option) -> the other options it is given with (options the config requires together)
    ("lr-finder", "--model"): ["--model", "m", "--task", "t.jsonl", "--lr", "0.001"],
    ("lr-finder", "--task"): ["--model", "m", "--task", "t.jsonl", "--lr", "0.001"],
    ("train", "--probe-alignment"): ["--probe-prompts", "0"],  # the ghost route tracks no probe prompts
}

ALIASES = {  # ("command [sub]", option) -> the other field it is documented to set too (the same as ...)
    ("train demo", "--seed"): "seeds",
}

GENERIC = {"INT": ("3", "5"), "FLOAT": ("0.5", "1.5"), "text": ("x", "y")}
"""Valid values tried in turn for an option of each kind until one is not the default."""
MORE = {"INT": "4", "FLOAT": "0.25", "text": "z"}
"""The second value of an option that takes several."""

VALID = {  # option -> a valid value other than the default where the generic ones are refused or mean less;
    # keyed by the flag, or by ("command [sub]", flag) where commands differ
    "--arms": ["50"], "--device": ["cpu"], "--dtype": ["float64"], "--method": ["wapo"], "--methods": ["grpo", "psr"],
    "--collapse.blowup-factor": ["4"], "--params": ["lm_head"], "--probe-params": ["lm_head"], "--route": ["dot"],
    "--only": ["fig1"], ("train offline", "--device"): ["cuda"],
}

BAD_TEXT = {  # text options whose config refuses a value at parse time: option -> a refused value
    ("train", "--device"): "tpu", ("train", "--dtype"): "float8", ("train", "--method"): " ",
    ("train", "--out"): " ",
}


class Parsed(BaseException):
    """Raised by the walk's parse with the config it parsed (not an Exception: no command catches it)."""

    def __init__(self, config):
        super().__init__("parsed")
        self.config = config


def command_lines() -> list[tuple[str, ...]]:
    """Every command line that parses options: each registered command, bandit's `run`, train's subcommands."""
    out = []
    for name in commands():
        if name == "bandit":
            out.append(("bandit", "run"))  # `bandit list` takes no option (test_cli.py)
        elif name == "train":
            out += [("train",)] + [("train", sub) for sub in TRAIN_SUBCOMMANDS]
        else:
            out.append((name,))
    return out


@pytest.fixture
def dry(monkeypatch):
    """Make every command stop right after it parsed: gapdyn.cmdline.parse and each module's imported name for it
    raise :class:`Parsed`. The command modules are imported first, so the names they bound are found."""
    missing = {}
    for name, ep in commands().items():
        try:
            ep.load()
            if name == "train":
                import llm_probe.experiments.demo  # noqa: F401  (imported by `train demo` before it parses)
                import llm_probe.testbed.cli  # noqa: F401
        except ImportError as exc:  # an extra not installed: that command is skipped
            missing[name] = str(exc)
    real = cmdline.parse

    def parse_only(cls, argv, prog, description=None):
        raise Parsed(real(cls, argv, prog, description))

    for mod in list(sys.modules.values()):
        if getattr(mod, "parse", None) is real:
            monkeypatch.setattr(mod, "parse", parse_only)
    return missing


def _call(argv, capsys):
    """('parsed', config) or ('refused', exit code, stdout, stderr) of ``gapdyn <argv>`` under the dry parse."""
    try:
        rc = main(list(argv))
    except Parsed as p:
        capsys.readouterr()
        return "parsed", p.config
    out = capsys.readouterr()
    return "refused", rc, out.out, out.err


_BOX = str.maketrans("│╭╮╰╯─", "      ")
_META = re.compile(r"^(\{None\}\|)?(\{[^{}]*\}|[\[{]*[A-Z][A-Z_]*[\]}]*|\.\.\.[\]}]*|\[[A-Z][A-Z_]*)$")


@dataclasses.dataclass
class Option:
    flags: tuple[str, ...]  # ("--x",) or ("--x", "--no-x") for a switch
    metavar: str

    @property
    def switch(self) -> bool:
        return len(self.flags) == 2

    @property
    def choices(self) -> list[str] | None:
        m = re.fullmatch(r"(?:\{None\}\|)?\{([^{}\[\]]*)\}", self.metavar)
        return m.group(1).split(",") if m else None

    @property
    def many(self) -> bool:
        return "..." in self.metavar

    @property
    def kind(self) -> str:
        return "INT" if "INT" in self.metavar else "FLOAT" if "FLOAT" in self.metavar else "text"


def listed_options(help_text: str) -> list[Option]:
    """The options a --help lists: lines at the indent of ``-h, --help`` that start with ``--``, with the
    metavar written after the flags (up to the help text, two or more spaces on)."""
    lines = [line.translate(_BOX).rstrip() for line in help_text.splitlines()]
    indent = next(len(x) - len(x.lstrip()) for x in lines if x.lstrip().startswith("-h, --help"))
    found = []
    for line in lines:
        text = line.lstrip()
        if len(line) - len(text) != indent or not text.startswith("--"):
            continue
        m = re.match(r"(--[a-zA-Z][\w.-]*)(?:, (--[a-zA-Z][\w.-]*))?(.*)", text)
        if not m:  # a rule of dashes (a group's heading)
            continue
        head = re.split(r"\s{2,}", m.group(3).strip())[0].split(" ") if m.group(3).strip() else []
        meta = []
        for tok in head:
            if not _META.match(tok):
                break
            meta.append(tok)
        found.append(Option(tuple(f for f in m.group(1, 2) if f), " ".join(meta)))
    return found


def _flat(config, prefix=""):
    """The config's fields as {"a.b": value}, nested configs opened."""
    out = {}
    for f in dataclasses.fields(config):
        v = getattr(config, f.name)
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            out.update(_flat(v, f"{prefix}{f.name}."))
        else:
            out[prefix + f.name] = v
    return out


def _same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def _holds(value, tokens: list[str]) -> bool:
    """Whether a parsed field holds the values written as ``tokens``."""
    values = list(value) if isinstance(value, (tuple, list)) else [value]
    if len(values) != len(tokens):
        return False
    for v, t in zip(values, tokens):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            if str(v) != t:
                return False
        elif float(v) != float(t):
            return False
    return True


def _valid_values(cmd, opt: Option) -> tuple[list[list[str]], bool]:
    """(argv pieces that give ``opt`` valid values, whether each must be tried): a switch's two forms and every
    choice are all tried; a value option's candidates (VALID's, else GENERIC's) until one is not the default."""
    if opt.switch:
        return [[f] for f in opt.flags], True
    if opt.choices:
        return [[opt.flags[0], c] for c in opt.choices], True
    flag = opt.flags[0]
    chosen = VALID.get((" ".join(cmd), flag)) or VALID.get(flag)
    values = [chosen] if chosen else [[v] for v in GENERIC[opt.kind]]
    if opt.many:
        values = [v if len(v) > 1 else v + [MORE[opt.kind]] for v in values]
    return [[flag, *v] for v in values], False


def _bad_values(cmd, opt: Option) -> list[list[str]]:
    """Argv pieces that give ``opt`` a value of the wrong kind (each must be refused naming the option)."""
    flag = opt.flags[0]
    if opt.switch:
        return [[f"{f}=x"] for f in opt.flags]
    bad = []
    if opt.choices:
        bad.append([flag, "no-such-choice"])
    elif opt.kind in ("INT", "FLOAT"):
        bad.append([flag, "x"] + (["3"] if opt.many else []))
    elif (" ".join(cmd), flag) in BAD_TEXT:
        bad.append([flag, BAD_TEXT[(" ".join(cmd), flag)]])
    elif not opt.many:
        bad.append([flag])  # free text: the value missing
    return bad


def _help(cmd, capsys) -> str:
    rc = main([*cmd, "--help"])
    out = capsys.readouterr()
    assert rc == 0 and not out.err, (cmd, rc, out.err[-500:])
    return out.out


def _walk(cmd, capsys, tmp_path, monkeypatch) -> int:
    monkeypatch.chdir(tmp_path)  # nothing a command creates by mistake lands in the repository
    options = listed_options(_help(cmd, capsys))
    assert options, cmd

    def base_argv(opt: Option) -> list[str]:
        return [*cmd, *REQUIRED.get(cmd, []), *WITH.get((" ".join(cmd), opt.flags[0]), [])]

    def valid(before, opt, piece):
        got = _call([*base_argv(opt), *piece], capsys)
        assert got[0] == "parsed", f"refused: {got[3].strip()}"
        after = _flat(got[1])
        changed = [k for k in before if not _same(before[k], after[k])]
        alias = ALIASES.get((" ".join(cmd), opt.flags[0]))
        assert len([k for k in changed if k != alias]) <= 1, f"changed {changed}"
        return changed, after

    bases = {}

    def check_option(opt: Option):
        argv = tuple(base_argv(opt))
        if argv not in bases:
            bases[argv] = _call(argv, capsys)
        base = bases[argv]
        assert base[0] == "parsed", f"the command line without the option is refused: {base[3].strip()}"
        before = _flat(base[1])
        pieces, every = _valid_values(cmd, opt)
        results = []
        for piece in pieces:
            results.append(valid(before, opt, piece))
            if results[-1][0] and not every:
                break
        pieces = pieces[:len(results)]
        changed = [c for c, _ in results if c]
        assert changed, "no valid value changed the config (the option reaches no field)"
        assert len({c[0] for c in changed}) == 1, f"its values change different fields: {changed}"
        field = changed[0][0]
        for piece, (c, after) in zip(pieces, results):
            if opt.switch:
                assert after[field] is (not piece[0].startswith("--no-")), (piece, after[field])
            else:
                assert _holds(after[field], piece[1:]), (piece, field, after[field])
        for piece in _bad_values(cmd, opt):
            got = _call([*base_argv(opt), *piece], capsys)
            assert got[0] == "refused", f"{' '.join(piece)!r} was accepted: {field} = {_flat(got[1])[field]!r}"
            _, rc, _, err = got
            lines = err.strip().splitlines()
            assert rc == 2 and len(lines) == 1, (piece, rc, err[-800:])
            assert opt.flags[0] in lines[0] or opt.flags[-1] in lines[0], (piece, lines[0])
            assert "Traceback" not in err

    n = check_table(((" ".join(o.flags), (o,)) for o in options), check_option)
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "a command created files while only parsing"
    return n


def test_the_walk_covers_every_subcommand():
    """A new subcommand (entry point, bandit or train subcommand) is walked or this fails."""
    lines = command_lines()
    assert {c[0] for c in lines} == set(commands())
    if HAVE_TORCH:
        from llm_probe.cli import SUBCOMMANDS

        assert set(TRAIN_SUBCOMMANDS) == set(SUBCOMMANDS)
    import bandits.cli

    assert re.findall(r"^  (\w+)  ", bandits.cli._USAGE, flags=re.M) == ["list", "run"]


@pytest.mark.parametrize("cmd", command_lines(), ids=" ".join)
def test_every_listed_option_parses_a_valid_value_and_refuses_a_bad_one(cmd, dry, capsys, tmp_path, monkeypatch):
    if cmd[0] in dry:
        pytest.skip(f"needs an extra: {dry[cmd[0]]}")
    _walk(cmd, capsys, tmp_path, monkeypatch)


def test_the_walk_detects_a_dead_option(dry, capsys, tmp_path, monkeypatch):
    """The walk's own check can fail: an option listed in --help whose value reaches no field is reported."""
    import gapdyn.demo

    real_parse = gapdyn.demo.parse

    def drop_seed(cls, argv, prog, description=None):  # --seed silently ignored
        argv = list(argv)
        if "--seed" in argv:
            i = argv.index("--seed")
            del argv[i:i + 2]
        return real_parse(cls, argv, prog, description)

    monkeypatch.setattr(gapdyn.demo, "parse", drop_seed)
    with pytest.raises(pytest.fail.Exception, match=r"--seed: .*no valid value changed the config"):
        _walk(("demo",), capsys, tmp_path, monkeypatch)


def test_a_switch_given_a_value_names_the_switch():
    """tyro says only "Unrecognized options: x"; the one line names the option the stray value was given to."""
    from gapdyn.demo import DemoConfig

    cases = {("--progress=no",): "--progress is a switch and takes no value (give --progress or --no-progress)",
             ("--no-progress=1",): "--no-progress is a switch",
             ("--seed", "1", "2"): "unexpected value '2' after --seed 1",
             ("--seed", "2", "--arms", "50", "2"): "unexpected value '2' after --arms 50",
             ("--fast",): "Unrecognized options: --fast"}
    for argv, said in cases.items():
        with pytest.raises(cmdline.UsageError) as info:
            cmdline.parse(DemoConfig, list(argv), prog="gapdyn demo")
        assert said in str(info.value), (argv, str(info.value))


def test_both_renderings_of_an_error_box_give_the_same_one_line():
    """tyro draws its error box in Unicode on a UTF-8 terminal and in ASCII dashes otherwise (a captured stderr):
    the line is the message alone in both (formerly the ASCII rules stayed in it)."""
    unicode_box = ("╭─ Value error ─────────────╮\n│ Error parsing --seed: bad │\n│ ───────────────────────── │\n"
                   "│ Argument helptext:        │\n╰───────────────────────────╯\n")
    ascii_box = (" Value error                \n ------------------------- \n  Error parsing --seed: bad \n"
                 "  -------------------------\n  For full helptext, run p --help\n")
    for text in (unicode_box, ascii_box):
        assert cmdline._one_line(text) == "Error parsing --seed: bad"
