"""A throwaway task data source and a throwaway report reading, each one file outside the package, found
through their path variables (RF_EVAL_DATA_SOURCE_PATH, RF_EVAL_MEASURES_PATH) with no other edit: the kinds'
contract tests pick them up and pass, `rf-eval fetch-data` downloads the source for the task that reads it,
and lm_eval's preflight names it when it is missing (issue #39 item 3). The path variables are read when the
packages are first imported, so each check runs in a fresh Python."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from warm_start import run_argv

ROOT = Path(__file__).resolve().parents[1]

THROWAWAY_SOURCE = '''
"""A throwaway data source (tests/test_throwaway_plugins.py): a glossary keytoken_nll reads."""

from pathlib import Path

from rf_eval.tasks.data_sources.base import DataSource, write_text


class Glossary(DataSource):
    name = "glossary"
    what = "a throwaway glossary"
    path = "glossary.txt"
    option = "glossary"
    host = "example.invalid"
    task_classes = ("KeyTokenTask",)

    def fetch(self, folder: Path) -> None:
        write_text(folder / self.path, "alpha: the first letter\\n")
'''

THROWAWAY_MEASURES = '''
"""A throwaway task reading (tests/test_throwaway_plugins.py): glossary_nll by its loss on glossary terms."""

from rf_eval.stats.measures.base import Measure, TaskMeasures


class GlossaryLoss(TaskMeasures):
    name = "glossary_nll"
    tasks = frozenset({"glossary_nll"})
    title = "Loss on glossary terms"
    measures = (Measure("terms", "glossary-term ΔNLL", "nll_terms", "delta"),
                Measure("all", "all-token ΔNLL (secondary)", "nll_all", "delta", secondary=True))
    description = "ΔNLL on the glossary's terms, then on every token."
'''

FETCH_THEN_PREFLIGHT = """
import os, sys
from rf_eval.cli import main
from rf_eval.tasks.data_needs import preflight
assert main(["fetch-data", "--tasks", "keytoken_nll", "--out", sys.argv[1]]) == 0
os.environ["HF_HUB_OFFLINE"] = "1"  # and no data folder: the glossary is nowhere
try:
    preflight(["keytoken_nll"], {})
except Exception as err:
    print("preflight:", type(err).__name__, err)
"""


def test_a_throwaway_data_source_and_reading_are_found_tested_and_used_with_no_other_edit(tmp_path):
    folders = {}
    for kind, source in (("source", THROWAWAY_SOURCE), ("measures", THROWAWAY_MEASURES)):
        folders[kind] = tmp_path / kind
        folders[kind].mkdir()
        (folders[kind] / f"throwaway_{kind}.py").write_text(textwrap.dedent(source).lstrip())
    env = dict(os.environ, RF_EVAL_DATA_SOURCE_PATH=str(folders["source"]),
               RF_EVAL_MEASURES_PATH=str(folders["measures"]), OMP_NUM_THREADS="1")
    env.pop("HF_HUB_OFFLINE", None)
    env.pop("RF_EVAL_DATA", None)
    done = run_argv([sys.executable, "-m", "pytest", "-v", "-n0", "-p", "no:cacheprovider", "-k", "glossary",
         "tests/tasks/test_data_source_contract.py", "tests/stats/test_measures_contract.py"], cwd=ROOT, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    ran = re.findall(r"::(\w+)\[(glossary|glossary_nll)\] PASSED", done.stdout)
    assert sorted(name for _, name in ran) == ["glossary", "glossary_nll"], done.stdout[-4000:]

    out = tmp_path / "data"
    said = subprocess.run([sys.executable, "-c", FETCH_THEN_PREFLIGHT, str(out)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert said.returncode == 0, said.stderr[-2000:]
    assert (out / "glossary.txt").read_text() == "alpha: the first letter\n"
    assert json.loads((out / "manifest.json").read_text())["sources"]["glossary"]["host"] == "example.invalid"
    assert "glossary: wrote" in said.stdout
    refused = said.stdout.split("preflight: ", 1)[1]
    assert refused.startswith("TaskDataMissing keytoken_nll needs a throwaway glossary, which is not here and "
                              "cannot be downloaded (HF_HUB_OFFLINE is set)"), said.stdout
    assert """--metadata '{"glossary": "PATH"}'""" in refused
