"""The tests' warm starter (tests/warm_start.py): a command forked from it behaves as the same command started
cold, run to the end (`run_argv`) or started beside the test (`popen_argv`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import warm_start
from warm_start import WarmProcess, popen_argv, run_argv

#: prints what a command sees of its start: argv, folder, a variable, and nltk's data path as the command's own
#: import of nltk builds it (whether the starter had imported nltk before is printed first)
SCRIPT = """\
import json, os, sys
preloaded = "nltk.data" in sys.modules
import nltk
print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "var": os.environ.get("WARM_TEST_VAR"),
                  "nltk_path": nltk.data.path, "preloaded": preloaded}))
print("to stderr", file=sys.stderr)
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "probe.py"
    path.write_text(SCRIPT)
    return path


def _seen(done: subprocess.CompletedProcess) -> dict:
    return json.loads(done.stdout)


@pytest.mark.parametrize("nltk_data", [None, "one", "one:two"])
def test_a_warm_command_sees_what_a_cold_one_sees_nltk_data_included(script, tmp_path, nltk_data):
    env = {**os.environ, "WARM_TEST_VAR": "x"}
    env.pop("NLTK_DATA", None)
    if nltk_data:
        env["NLTK_DATA"] = os.pathsep.join(str(tmp_path / part) for part in nltk_data.split(":"))
    starters = len(warm_start._starters)
    argv = [sys.executable, str(script), "3", "a b"]
    warm = run_argv(argv, env=env, cwd=tmp_path)
    cold = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert warm.returncode == cold.returncode == 3
    assert warm.stderr == cold.stderr == "to stderr\n"
    seen_warm, seen_cold = _seen(warm), _seen(cold)
    assert seen_warm.pop("preloaded") and not seen_cold.pop("preloaded")  # the re-applied path is exercised
    assert seen_warm == seen_cold and seen_warm["argv"] == ["3", "a b"] and seen_warm["var"] == "x"
    # one starter serves every NLTK_DATA: at most the first case of the table starts one
    assert len(warm_start._starters) <= starters + (nltk_data is None)


def test_popen_runs_commands_side_by_side_and_reports_each_exit(script, tmp_path):
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text("import sys, time\nprint('up', flush=True)\nprint('err', file=sys.stderr, flush=True)\n"
                       "time.sleep(600)\n")
    long = popen_argv([sys.executable, str(sleeper)], stdout=tmp_path / "long.log", cwd=tmp_path)
    assert isinstance(long, WarmProcess)
    short = popen_argv([sys.executable, str(script), "5"], stdout=tmp_path / "short.log", cwd=tmp_path)
    assert short.wait(timeout=120) == 5  # while the other one still runs
    assert long.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        long.wait(timeout=0.2)
    deadline = time.monotonic() + 60
    while "err" not in (tmp_path / "long.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (tmp_path / "long.log").read_text().split() == ["up", "err"]  # both streams in the one file
    long.terminate()
    assert long.wait(timeout=60) == -signal.SIGTERM and long.poll() == -signal.SIGTERM
    assert "to stderr" in (tmp_path / "short.log").read_text()


def test_a_timeout_kills_the_command_and_what_it_started(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    parent = tmp_path / "parent.py"
    parent.write_text("import subprocess, sys, time\n"
                      "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
                      f"open({str(pid_file)!r}, 'w').write(str(child.pid))\ntime.sleep(600)\n")
    with pytest.raises(subprocess.TimeoutExpired):
        run_argv([sys.executable, str(parent)], cwd=tmp_path, timeout=3)
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    raise AssertionError(f"pid {grandchild}, started by the timed-out command, still runs")
