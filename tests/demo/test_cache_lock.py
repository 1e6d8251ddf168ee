"""A second process that asks for a demo cache entry while a first one builds it waits for the first."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from rf_eval.demo.cache_lock import building, lock_path

HOLD = """
import sys, time
from pathlib import Path
from rf_eval.demo.cache_lock import building
target = Path(sys.argv[1])
with building(target):
    print("holding", flush=True)
    time.sleep(1.5)
    (target.parent / "built").write_text("first")
"""


@pytest.mark.skipif(sys.platform == "win32", reason="flock is POSIX")
def test_a_second_builder_waits_until_the_first_has_published(tmp_path):
    target = tmp_path / "cache" / "demo-maps" / "entry"
    first = subprocess.Popen([sys.executable, "-c", HOLD, str(target)], stdout=subprocess.PIPE, text=True)
    assert first.stdout.readline().strip() == "holding"
    started = time.monotonic()
    with building(target):
        waited = time.monotonic() - started
        assert (target.parent / "built").read_text() == "first"  # the first one's work is there to reuse
    assert first.wait(timeout=30) == 0
    assert waited > 0.5
    assert lock_path(target).parent == tmp_path / "cache" / "locks"
    assert [p.name for p in target.parent.iterdir()] == ["built"]  # the entry folder holds entries only


def test_an_uncontended_lock_does_not_wait(tmp_path):
    target = tmp_path / "demo-model" / "entry"
    started = time.monotonic()
    with building(target):
        pass
    with building(target):
        pass
    assert time.monotonic() - started < 0.5
