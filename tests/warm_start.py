"""`python -m lm_eval ...`, `python -m rf_eval ...` (and pytest, and scripts) for the tests, each a process of
its own started warm.

Each such process spends about 4.5 s of CPU importing torch, transformers, datasets and lm-eval's model
modules before it reads its first argument; the suite starts dozens. A warm starter (one per test worker)
imports those libraries once and forks a child per command: the child sets its environment, folder and
argv, points its standard streams at the caller's files and runs the module as `python -m` does
(`runpy`, exit status from `SystemExit`, interpreter exit with its atexit handlers). It is still a
process of its own: the test reads its exit status and its output, and nothing the command does reaches
the worker or the next command.

The starter imports no rf-eval module but the startup hook (`rf_eval._startup`, which every interpreter
imports), `rf_eval.lm_eval_ruler` (which reads no variable at import) and, offline, lm-eval's RULER
generator through it (`RULER_GENERATOR`, which brings the task manager and index the hook wraps, and
`rf_eval.task_index_cache` with them: it reads its variable when an index is built), so everything that
reads rf-eval's variables (RF_EVAL_FILL_PATH, RF_EVAL_TASK_INDEX_CACHE, ...) reads them in the child, after
the command's environment is set. The libraries it does import read some variables once, at import
(HF_HUB_OFFLINE, OMP_NUM_THREADS, ...): a command whose environment differs from the starter's in any
variable of those families runs as a plain subprocess instead (`run` decides), and so does any command
while RF_EVAL_TESTS_COLD=1.
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

#: what the starter imports: what every lm_eval/rf-eval command would import anyway
PRELOAD = ("torch", "transformers", "datasets", "transformers.modeling_utils", "transformers.masking_utils",
           "transformers.generation", "transformers.models.llama.modeling_llama", "lm_eval.api.model",
           "lm_eval.api.registry", "lm_eval.models.huggingface")
#: lm-eval's RULER generator, which builds its word list at import (about 7 s here): every RULER task that
#: generates its samples imports it. Preloaded only offline, through rf-eval's own offline import
#: (`rf_eval.lm_eval_ruler.ruler_module`: nltk's downloader off, lm-eval's "Downloaded punkt_tab" line
#: unprinted); online its import may try the network, so each command imports it itself.
RULER_GENERATOR = "niah_utils"
#: variables the preloaded libraries read at import: a command that sets any of them differently runs cold
IMPORT_TIME = ("HF_", "HUGGINGFACE", "TRANSFORMERS", "TORCH", "PYTORCH", "CUDA", "OMP_", "MKL_", "KMP_",
               "TOKENIZERS", "DATASETS", "PYTHON", "LD_", "RF_EVAL_NO_LM_EVAL_HOOK", "NLTK", "LOCAL_RANK")


def _import_time(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME)}


# ------------------------------------------------------------------------------------------ the starter


def _child(request: dict) -> int:
    """In the forked child: become the command, run it, return its exit status."""
    import runpy
    import traceback

    os.setsid()  # its own process group: a timeout kills it and whatever it started
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    script = request.get("script")
    # as `python -m` puts the current folder first, and `python script.py` the script's folder
    sys.path[0] = os.path.dirname(os.path.abspath(script)) if script else request["cwd"]
    sys.argv = [script or request["module"], *request["args"]]
    try:
        if script:
            runpy.run_path(script, run_name="__main__")
        else:
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - reported as Python reports an uncaught exception
        traceback.print_exc()
        code = 1
    return code


def serve() -> int | None:
    """The starter's loop: one JSON request a line on stdin; replies {"pid"} then {"returncode"}. In a
    child it returns the command's exit status (the caller exits with it); in the starter, None at EOF."""
    import importlib

    from rf_eval import lm_eval_ruler

    for name in PRELOAD:
        importlib.import_module(name)
    if lm_eval_ruler.offline():
        try:  # it also imports lm-eval's task manager and index, which the startup hook wraps here
            lm_eval_ruler.ruler_module(RULER_GENERATOR)
        except ImportError:  # no RULER extras (nltk, wonderwords): each command finds that out itself
            pass
    # What the starter imported stays alive in every child: out of the collector's sight, a child neither
    # walks it in each collection nor, at exit, copies the pages it touches (measured: a command that
    # refuses its model_args took 3.4 s from fork to exit, 1.5 s with this; the command itself, its
    # atexit handlers and its interpreter exit run as before).
    gc.freeze()
    print(json.dumps({"ready": os.getpid()}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            return _child(request)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)
    return None


# ------------------------------------------------------------------------------------------ the caller


class _Starter:
    def __init__(self, env: dict[str, str]) -> None:
        self.env = dict(env)
        self.proc = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=self.env, cwd=tempfile.gettempdir())
        self.ready = json.loads(self.proc.stdout.readline())["ready"]
        self.lock = threading.Lock()

    def matches(self, env: dict[str, str]) -> bool:
        return self.proc.poll() is None and _import_time(env) == _import_time(self.env)

    def run(self, module: str, args: list[str], env: dict[str, str], cwd: str, timeout: float,
            script: str | None = None) -> subprocess.CompletedProcess:
        with self.lock, tempfile.TemporaryDirectory(prefix="warm-start-") as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            request = {"module": module, "script": script, "args": args, "env": env, "cwd": cwd, "stdout": str(out),
                       "stderr": str(err)}
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            pid = json.loads(self.proc.stdout.readline())["pid"]
            killed: list[int] = []
            timer = threading.Timer(timeout, lambda: killed.append(_kill_group(pid)))
            timer.start()
            try:
                code = json.loads(self.proc.stdout.readline())["returncode"]
            finally:
                timer.cancel()
            argv = [sys.executable, *([script] if script else ["-m", module]), *args]
            if killed:
                raise subprocess.TimeoutExpired(argv, timeout, out.read_text(), err.read_text())
            return subprocess.CompletedProcess(argv, code, out.read_text(errors="replace"),
                                               err.read_text(errors="replace"))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


def _kill_group(pid: int) -> int:
    import signal

    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    return pid


_starters: list[_Starter] = []


def run(module: str, args: list[str], *, env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None,
        timeout: float = 600, script: str | None = None) -> subprocess.CompletedProcess:
    """`python -m <module> <args>` (or `python <script> <args>`) with `env` (default: this process's) in `cwd`,
    output captured as text, as `subprocess.run(..., capture_output=True, text=True, timeout=timeout)`
    returns it."""
    env = dict(os.environ if env is None else env)
    cwd = str(cwd or os.getcwd())
    if os.environ.get("RF_EVAL_TESTS_COLD") != "1" and hasattr(os, "fork"):
        starter = next((s for s in _starters if s.matches(env)), None)
        if starter is None:
            starter = _Starter(env)
            _starters.append(starter)
        return starter.run(module, list(args), env, cwd, timeout, script)
    argv = [sys.executable, *([script] if script else ["-m", module]), *args]
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def run_argv(argv: list[str], *, env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None,
             timeout: float = 600) -> subprocess.CompletedProcess:
    """`argv` as `subprocess.run(argv, capture_output=True, text=True, ...)` runs it: warm (`run`) where it is
    `python -m lm_eval|rf_eval|pytest ...`, `python SCRIPT.py ...` or the `lm_eval` script of this
    environment, a plain subprocess otherwise (`python -c`: a fresh interpreter is what those check)."""
    argv = [str(a) for a in argv]
    script = str(Path(sys.executable).parent / "lm_eval")
    if argv[:2] == [sys.executable, "-m"] and argv[2] in ("lm_eval", "rf_eval", "pytest"):
        return run(argv[2], argv[3:], env=env, cwd=cwd, timeout=timeout)
    if argv[0] == sys.executable and argv[1].endswith(".py"):
        return run("", argv[2:], env=env, cwd=cwd, timeout=timeout, script=argv[1])
    if argv[0] == script:
        return run("lm_eval", argv[1:], env=env, cwd=cwd, timeout=timeout)
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


@atexit.register
def _close_all() -> None:
    for starter in _starters:
        starter.close()


if __name__ == "__main__":
    status = serve()
    sys.exit(status or 0)
