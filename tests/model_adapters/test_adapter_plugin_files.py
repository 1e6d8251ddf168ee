"""A throwaway selector and a throwaway correction, each one file outside the package, run through `lm_eval`
with no other edit (issue #39 item 3's acceptance).

Each file sits in a folder named by its kind's path variable (RF_EVAL_SELECTOR_PATH, RF_EVAL_CORRECTION_PATH);
one `lm_eval --model ridgefill` run (--limit 2, the tiny llama) names both in its model_args. The results
record each by name with its parameters; the rows the selector chose are the exact rows the late layers ran
(the correction, which sees every late layer, logs them), so the selection reached the engine and the
correction ran on every filled prefill.
"""

from __future__ import annotations

import json
import textwrap

from adapter_helpers import TASK, loglikelihoods, run_lm_eval

SELECTOR = '''
"""A throwaway selector: every `step`-th candidate prefix row; each prompt's choice appended to `log`."""

import json

from rf_eval.engine import Selection
from rf_eval.selectors.base import Selector


class EveryStepLogged(Selector):
    name = "every_step_logged"

    def __init__(self, step: int = 3, log: str = ""):
        self.step, self.log = int(step), log

    def select(self, req):
        rows = req.candidates()[:: self.step]
        with open(self.log, "a") as f:
            f.write(json.dumps({"prefix_end": int(req.prefix_end), "rows": rows.tolist()}) + "\\n")
        return Selection(rows)
'''

CORRECTION = '''
"""A throwaway correction: filled rows' values scaled by `factor`; the exact prefix rows of each late
attention layer appended to `log`."""

import json

from rf_eval.ridgefill.corrections.base import Correction


class ScaleValuesLogged(Correction):
    name = "scale_values_logged"

    def __init__(self, factor: float = 0.5, log: str = ""):
        self.factor, self.log = float(factor), log

    def kv(self, view, k, v):
        exact = [r for r in view.exact.tolist() if r < view.prefix_end]
        with open(self.log, "a") as f:
            f.write(json.dumps({"layer": view.index, "prefix_end": int(view.prefix_end), "exact": exact}) + "\\n")
        v[:, :, view.filled] = v[:, :, view.filled] * self.factor
        return k, v
'''


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_throwaway_selector_and_correction_run_through_lm_eval(tiny_model_dir, adapter_task, tmp_path,
                                                                 monkeypatch):
    for kind, source in (("selector", SELECTOR), ("correction", CORRECTION)):
        (tmp_path / kind).mkdir()
        (tmp_path / kind / f"throwaway_{kind}.py").write_text(textwrap.dedent(source).lstrip())
    monkeypatch.setenv("RF_EVAL_SELECTOR_PATH", str(tmp_path / "selector"))
    monkeypatch.setenv("RF_EVAL_CORRECTION_PATH", str(tmp_path / "correction"))
    chose, saw = tmp_path / "selector.jsonl", tmp_path / "correction.jsonl"
    args = (f"pretrained={tiny_model_dir('llama')},fill=identity,split=3,tail=2,"
            f"selector=every_step_logged(step=3;log={chose}),corrections=scale_values_logged(factor=0.5;log={saw})")
    proc = run_lm_eval(["--model", "ridgefill", "--model_args", args, "--tasks", TASK, "--include_path",
                        str(adapter_task), "--limit", "2", "--device", "cpu", "--log_samples", "--output_path",
                        str(tmp_path / "out")], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]

    recorded = json.loads(next((tmp_path / "out").rglob("results_*.json")).read_text())["config"]["rf_eval"]
    assert recorded["selector"] == {"name": "every_step_logged", "step": 3, "log": str(chose)}
    assert recorded["corrections"] == [{"name": "scale_values_logged", "factor": 0.5, "log": str(saw)}]
    assert len(loglikelihoods(tmp_path / "out")) >= 2

    selections = lines(chose)
    late = lines(saw)
    first = min(entry["layer"] for entry in late)
    prefills = [entry for entry in late if entry["layer"] == first]  # one entry per prefill, in order
    assert selections and len(prefills) == len(selections)
    for chosen, ran in zip(selections, prefills, strict=True):
        assert chosen["rows"] == list(range(0, chosen["prefix_end"], 3))  # every third candidate row
        assert ran["prefix_end"] == chosen["prefix_end"] and ran["exact"] == chosen["rows"]
    layers = {entry["layer"] for entry in late}
    assert len(late) == len(prefills) * len(layers)  # the correction ran in every late layer of every prefill
