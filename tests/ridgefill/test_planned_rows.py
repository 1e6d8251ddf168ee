"""The ceilings and the study preview count the selected rows a prompt runs (#55 item 5, #54's preview case).

The row count of a selector that takes a share or count of the prompt (attention, FastKV's TSP, the counted
controls) is known from the length alone (`Selector.planned_rows`); the preview, a served answer's ceilings
and a cost taken before the prompt runs read it, so they equal what the run records.
"""

from __future__ import annotations

import pytest
import torch

from rf_eval.methods import method_class
from rf_eval.ridgefill.arm_cost import planned_rows
from rf_eval.ridgefill.arm_spec import RidgeFillArm

N = 48
ARMS = [
    ("ridgefill", {"fill": "identity", "split": 2, "tail": 4, "selector": "attention(share=0.25;layers=0)"}),
    ("ridgefill", {"fill": "nofill", "split": 2, "tail": 4, "selector": "random(share=0.3)"}),
    ("fastkv", {"selector": "tsp(keep=20)"}),
]


@pytest.mark.parametrize("method, fields", ARMS)
def test_the_cost_before_the_run_and_the_ceilings_equal_the_cost_the_run_records(method, fields, tiny_model):
    model, tok = tiny_model("llama")
    arm = method_class(method)(model, tok, **fields)
    ids = torch.randint(0, 250, (1, N), generator=torch.Generator().manual_seed(3))
    recorded = arm.prefill_cost(N, arm.prefill(ids))
    planned = arm.prefill_cost(N)
    assert recorded.exact_rows > arm.arm.tail  # the run chose rows: the invariant reads them
    assert planned == recorded
    ceilings = arm.speedup_ceilings(N)
    assert ceilings["mac_ceiling"] == pytest.approx(recorded.mac_speedup, rel=1e-12)
    assert ceilings["ceiling"] == pytest.approx(recorded.layer_pass_speedup, rel=1e-12)


def test_the_preview_counts_the_selected_rows(tiny_model_dir, tiny_model):
    from transformers import AutoConfig

    from rf_eval.study.plan import arm_preview
    from rf_eval.study.study_file import StudyArm

    path = tiny_model_dir("llama")

    class Study:
        pretrained, model_args, lengths, maps, fit = path, {}, [N], None, None

    fields = dict(ARMS[0][1])
    fraction, note = arm_preview(Study, StudyArm("rows", "ridgefill", fields))[N]
    model, tok = tiny_model("llama")
    arm = method_class("ridgefill")(model, tok, **fields)
    ids = torch.randint(0, 250, (1, N), generator=torch.Generator().manual_seed(3))
    assert fraction == pytest.approx(arm.prefill_cost(N, arm.prefill(ids)).macs_fraction, rel=1e-12)
    assert note == f"rows {round(0.25 * N)}"
    without = RidgeFillArm(fill="identity", split=2, tail=4).resolve(AutoConfig.from_pretrained(path))
    assert fraction > method_class("ridgefill").preview_costs(AutoConfig.from_pretrained(path), without, [N],
                                                              maps_split=lambda s: s)[N][0]


def test_a_selector_whose_rows_depend_on_the_text_claims_no_ceiling(tiny_model):
    model, tok = tiny_model("llama")
    arm = method_class("ridgefill")(model, tok, fill="identity", split=2, tail=4, selector="special")
    assert planned_rows(arm.arm, N) is None and arm.speedup_ceilings(N) == {}
