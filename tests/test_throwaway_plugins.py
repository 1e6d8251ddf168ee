"""A throwaway task data source and a throwaway report reading, each one file outside the package, found
through their path variables (RF_EVAL_DATA_SOURCE_PATH, RF_EVAL_MEASURES_PATH) with no other edit: the kinds'
contract tests pick them up and pass, `rf-eval fetch-data` downloads the source for the task that reads it,
and lm_eval's preflight names it when it is missing (issue #39 item 3). The path variables are read when the
packages are first imported, so each check runs in a fresh Python (the contracts: tests/plugin_contracts.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from plugin_contracts import run_contracts

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

#: the data-source and report-measures contract tests, each called for the throwaway of its kind if its
#: registry (the list the test is parametrized over) holds it
CONTRACTS = """
import json, sys
from pathlib import Path

import pytest
from plugin_contracts import contract_module

from rf_eval.stats.measures import MEASURES
from rf_eval.tasks.data_sources import SOURCES

out = Path(sys.argv[1])
sources = contract_module("tasks/test_data_source_contract.py")
measures = contract_module("stats/test_measures_contract.py")
lmeval_format = contract_module("stats/lmeval_format.py")
kept = []
if "glossary" in SOURCES:
    (out / "source_contract").mkdir()
    with pytest.MonkeyPatch.context() as monkeypatch:
        # no_punkt and request: read for the package's own sources only (nltk data, downloads stood in)
        sources.test_every_data_source_keeps_the_contract("glossary", None, monkeypatch, out / "source_contract",
                                                          None)
    kept.append("data source glossary")
if "glossary_nll" in MEASURES:
    (out / "measures_contract").mkdir()
    measures.test_every_task_reading_keeps_the_contract("glossary_nll", lmeval_format, out / "measures_contract")
    kept.append("task reading glossary_nll")
print(json.dumps({"sources": list(SOURCES), "measures": list(MEASURES), "kept": kept}))
"""

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
    (tmp_path / "contracts").mkdir()
    found = run_contracts(CONTRACTS, env, tmp_path / "contracts")
    assert "glossary" in found["sources"] and "glossary_nll" in found["measures"]  # found on the path
    assert found["kept"] == ["data source glossary", "task reading glossary_nll"]

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
