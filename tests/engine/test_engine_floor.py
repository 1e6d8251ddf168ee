"""The engine floor: the partial path with every row exact against the stock model (paper sections 4.3, 9).

Floors on CPU, every registered family: the partial path itself (`prefill`
with every prefix row selected exact) is bitwise the stock model in fp32 and
bf16. The filled-row kernel (masked SDPA over the key rows) is within
max |Δ| 1e-5 and KL 1e-10 in fp32, max |Δ| 0.1 and KL 1e-4 in bf16.
"""

from __future__ import annotations

import json

import pytest
import torch

import rf_eval.engine.layers as engine_layers
from rf_eval.engine import (
    compare_results,
    engine_floor,
    filled_kernel_every_row_exact,
    partial_every_row_exact,
    plain_prefill,
)
from rf_eval.families import registered_families

FAMILIES = registered_families()
N, SPLIT = 40, 3
#: the filled-row kernel's floor per dtype: (max |Δ|, KL)
KERNEL_FLOOR = {torch.float32: (1e-5, 1e-10), torch.bfloat16: (0.1, 1e-4)}


def prompt(model, n: int = N) -> torch.Tensor:
    return torch.randint(0, model.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(7))


@pytest.fixture(scope="module")
def bf16_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    loaded = {}

    def get(family):
        if family not in loaded:
            loaded[family] = AutoModelForCausalLM.from_pretrained(tiny_model_dir(family), dtype=torch.bfloat16).eval()
        return loaded[family]

    return get


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", FAMILIES)
def test_partial_path_with_every_row_exact_is_the_stock_model(tiny_model, bf16_model, family, dtype):
    model = tiny_model(family)[0] if dtype == "float32" else bf16_model(family)
    ids = prompt(model)
    stock = plain_prefill(model, ids)
    for split in (1, SPLIT, 5):  # hybrids: the first late layer is Gated DeltaNet or attention
        partial = partial_every_row_exact(model, ids, split)
        assert partial.plan is not None and partial.exact_rows.numel() == N  # the partial path ran, every row exact
        floor = compare_results(stock, partial)
        assert floor.bitwise, (split, floor)
        assert floor.max_abs == 0.0 and floor.kl == 0.0 and floor.first_diff is None
    kernel = compare_results(stock, filled_kernel_every_row_exact(model, ids, SPLIT))
    max_abs, kl = KERNEL_FLOOR[model.dtype]
    assert kernel.max_abs <= max_abs and kernel.kl <= kl, kernel


def test_engine_floor_records_both_paths(tiny_model):
    model, _ = tiny_model("llama")
    floor = engine_floor(model, prompt(model), SPLIT)
    assert floor["bitwise"] is True and floor["max_abs"] == 0.0 and floor["kl"] == 0.0
    kernel = floor["filled_kernel"]
    assert set(kernel) == {"bitwise", "max_abs", "kl", "first_diff", "why"}
    assert "stock uses is_causal" in kernel["why"] and 0 < kernel["max_abs"] <= 1e-5
    json.dumps(floor)


def perturb_late_layer(monkeypatch, layer: int, eps: float = 1e-6):
    """Add `eps` to late layer `layer`'s output on the partial path (the plain forward never runs it)."""
    real = engine_layers.run_layer

    def run_layer(step, fill, index, x_exact):
        out = real(step, fill, index, x_exact)
        return out + eps if index == layer else out

    monkeypatch.setattr(engine_layers, "run_layer", run_layer)


def test_a_perturbed_late_layer_is_caught_and_named(tiny_model, monkeypatch):
    model, _ = tiny_model("qwen3")
    ids = prompt(model)
    stock = plain_prefill(model, ids)
    perturb_late_layer(monkeypatch, SPLIT)
    floor = compare_results(stock, partial_every_row_exact(model, ids, SPLIT))
    assert not floor.bitwise and floor.first_diff == f"layer {SPLIT + 1} keys" and floor.max_abs > 0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", FAMILIES)
def test_check_equivalence_runs_the_partial_path(tiny_model_dir, tmp_path, capsys, family, dtype):
    from rf_eval.cli import main

    out_json = tmp_path / "eq.json"
    assert main(["check-equivalence", "--model", tiny_model_dir(family), "--lengths", "12", "--device", "cpu",
                 "--dtype", dtype, "--split", "3", "--fills", "exact", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert f"PASS N=12 partial path, every row exact ({family} {dtype} split=3): bitwise equal" in out
    assert "NOTE N=12 filled-row kernel" in out and "FAIL" not in out
    saved = json.loads(out_json.read_text())
    checks = {r["check"]: r for r in saved["comparisons"]}
    assert saved["failures"] == 0 and checks["partial path, every row exact"]["bitwise"] is True
    kernel = checks["filled-row kernel, every row exact"]
    assert kernel["family"] == family and kernel["dtype"] == dtype and kernel["max_abs"] <= 0.1


def test_check_equivalence_fails_on_a_perturbed_late_layer(tiny_model_dir, tmp_path, capsys, monkeypatch):
    from rf_eval.cli import main

    perturb_late_layer(monkeypatch, 3)
    out_json = tmp_path / "eq.json"
    assert main(["check-equivalence", "--model", tiny_model_dir("llama"), "--lengths", "12", "--device", "cpu",
                 "--dtype", "float32", "--split", "3", "--json", str(out_json)]) == 1
    out = capsys.readouterr().out
    assert out.count("OK") == 4  # the plain dispatch never runs the late layers
    line = next(x for x in out.splitlines() if x.startswith("FAIL"))
    assert "partial path, every row exact" in line and "first differs: layer 4 keys" in line
    assert "expected bitwise" in line
    saved = json.loads(out_json.read_text())
    assert saved["failures"] == 1
    partial = next(r for r in saved["comparisons"] if r["check"] == "partial path, every row exact")
    assert partial["bitwise"] is False and partial["first_diff"] == "layer 4 keys" and partial["max_abs"] > 0


# (arguments after --model, or in place of it with {model} filled in; what the one-line refusal says)
BAD_CHECK_EQUIVALENCE = [
    (["--lengths", "12", "9000"], "--lengths 9000: each length must be in 2..8192 (the model's max_position_embeddings)"),
    (["--lengths", "1"], "--lengths 1: each length must be in 2..8192"),
    (["--split", "6"], "--split: split 6 is outside 1..5 for this 6-layer model"),
    (["--split", "0"], "argument --split: '0' must be an integer >= 1"),
    (["--fills", "exact", "swift_kv"], "--fills swift_kv: not a fill; valid fills: exact, identity, kv_ridge, nofill, ridge, swiftkv, swiftkv_released"),
    (["--maps", "./no-maps"], "--maps ./no-maps: no such file or folder"),
    (["--dtype", "fp9"], "--dtype: unknown dtype 'fp9'; valid: auto"),
    (["--device", "gpu9"], "--device: device 'gpu9' is not a device name"),
    (["--model", "./no-model"], "--model: model './no-model': no such local folder"),
]  # fmt: skip


@pytest.mark.parametrize("args, says", BAD_CHECK_EQUIVALENCE)
def test_check_equivalence_bad_inputs_fail_before_the_weights_load(tiny_model_dir, capsys, args, says):
    from rf_eval.cli import main

    argv = ["--model", tiny_model_dir("llama"), "--device", "cpu"]
    for option in ("--model", "--device"):
        if option in args:
            del argv[argv.index(option):argv.index(option) + 2]
    capsys.readouterr()  # building the tiny model writes its own progress
    assert main(["check-equivalence", *argv, *args]) == 2
    err = capsys.readouterr().err
    assert says in err and "Loading weights" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_partial_path_is_the_stock_model_under_eager_attention_too(tiny_model_dir, family):
    """The stock layer's own attention function and mask, whatever `attn_implementation` picks."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir(family), attn_implementation="eager").eval()
    ids = prompt(model)
    assert compare_results(plain_prefill(model, ids), partial_every_row_exact(model, ids, SPLIT)).bitwise


def test_filled_kernel_floor_takes_the_familys_logits_gemma3_softcap():
    """The filled-row kernel's logits go through `family.logits`: Gemma 3's final logit softcap applies, so
    the kernel's floor against the stock model stays at rounding (without the cap it is the whole cap)."""
    from rf_eval.testing import random_model, tiny_config

    cap = 0.5  # far below the random model's logit range, so a missing cap differs by far more than the floor
    model = random_model(tiny_config("gemma3", vocab_size=300, final_logit_softcapping=cap))
    ids = prompt(model)
    stock = plain_prefill(model, ids)
    assert stock.logits.abs().max() <= cap
    kernel = filled_kernel_every_row_exact(model, ids, SPLIT)
    assert kernel.logits.abs().max() <= cap
    floor = compare_results(stock, kernel)
    assert floor.max_abs <= KERNEL_FLOOR[torch.float32][0] and floor.kl <= KERNEL_FLOOR[torch.float32][1], floor


def test_hybrid_recurrent_states_are_compared(tiny_model):
    """Gated DeltaNet states (dicts per state index) are among the tensors the floor compares: a state
    perturbed after the prefill is caught and named."""
    from rf_eval.engine import named_cache_tensors

    model, _ = tiny_model("qwen3_5")
    ids = prompt(model)
    stock, partial = plain_prefill(model, ids), partial_every_row_exact(model, ids, SPLIT)
    names = [name for name, _ in named_cache_tensors(partial.cache)]
    assert any("recurrent_states" in n for n in names) and any("conv_states" in n for n in names), names
    assert compare_results(stock, partial).bitwise
    name, state = next((n, t) for n, t in named_cache_tensors(partial.cache) if "recurrent_states" in n)
    state.add_(1e-3)
    floor = compare_results(stock, partial)
    assert not floor.bitwise and floor.first_diff == name, floor
