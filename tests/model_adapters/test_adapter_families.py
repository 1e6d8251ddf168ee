"""Every registered family end to end on its tiny model: `rf-eval fit`, the ridge arm, splices and
`lm_eval --model ridgefill` (lm-eval's evaluator, in process, as its CLI calls it)."""

from __future__ import annotations

import json

import pytest
import torch
from adapter_helpers import TASK

from rf_eval.cli import main
from rf_eval.cli.check_equivalence import compare
from rf_eval.engine import plain_prefill
from rf_eval.families import family_class
from rf_eval.ridge.maps import load_maps
from rf_eval.ridgefill.method import RidgeFill
from rf_eval.testing import FAMILIES

SPLIT, TAIL, LAM = 2, 8, 0.1
WORDS = "alpha beta gamma delta river stone 1234 north seven quiet".split()


def _texts(n_docs=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [" ".join(WORDS[i] for i in torch.randint(0, len(WORDS), (30,), generator=g).tolist())
            for _ in range(n_docs)]


def _one_shot(xs, ys, lam):
    """The ridge solve on every captured row at once (what the streamed sums must equal)."""
    X, Y = torch.cat(xs).double(), torch.cat(ys).double()
    mx, my = X.mean(0), Y.mean(0)
    Xc, Yc = X - mx, Y - my
    cxx = Xc.T @ Xc
    A = Yc.T @ Xc @ torch.linalg.inv(cxx + lam * torch.trace(cxx) / X.shape[1] * torch.eye(X.shape[1]).double())
    return A, my - A @ mx


@pytest.mark.parametrize("family", FAMILIES)
def test_fit_ridge_arm_and_lm_eval_on_every_family(family, tiny_model_dir, tiny_model, adapter_task, tmp_path,
                                                    one_torch_thread):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    folder, (model, tok) = tiny_model_dir(family), tiny_model(family)
    texts = _texts()
    calibration = tmp_path / "calib.jsonl"
    calibration.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = tmp_path / "maps"
    assert main(["fit", "--model", folder, "--splits", str(SPLIT), "--calibration", str(calibration),
                 "--lambdas", str(LAM), "--out", str(out), "--device", "cpu", "--dtype", "float32",
                 "--no-progress"]) == 0
    # the streamed fit equals a one-shot solve on the same documents' layer inputs
    maps = load_maps(out, SPLIT)
    with torch.no_grad():
        states = [model(input_ids=tok(t, return_tensors="pt").input_ids, output_hidden_states=True).hidden_states
                  for t in texts]
    for layer in maps.layers:
        A, b = _one_shot([h[SPLIT][0] for h in states], [h[layer][0] for h in states], LAM)
        torch.testing.assert_close(maps.A[layer].double(), A, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(maps.b[layer].double(), b, rtol=1e-4, atol=1e-4)

    # the ridge arm: loaded with its maps, it fills; with the tail over the prompt it is the stock model, bitwise
    ids = torch.randint(0, 250, (1, 40), generator=torch.Generator().manual_seed(2))
    ref = plain_prefill(model, ids)
    ridge = RidgeFill.from_pretrained(folder, maps=out, fill="ridge", split=SPLIT, tail=TAIL, device="cpu",
                                      dtype="float32")
    identity = RidgeFill(model, tok, fill="identity", split=SPLIT, tail=TAIL).prefill(ids)
    filled = ridge.prefill(ids)
    assert (filled.logits - ref.logits).abs().max() > 1e-4 and not torch.equal(filled.logits, identity.logits)
    whole = RidgeFill(ridge.model, tok, maps=out, fill="ridge", split=SPLIT, tail=64).prefill(ids)
    assert compare(whole, ref) is None
    if not family_class(family).linear_attention:  # splicing both K and V of every filled row: the stock model
        both = RidgeFill(model, tok, maps=out, fill="ridge", split=SPLIT, tail=TAIL, splice="both").prefill(ids)
        torch.testing.assert_close(both.logits, ref.logits, rtol=1e-5, atol=1e-5)

    # lm-eval's evaluator runs the ridge arm on a local multiple-choice task
    results = simple_evaluate(
        model="ridgefill", model_args=f"pretrained={folder},fill=ridge,maps={out},split={SPLIT},tail={TAIL}",
        tasks=[TASK], task_manager=TaskManager(include_path=str(adapter_task), include_defaults=False),
        limit=3, device="cpu", batch_size=1,
    )
    assert 0.0 <= results["results"][TASK]["acc,none"] <= 1.0
