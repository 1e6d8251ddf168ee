"""Every `rf-eval` subcommand and the `lm_eval` entry, walked with generic hostile values: an empty string, a
negative number, NaN, a folder where a file is expected, a file where a folder is expected, non-UTF-8 bytes,
a path that does not exist. Each must end with exit status 2 and one line on stderr, no traceback, and
before any model weights load (the expensive step a bad value must not reach)."""

from __future__ import annotations

import argparse
import os

import pytest
from warm_start import run_argv

from rf_eval.cli import COMMANDS, _parser, main

NUMBER_TYPES = ("positive_int", "nonnegative_int", "positive_float", "nonnegative_float", "probability", "port", "int", "float")


def subcommands_in_help(capsys) -> set[str]:
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    listed = text.split("commands:", 1)[1].split("\n\n", 1)[0]
    return {line.split()[0] for line in listed.splitlines() if line.strip()}


def number_options() -> list[tuple[str, list[str], str]]:
    """(command, the argv that reaches the option, option) for every numeric option of every subcommand."""
    found: list[tuple[str, list[str], str]] = []

    def walk(name: str, parser: argparse.ArgumentParser, prefix: list[str]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, subparser in action.choices.items():
                    walk(name, subparser, [*prefix, sub])
            elif getattr(action.type, "__name__", None) in NUMBER_TYPES and action.option_strings:
                found.append((name, prefix, action.option_strings[0]))

    for name in COMMANDS:
        walk(name, _parser(name), [name])
    return found


def test_the_walk_covers_every_subcommand(capsys, walk_table):
    assert set(walk_table) == subcommands_in_help(capsys) == set(COMMANDS)


@pytest.mark.parametrize("value", ["-5", "nan", ""])
def test_every_numeric_option_refuses_hostile_numbers_in_one_line(capsys, value):
    options = number_options()
    assert len(options) > 30
    for command, argv, option in options:
        assert main([*argv, option, value]) == 2, (command, option, value)
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"argument {option}" in err and "Traceback" not in err, (command, option, err)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory, tiny_model_dir):
    """The hostile paths, and good values for the other arguments."""
    root = tmp_path_factory.mktemp("hostile")
    folder = root / "a_folder"
    folder.mkdir()
    (folder / "x.txt").write_text("x")
    file = root / "a_file.txt"
    file.write_text("plain text\n")
    binary = root / "binary.jsonl"
    binary.write_bytes(b'{"text": "\xff\xfe\xfd caf\xe9"}\n')
    calibration = root / "cal.jsonl"
    calibration.write_text('{"text": "a b c d e f g"}\n')
    return {"folder": str(folder), "file": str(file), "binary": str(binary), "missing": str(root / "missing"),
            "empty": "", "model": tiny_model_dir("llama"), "cal": str(calibration), "root": root}


# command -> (base argv with {placeholders}, {option: the kind of value it expects}); each hostile value for
# that kind (`hostile_values`) replaces the option's value in turn.
WALK = {
    "tiny-model": (["--family", "llama", "--out", "{out}"], {"--out": "folder"}),
    "families": (["--readme", "{file}"], {"--readme": "text"}),
    "fills": (["--readme", "{file}"], {"--readme": "text"}),
    "methods": ([], {}),  # no options
    "demo": (["--quick", "--out", "{out}", "--readme", "{file}"], {"--readme": "text", "--out": "folder"}),
    "demo-model": (["--print-path", "--no-install", "--cache-dir", "{out}"], {"--cache-dir": "folder"}),
    "fit": (["--model", "{model}", "--splits", "3", "--calibration", "{cal}", "--out", "{out}"],
            {"--model": "folder", "--calibration": "text", "--out": "folder"}),
    "convert-projector": (["{folder}", "--model", "{model}", "--out", "{out}"], {"--model": "folder", "--out": "folder"}),
    "fit-transfer": (["--source", "{model}", "--target", "{model}", "--calibration", "{cal}", "--out", "{out}"],
                     {"--source": "folder", "--calibration": "text", "--out": "folder"}),
    "fit-state-correction": (["--model", "{model}", "--calibration", "{cal}", "--out", "{out}"],
                             {"--model": "folder", "--calibration": "text"}),
    "fetch-data": (["--tasks", "niah_single_1_filled", "--out", "{out}"], {"--out": "folder", "--tasks": "name"}),
    "check-equivalence": (["--model", "{model}", "--lengths", "8", "--json", "{out}/eq.json"],
                          {"--model": "folder", "--json": "outfile"}),
    "serve": (["--model", "{model}", "--fill", "exact", "--port", "1"], {"--model": "folder"}),
    "ttft": (["--base-url", "http://127.0.0.1:9", "--lengths", "8", "--prompt", "{file}", "--repeats", "1"],
             {"--prompt": "text"}),
    "load": (["--base-url", "http://127.0.0.1:9", "--lengths", "8", "--rates", "1", "--requests", "2",
              "--discard", "0", "--prompt", "{file}", "--out", "{out}/load.json"],
             {"--prompt": "text", "--out": "outfile"}),
    "report": (["{folder}", "--reference", "exact", "--html", "{out}/r.html"],
               {"runs": "folder", "--html": "outfile", "--ledger": "text"}),
    "ledger": (["add", "--claim", "c", "--prediction", "p", "--config", "{file}", "--ledger", "{out}/l.jsonl"],
               {"--config": "file", "--ledger": "outfile"}),
    "study": (["plan", "{file}"], {"study": "text"}),
    "overlap": (["--calibration", "{cal}", "--eval", "{file}", "--json", "{out}/o.json"],
                {"--calibration": "text", "--eval": "docs", "--json": "outfile"}),
}


@pytest.fixture(scope="module")
def walk_table():
    return WALK


def hostile_values(kind: str) -> list[str]:
    """text: a text file read; file: any file read (hashed); outfile: a file written; folder: a folder; docs:
    documents as keytoken_nll reads them (a folder of them or one file)."""
    return {"text": ["folder", "binary", "missing", "empty"], "file": ["folder", "missing", "empty"],
            "outfile": ["folder", "empty"], "folder": ["file", "empty"],
            "docs": ["binary", "missing", "empty"]}.get(kind, ["empty"])


def cases() -> list[tuple[str, str, str]]:
    return [(command, option, value) for command, (_argv, options) in WALK.items()
            for option, kind in options.items() for value in hostile_values(kind)]


@pytest.mark.parametrize("command, option, value", cases())
def test_hostile_paths_are_one_line_and_exit_2_before_any_weights_load(command, option, value, hostile, tmp_path,
                                                                        capsys, monkeypatch):
    from transformers import PreTrainedModel

    def no_weights(*args, **kwargs):
        raise AssertionError(f"rf-eval {command} {option}={value} reached the weights")

    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(no_weights))
    values = {**hostile, "out": str(tmp_path / "out")}
    argv = [a.format(**values) for a in WALK[command][0]]
    given = hostile[value]
    if option.startswith("-"):
        at = argv.index(option) if option in argv else None
        argv = [*argv[: at + 1], given, *argv[at + 2 :]] if at is not None else [*argv, option, given]
    else:  # the positional argument: the first one after the subcommand's own words
        positional = next(i for i, a in enumerate(argv) if not a.startswith("-") and a not in ("add", "plan"))
        argv[positional] = given
    try:
        code = main([command, *argv])
    except SystemExit as stop:
        code = stop.code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, (command, option, value, err[-1500:])
    assert len(lines) == 1 and lines[0].startswith("rf-eval") and "Traceback" not in err, (command, option, err)


@pytest.mark.parametrize("model_args, says", [
    ("pretrained=,fill=exact", "pretrained"),
    ("pretrained={file},fill=exact", "pretrained="),
    ("pretrained={folder},fill=exact", "pretrained="),
    ("pretrained={binary},fill=exact", "pretrained="),
    ("pretrained={model},fill=exact,dtype=nan", "dtype=nan is not valid"),
    ("pretrained={model},fill=exact,tail=-5", "tail must be >= 1"),
    ("pretrained={model},fill=exact,max_length=-5", "max_length must be >= 2"),
])
def test_the_lm_eval_entry_refuses_hostile_model_args_in_one_line(model_args, says, hostile, th_argv, tmp_path):
    args = model_args.format(**hostile)
    cmd = th_argv + ["--model", "ridgefill", "--model_args", args, "--tasks", "niah_single_1_filled",
                     "--metadata", '{"max_seq_lengths": [512], "tail": 256}', "--output_path", str(tmp_path)]
    done = run_argv(cmd, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("rf-eval")]
    assert len(lines) == 1 and says in lines[0], done.stderr[-2000:]


@pytest.fixture(scope="module")
def th_argv():
    import sys

    return [sys.executable, "-m", "lm_eval"]
