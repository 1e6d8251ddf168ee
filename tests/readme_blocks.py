"""Run README.md's fenced command blocks as written, after a checked substitution table (tests/test_readme.py).

`parse_blocks` reads the fenced blocks in order with the heading they sit
under; `Sub` is one substitution whose `old` text must occur in its block
(so a README edit that drops it fails loudly instead of running something
else); `Workspace` is the shared working directory the blocks run in, one
after another, as a reader would run them: every bash block in its own
`bash -e -o pipefail` in a new session (its background servers are ended
with it), every python block as a script.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w*)\s*$")
HEADING = re.compile(r"^(#{2,3}) (.+?)\s*$")


@dataclass(frozen=True)
class Block:
    section: str  # the nearest ## or ### heading above the block
    lang: str
    line: int  # 1-based line of the opening fence
    text: str


def parse_blocks(markdown: str) -> list[Block]:
    """The fenced blocks of a Markdown text, in order."""
    blocks, section, lang, start, body = [], "", None, 0, []
    for number, line in enumerate(markdown.splitlines(), 1):
        fence = FENCE.match(line)
        if lang is None:
            if fence:
                lang, start, body = fence.group(1), number, []
            elif HEADING.match(line):
                section = HEADING.match(line).group(2)
        elif fence and not fence.group(1):
            blocks.append(Block(section, lang, start, "\n".join(body) + "\n"))
            lang = None
        else:
            body.append(line)
    assert lang is None, f"README.md: the block opened at line {start} is never closed"
    return blocks


def readme_blocks() -> list[Block]:
    return parse_blocks(README.read_text(encoding="utf-8"))


@dataclass(frozen=True)
class Sub:
    """Replace every `old` in a block by `new`; `<name>` in `new` is a workspace value (a path, a port)."""

    old: str
    new: str
    why: str

    def apply(self, text: str, values: dict[str, str], where: str) -> str:
        assert self.old in text, f"README drift: {where} no longer contains {self.old!r} (substituted: {self.why})"
        new = self.new
        for name, value in values.items():
            new = new.replace(f"<{name}>", value)
        assert "<" not in new or ">" not in new, f"unfilled value in {new!r}"
        return text.replace(self.old, new)


def substitute(block: Block, subs: list[Sub], values: dict[str, str]) -> str:
    text = block.text
    for sub in subs:
        text = sub.apply(text, values, f"the block of '{block.section}' (README.md line {block.line})")
    return text


def load_helper(relative: str):
    """Another test folder's helper module, loaded by path (test folders are not packages)."""
    path = TESTS / relative
    name = f"rf_eval_readme_{path.stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules[name]


@dataclass
class Ran:
    section: str
    script: str  # what ran, after substitution
    returncode: int
    output: str  # stdout and stderr together
    seconds: float
    values: dict[str, str] = field(default_factory=dict)  # what filled the substitutions' <names>

    def tail(self, n: int = 6000) -> str:
        return f"--- {self.section}: exit {self.returncode} after {self.seconds:.0f}s; script:\n{self.script}\n" \
               f"--- output (last {n} characters):\n{self.output[-n:]}"


@dataclass
class Workspace:
    """The folder the README blocks run in, with the environment they run under."""

    root: Path
    env: dict[str, str]
    values: dict[str, str] = field(default_factory=dict)

    def run(self, section: str, lang: str, script: str, timeout: float) -> Ran:
        slug = re.sub(r"\W+", "_", section).strip("_").lower()
        logs = self.root / "readme_logs"
        logs.mkdir(exist_ok=True)
        if lang == "bash":
            path = logs / f"{slug}.sh"
            cmd = ["bash", "-e", "-o", "pipefail", str(path)]
        elif lang == "python":
            path = logs / f"{slug}.py"
            cmd = [sys.executable, str(path)]
        else:
            raise AssertionError(f"no runner for ```{lang} blocks")
        path.write_text(script, encoding="utf-8")
        log = logs / f"{slug}.log"
        t0 = time.monotonic()
        # output to a file, not a pipe: a server the block leaves running must not keep the test waiting
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, cwd=self.root, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                code = -1
            finally:
                end_session(proc.pid)
        return Ran(section, script, code, log.read_text(errors="replace"), time.monotonic() - t0)


def end_session(pgid: int) -> None:
    """SIGTERM the block's whole session (bash and what it left in the background), then SIGKILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 15.0
        while time.monotonic() < deadline and _running(pgid):
            time.sleep(0.1)
        if not _running(pgid):
            return


def _running(pgid: int) -> bool:
    """True while a process of group `pgid` runs (zombies left for init to reap do not count)."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False
