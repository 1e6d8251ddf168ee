"""Importing lm-eval's RULER code never downloads nltk's punkt_tab nor prints lm-eval's "Downloaded punkt_tab"
(whether or not anything was); only a task that needs the model fetches it, quietly, and says plainly when it
could not (issue #54, item 3)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, sys, time
import nltk
nltk.data.path[:] = [sys.argv[1]]  # no punkt_tab anywhere nltk looks
calls = []
nltk.download = lambda *args, **kwargs: calls.append([*args, kwargs]) or False
sys.path.insert(0, sys.argv[2])
from tasks import ruler_data
started = time.monotonic()
niah = ruler_data.ruler_module("niah_utils")
imported = list(calls)
try:
    ruler_data.check_punkt("niah_single_2")
    error = None
except ruler_data.RulerDataError as err:
    error = str(err)
print(json.dumps({"imported": imported, "checked": calls[len(imported):], "error": error,
                  "seconds": time.monotonic() - started, "has": hasattr(niah, "get_haystack")}))
"""


@pytest.mark.parametrize("offline", ["1", "0"])
def test_the_import_never_downloads_and_a_task_that_needs_punkt_says_so(tmp_path, offline):
    env = dict(os.environ, HF_HUB_OFFLINE=offline)
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), str(ROOT)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    *printed, last = done.stdout.strip().splitlines()
    result = json.loads(last)
    assert result["has"]
    assert result["imported"] == [] and printed == []  # no download, no "Downloaded punkt_tab" line
    assert "Downloaded" not in done.stderr
    assert "niah_single_2" in result["error"] and "punkt_tab" in result["error"]
    if offline == "1":
        assert result["checked"] == []
    else:  # the one download, quiet, its failure this check's own message
        assert result["checked"] == [["punkt_tab", {"quiet": True, "raise_on_error": False}]]
