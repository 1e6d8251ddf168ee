"""The `rarecache` lm-eval model: in process against `hf` and the backend, model_args errors, and the plain CLI."""

from __future__ import annotations

import glob
import json
import os
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from lm_eval.api.instance import Instance
from warm_start import run_argv

from rf_eval.model_adapters import prefill_lm
from rf_eval.model_adapters.config import ModelArgsError

CONTEXT = "the copper clock by the north window reads seven while the river runs past the old stone house"
CONTINUATIONS = [" and then", " seven", " again and again"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def lm(f: dict, **args) -> prefill_lm.rarecache:
    base = {"pretrained": f["target_dir"], "source": f["source_dir"], "maps": f["maps_dir"], "device": "cpu"}
    return prefill_lm.rarecache.create_from_arg_obj({**base, **args})


def req(kind: str, *args) -> Instance:
    return Instance(kind, {}, tuple(args), 0)


def test_rho_one_is_bitwise_lm_evals_hf_model(fitted):
    from lm_eval.models.huggingface import HFLM

    f = fitted("llama")
    requests = [req("loglikelihood", CONTEXT, c) for c in CONTINUATIONS]
    hf = HFLM(pretrained=f["target_dir"], device="cpu", batch_size=1)
    assert lm(f, rho=1).loglikelihood(requests) == hf.loglikelihood(requests)
    mapped = lm(f, rho=0.3).loglikelihood(requests)
    assert all(abs(a[0] - b[0]) > 1e-4 for a, b in zip(mapped, hf.loglikelihood(requests)))


def test_requests_run_over_the_rarecache_prefill(fitted):
    f = fitted("qwen3")
    model = lm(f, rho=0.3, selector="random-positions", seed=5, reference="exact")
    (logprob, _), = model.loglikelihood([req("loglikelihood", CONTEXT, " seven")])
    ctx, cont = model._encode_pair(CONTEXT, " seven")
    result = model.method.prefill(torch.tensor([ctx]))  # then the stock target over the continuation
    rows = torch.cat([result.logits, model.method.extend(result, torch.tensor([cont[:-1]]))[0]], 0)
    assert logprob == pytest.approx(F.log_softmax(rows, -1).gather(1, torch.tensor(cont)[:, None]).sum().item(),
                                    abs=1e-4)
    (out,) = model.token_logprobs([req("token_logprobs", CONTEXT, " and then")])
    assert len(out["logprobs"]) == len(out["exact_logprobs"]) == len(out["kl"])
    (text,) = model.generate_until([req("generate_until", CONTEXT, {"until": ["\n"], "max_gen_toks": 5})])
    ids = torch.tensor([model.encode_prompt(CONTEXT)])
    want = model.method.generate(ids, max_new_tokens=5, do_sample=False)[0, ids.shape[1]:].tolist()
    assert text == model._answer(want, ["\n", model.tok_decode([model.eot_token_id], False)])
    info = model.get_model_info()["rf_eval"]
    assert (info["method"], info["rho"], info["selector"], info["seed"]) == ("rarecache", 0.3, "random-positions", 5)
    assert info["oracle"] is False and lm(f, selector="oracle-l2").get_model_info()["rf_eval"]["oracle"] is True


def test_model_args_errors_name_the_problem(fitted, tmp_path):
    llama, qwen = fitted("llama"), fitted("qwen3")
    with pytest.raises(ModelArgsError, match="source"):
        prefill_lm.rarecache.create_from_arg_obj({"pretrained": llama["target_dir"], "maps": llama["maps_dir"]})
    with pytest.raises(ModelArgsError, match="rho"):
        lm(llama, rho=1.5)
    with pytest.raises(ModelArgsError, match="selector"):
        lm(llama, selector="best")
    with pytest.raises(ModelArgsError, match="selector 'attention' is a ridgefill selector.*source-attention"):
        lm(llama, selector="attention")
    with pytest.raises(ModelArgsError, match="another"):
        lm(llama, maps=qwen["maps_dir"])
    with pytest.raises(ModelArgsError, match="no RaReCache map file"):
        lm(llama, maps=str(tmp_path))


@pytest.mark.slow
def test_plain_lm_eval_runs_rarecache_on_ruler_filled(fitted, tmp_path):
    f = fitted("qwen3")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               OMP_NUM_THREADS="1")
    args = [
        "--model", "rarecache",
        "--model_args", f"pretrained={f['target_dir']},source={f['source_dir']},maps={f['maps_dir']},rho=0.3,device=cpu",
        "--tasks", "niah_single_1_filled", "--metadata", json.dumps({"max_seq_lengths": [512], "tail": 16}),
        "--limit", "1", "--gen_kwargs", "max_gen_toks=4", "--output_path", str(tmp_path), "--log_samples",
    ]
    lm_eval = str(Path(sys.executable).parent / "lm_eval")
    proc = run_argv([lm_eval, *args], cwd=tmp_path, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(Path(glob.glob(f"{tmp_path}/**/results_*.json", recursive=True)[0]).read_text())
    info = results["config"]["rf_eval"]
    assert (info["method"], info["rho"], info["selector"]) == ("rarecache", 0.3, "rank")
    assert results["results"]["niah_single_1_filled"]["n_filled,none"] == 1
