"""`rf-eval` command line: one subcommand per module in `rf_eval.cli`.

Subcommands are imported only when chosen, so `rf-eval --help` stays fast.
Each command module defines `add_arguments(parser)` and `run(args) -> int`.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from rf_eval.errors import UserError, explain, traceback_wanted

__all__ = ["COMMANDS", "UserError", "main"]

# name -> (module, one-line help). Add a command by adding a module and a line.
COMMANDS: dict[str, tuple[str, str]] = {
    "tiny-model": ("rf_eval.cli.tiny_model", "write a tiny random model + local tokenizer"),
    "families": ("rf_eval.cli.families", "the supported model types as a Markdown table (--readme: rewrite it)"),
    "fills": ("rf_eval.cli.fills", "the fills as a Markdown table (--readme: rewrite it)"),
    "methods": ("rf_eval.cli.methods", "the prefill methods (built in and plug-ins) as a Markdown table"),
    "demo": ("rf_eval.cli.demo", "the main job on the embedded demo model: fit, run arms, report"),
    "demo-model": ("rf_eval.cli.demo_model", "convert the embedded demo model once (or reuse it); print its path"),
    "fit": ("rf_eval.cli.fit", "capture a model's hidden states and fit RidgeFill maps"),
    "convert-projector": (
        "rf_eval.cli.convert_projector",
        "a released RidgeFill projector folder (int8 or bf16) as an rf-eval map file for its model",
    ),
    "overlap": (
        "rf_eval.cli.overlap",
        "calibration texts vs evaluation texts: same sha256, or a shared run of 50+ words (exit 1 if any)",
    ),
    "fit-transfer": ("rf_eval.cli.fit_transfer", "fit RaReCache's source -> target KV-cache maps"),
    "fit-state-correction": (
        "rf_eval.cli.fit_state_correction",
        "fit Delta-M for the terminal-state correction of Gated DeltaNet layers",
    ),
    "fetch-data": ("rf_eval.cli.fetch_data", "download what the named tasks read from the network, for offline nodes"),
    "check-equivalence": (
        "rf_eval.cli.check_equivalence",
        "engine with the fill off vs the plain model, bitwise (or two servers: --base-url A --base-url B)",
    ),
    "serve": ("rf_eval.cli.serve", "serve a model's arms behind an OpenAI-compatible API (completions, chat)"),
    "ttft": ("rf_eval.cli.ttft", "time to first token of two arms on one server (median, ratio of medians)"),
    "load": ("rf_eval.cli.load", "time to first token of two arms under Poisson load (median, p99, saturation mu)"),
    "report": ("rf_eval.cli.report", "paired statistics of lm-eval runs as HTML, LaTeX and Markdown"),
    "ledger": ("rf_eval.cli.ledger", "register claims in the hash-chained run ledger; verify it"),
    "study": ("rf_eval.cli.study", "a whole registered study in one command: plan, run (resumable), status"),
}


class OneLineParser(argparse.ArgumentParser):
    """argparse with its errors on one line (the usage is `--help`'s), exit status 2 as argparse's."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (`{self.prog} --help` lists the options)\n")

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        """argparse's, refusing an empty value: no option of rf-eval means anything by "" (a path "" would
        be the current folder, written into or read as a file)."""
        parsed, rest = super().parse_known_args(args, namespace)
        for action in self._actions:
            value = getattr(parsed, action.dest, None)
            values = value if isinstance(value, list) else [value]
            if any(isinstance(v, str) and not v.strip() for v in values):
                name = "/".join(action.option_strings) or action.dest
                self.error(f"argument {name}: an empty value; give a {action.metavar or action.dest}")
        return parsed, rest


def _parser(name: str) -> argparse.ArgumentParser:
    module_name, help_ = COMMANDS[name]
    parser = OneLineParser(prog=f"rf-eval {name}", description=help_)
    importlib.import_module(module_name).add_arguments(parser)
    return parser


def _usage() -> str:
    width = max(len(n) for n in COMMANDS)
    lines = ["usage: rf-eval COMMAND [options]", "", "commands:"]
    lines += [f"  {name.ljust(width)}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "`rf-eval COMMAND --help` describes one command."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"rf-eval: unknown command {name!r}; valid commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    try:
        args = _parser(name).parse_args(rest)
    except SystemExit as stop:  # --help (0), or a bad argument already printed in one line (2)
        return stop.code if isinstance(stop.code, int) else 2
    try:
        return int(module.run(args) or 0)
    except Exception as err:  # bad input (ours, or a file or value a library below refused): one line
        message = explain(err)
        if message is None or traceback_wanted():
            raise
        print(f"rf-eval {name}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
