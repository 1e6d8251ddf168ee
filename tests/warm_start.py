"""`python -m lm_eval ...`, `python -m rf_eval ...` (and pytest, and scripts) for the tests, each a process of
its own started warm.

Each such process spends about 4.5 s of CPU importing torch, transformers, datasets and lm-eval's model
modules before it reads its first argument; the suite starts dozens. A warm starter (one per test worker)
imports those libraries once and forks a child per command: the child sets its environment, folder and
argv, points its standard streams at the caller's files and runs the module as `python -m` does
(`runpy`, exit status from `SystemExit`, interpreter exit with its atexit handlers). It is still a
process of its own: the test reads its exit status and its output, and nothing the command does reaches
the worker or the next command.

The starter imports no rf-eval module but the startup hook (`rf_eval.model_adapters.startup`, which every interpreter
imports), `rf_eval.harness.lm_eval_ruler` (which reads no variable at import) and, offline, lm-eval's RULER
generator through it (`RULER_GENERATOR`, which brings the task manager and index the hook wraps, and
`rf_eval.harness.task_index_cache` with them: it reads its variable when an index is built), so everything that
reads rf-eval's variables (RF_EVAL_FILL_PATH, RF_EVAL_TASK_INDEX_CACHE, ...) reads them in the child, after
the command's environment is set. The libraries it does import read some variables once, at import
(HF_HUB_OFFLINE, OMP_NUM_THREADS, ...): a command whose environment differs from the starter's in any
variable of those families runs in a starter started with that environment instead (`run` decides), and any
command runs as a plain subprocess while RF_EVAL_TESTS_COLD=1. One such variable is applied again in the
child instead: NLTK_DATA, whose folders nltk puts first on `nltk.data.path` at import (the tests' session
fixtures set their own punkt folders, and each new value cost a starter of its own, about 12 s).

`run`/`run_argv` wait for the command, as `subprocess.run` does; `popen_argv` starts one and returns a
`subprocess.Popen`-like handle (`WarmProcess`: a server, or runs that go on beside the test). A starter
runs any number of commands at once and reports each exit status as it comes.
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import select
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
#: (`rf_eval.harness.lm_eval_ruler.ruler_module`: nltk's downloader off, lm-eval's "Downloaded punkt_tab" line
#: unprinted); online its import may try the network, so each command imports it itself.
RULER_GENERATOR = "niah_utils"
#: variables the preloaded libraries read at import: a command that sets any of them differently runs cold
IMPORT_TIME = ("HF_", "HUGGINGFACE", "TRANSFORMERS", "TORCH", "PYTORCH", "CUDA", "OMP_", "MKL_", "KMP_",
               "TOKENIZERS", "DATASETS", "PYTHON", "LD_", "RF_EVAL_NO_LM_EVAL_HOOK", "NLTK", "LOCAL_RANK")


#: of those, the ones the child applies again itself (`_reapply_nltk_data`)
REAPPLIED = ("NLTK_DATA",)


def _import_time(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME) and k not in REAPPLIED}


def _nltk_folders(value: str | None) -> list[str]:
    """NLTK_DATA's folders as nltk's import reads them (`nltk/data.py`: split on os.pathsep, ~ expanded)."""
    return [os.path.expanduser(d) for d in (value or "").split(os.pathsep) if d]


def _reapply_nltk_data(starter_value: str | None, command_value: str | None) -> None:
    """Make `nltk.data.path`, if the starter imported nltk, what the command's own import would have built:
    its NLTK_DATA folders first, in place of the starter's."""
    data = sys.modules.get("nltk.data")
    if data is None or starter_value == command_value:
        return
    old = _nltk_folders(starter_value)
    if data.path[: len(old)] != old:
        raise RuntimeError(f"warm start: nltk.data.path {data.path} does not start with NLTK_DATA's {old}")
    data.path[: len(old)] = _nltk_folders(command_value)


# ------------------------------------------------------------------------------------------ the starter


def _child(request: dict) -> int:
    """In the forked child: become the command, run it, return its exit status."""
    import runpy
    import traceback

    os.setsid()  # its own process group: a timeout kills it and whatever it started
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), 1)
    if request["stderr"] is None:  # stderr=subprocess.STDOUT
        os.dup2(1, 2)
    else:
        os.dup2(os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), 2)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115
    starter_nltk_data = os.environ.get("NLTK_DATA")
    os.environ.clear()
    os.environ.update(request["env"])
    _reapply_nltk_data(starter_nltk_data, os.environ.get("NLTK_DATA"))
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
    """The starter's loop: one JSON request a line on stdin, answered {"pid"} once the command is forked;
    {"pid", "returncode"} when a command exits, whichever it is. In a child it returns the command's exit
    status (the caller exits with it); in the starter, None at EOF, once every command has exited."""
    import importlib

    from rf_eval.harness import lm_eval_ruler

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
    pending, running, stdin_open = b"", set(), True
    while stdin_open or running:
        # wake for a request, or every 20 ms while commands run, to report the ones that exited
        if not select.select([0] if stdin_open else [], [], [], 0.02 if running else None)[0]:
            pass
        elif chunk := os.read(0, 1 << 16):
            pending += chunk
        else:
            stdin_open = False
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                return _child(json.loads(line))
            running.add(pid)
            print(json.dumps({"pid": pid}), flush=True)
        for pid in list(running):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                running.discard(pid)
                print(json.dumps({"pid": pid, "returncode": os.waitstatus_to_exitcode(status)}), flush=True)
    return None


# ------------------------------------------------------------------------------------------ the caller


class _Starter:
    """One starter process, and a thread that reads its replies: forked pids in request order, exit statuses
    by pid."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = dict(env)
        self.proc = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=self.env, cwd=tempfile.gettempdir())
        self.ready = json.loads(self.proc.stdout.readline())["ready"]
        self.lock = threading.Lock()  # one request at a time: its {"pid"} reply is the next one
        self.changed = threading.Condition()
        self.forked: list[int] = []
        self.exited: dict[int, int] = {}
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            reply = json.loads(line)
            with self.changed:
                if "returncode" in reply:
                    self.exited[reply["pid"]] = reply["returncode"]
                else:
                    self.forked.append(reply["pid"])
                self.changed.notify_all()
        self.proc.wait()  # its output ended: reaped before the waiters look, so that they see it gone
        with self.changed:  # nothing more will come
            self.changed.notify_all()

    def matches(self, env: dict[str, str]) -> bool:
        return self.proc.poll() is None and _import_time(env) == _import_time(self.env)

    def spawn(self, module: str, args: list[str], env: dict[str, str], cwd: str, stdout: str,
              stderr: str | None, script: str | None = None) -> int:
        """Fork the command; its pid. `stderr` None: into stdout's file."""
        request = {"module": module, "script": script, "args": args, "env": env, "cwd": cwd, "stdout": stdout,
                   "stderr": stderr}
        with self.lock, self.changed:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            if not self.changed.wait_for(lambda: self.forked or self.proc.poll() is not None, timeout=60):
                raise RuntimeError("warm start: the starter did not fork the command within 60 s")
            if not self.forked:
                raise RuntimeError(f"warm start: the starter exited with {self.proc.returncode}")
            return self.forked.pop(0)

    def wait(self, pid: int, timeout: float | None) -> int | None:
        """The command's exit status, or None if it still runs after `timeout` seconds."""
        with self.changed:
            self.changed.wait_for(lambda: pid in self.exited or self.proc.poll() is not None, timeout=timeout)
            if pid not in self.exited and self.proc.poll() is not None:
                raise RuntimeError(f"warm start: the starter exited with {self.proc.returncode} before pid {pid}")
            return self.exited.get(pid)

    def run(self, module: str, args: list[str], env: dict[str, str], cwd: str, timeout: float,
            script: str | None = None) -> subprocess.CompletedProcess:
        with tempfile.TemporaryDirectory(prefix="warm-start-") as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            pid = self.spawn(module, args, env, cwd, str(out), str(err), script)
            code = self.wait(pid, timeout)
            argv = [sys.executable, *([script] if script else ["-m", module]), *args]
            if code is None:
                _kill_group(pid)
                self.wait(pid, None)
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


def _starter(env: dict[str, str]) -> _Starter | None:
    """The starter for a command with `env` (started if none matches), or None where commands run cold."""
    if os.environ.get("RF_EVAL_TESTS_COLD") == "1" or not hasattr(os, "fork"):
        return None
    starter = next((s for s in _starters if s.matches(env)), None)
    if starter is None:
        starter = _Starter(env)
        _starters.append(starter)
    return starter


def run(module: str, args: list[str], *, env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None,
        timeout: float = 600, script: str | None = None) -> subprocess.CompletedProcess:
    """`python -m <module> <args>` (or `python <script> <args>`) with `env` (default: this process's) in `cwd`,
    output captured as text, as `subprocess.run(..., capture_output=True, text=True, timeout=timeout)`
    returns it."""
    env = dict(os.environ if env is None else env)
    cwd = str(cwd or os.getcwd())
    starter = _starter(env)
    if starter is not None:
        return starter.run(module, list(args), env, cwd, timeout, script)
    argv = [sys.executable, *([script] if script else ["-m", module]), *args]
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def _warm_form(argv: list[str]) -> tuple[str, list[str], str | None] | None:
    """(module, args, script) where `argv` is `python -m lm_eval|rf_eval|pytest ...`, `python SCRIPT.py ...` or
    the `lm_eval` script of this environment; None for anything else (`python -c`: a fresh interpreter is what
    those check)."""
    if argv[:2] == [sys.executable, "-m"] and argv[2] in ("lm_eval", "rf_eval", "pytest"):
        return argv[2], argv[3:], None
    if argv[0] == sys.executable and argv[1].endswith(".py"):
        return "", argv[2:], argv[1]
    if argv[0] == str(Path(sys.executable).parent / "lm_eval"):
        return "lm_eval", argv[1:], None
    return None


def run_argv(argv: list[str], *, env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None,
             timeout: float = 600) -> subprocess.CompletedProcess:
    """`argv` as `subprocess.run(argv, capture_output=True, text=True, ...)` runs it: warm (`run`) in the forms
    `_warm_form` names, a plain subprocess otherwise."""
    argv = [str(a) for a in argv]
    form = _warm_form(argv)
    if form is None:
        return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    module, args, script = form
    return run(module, args, env=env, cwd=cwd, timeout=timeout, script=script)


class WarmProcess:
    """A command a starter forked, as much of `subprocess.Popen` as the tests use: pid, returncode, poll,
    wait, send_signal, terminate, kill. Its standard streams are files."""

    def __init__(self, starter: _Starter, pid: int, args: list[str]) -> None:
        self.starter, self.pid, self.args, self.returncode = starter, pid, args, None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.starter.wait(self.pid, 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self.starter.wait(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        import signal

        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        import signal

        self.send_signal(signal.SIGKILL)


def popen_argv(argv: list[str], *, stdout: str | os.PathLike, env: dict[str, str] | None = None,
               cwd: str | os.PathLike | None = None) -> WarmProcess | subprocess.Popen:
    """`argv` started as `subprocess.Popen(argv, stdout=<file>, stderr=subprocess.STDOUT, env=env, cwd=cwd,
    start_new_session=True)` starts it, its output (both streams) written to the file `stdout`: forked by a
    starter in the forms `run_argv` runs warm, a plain subprocess otherwise."""
    argv, env = [str(a) for a in argv], dict(os.environ if env is None else env)
    cwd = str(cwd or os.getcwd())
    form = _warm_form(argv)
    starter = None if form is None else _starter(env)
    if starter is None:
        with open(stdout, "wb") as fh:
            return subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                    start_new_session=True)
    module, args, script = form
    return WarmProcess(starter, starter.spawn(module, args, env, cwd, str(stdout), None, script), argv)


@atexit.register
def _close_all() -> None:
    for starter in _starters:
        starter.close()


if __name__ == "__main__":
    status = serve()
    sys.exit(status or 0)
