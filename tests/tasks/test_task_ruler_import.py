"""Importing lm-eval's RULER code offline does not try the network (nltk's punkt_tab download)."""

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
nltk.download = lambda *args, **kwargs: calls.append(args) or False
sys.path.insert(0, sys.argv[2])
from tasks import ruler_data
started = time.monotonic()
niah = ruler_data.ruler_module("niah_utils")
print(json.dumps({"calls": calls, "seconds": time.monotonic() - started, "has": hasattr(niah, "get_haystack")}))
"""


@pytest.mark.parametrize("offline", ["1", "0"])
def test_offline_import_skips_the_punkt_download_online_keeps_it(tmp_path, offline):
    env = dict(os.environ, HF_HUB_OFFLINE=offline)
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), str(ROOT)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    *printed, last = done.stdout.strip().splitlines()
    result = json.loads(last)
    assert result["has"]
    if offline == "1":
        assert result["calls"] == [] and printed == []  # no download, no "Downloaded punkt_tab" line
    else:  # lm-eval's own behaviour, unchanged where the network may be there
        assert result["calls"] == [["punkt_tab"]] and "Downloaded punkt_tab on rank 0" in printed
